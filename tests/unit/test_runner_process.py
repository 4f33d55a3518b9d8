"""The rank supervisor in one process: prefixes, output files, failure reports."""
import io
import signal
import sys

import pytest

from horovod.runner import process
from horovod.runner.process import JobFailedError, WorkerExit, WorkerSpec, run_workers


def spec(rank, code, env=None):
    return WorkerSpec(rank, "localhost", [sys.executable, "-c", code], dict(env or {}), f"rank{rank}",
                      command_text=f"python rank{rank}")


def test_pad_rank():
    assert process.pad_rank(3, 4) == "3"
    assert process.pad_rank(3, 11) == "03"
    assert process.pad_rank(7, 1000) == "007"
    assert process.pad_rank(0, 1) == "0"


def test_describe_returncode():
    assert process.describe_returncode(3) == "exit code 3"
    assert process.describe_returncode(-signal.SIGKILL) == "killed by SIGKILL"


def test_exit_codes_of_job_failed_error():
    assert JobFailedError(WorkerExit(0, "h", 3, "c", [])).exit_code == 3
    assert JobFailedError(WorkerExit(0, "h", -9, "c", [])).exit_code == 137


def test_failure_report():
    text = process.format_failure(WorkerExit(2, "hostA", -9, "python t.py", ["[2]<stdout>:a", "[2]<stderr>:b"]))
    assert text.startswith(process.FAILURE_HEADLINE)
    assert "Process name: 2" in text and "Host: hostA" in text and "Exit code: -9 (killed by SIGKILL)" in text
    assert "Command: python t.py" in text and "    [2]<stderr>:b" in text and "out-of-memory" in text


def test_prefixes_and_files(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    specs = [spec(r, f"import sys; print('out{r}'); print('err{r}', file=sys.stderr); "
                     "sys.stdout.write('no newline')") for r in range(2)]
    run_workers(specs, output_dir=str(tmp_path), stdout=out, stderr=err)
    assert sorted(out.getvalue().splitlines()) == [
        "[0]<stdout>:no newline", "[0]<stdout>:out0", "[1]<stdout>:no newline", "[1]<stdout>:out1"]
    assert sorted(err.getvalue().splitlines()) == ["[0]<stderr>:err0", "[1]<stderr>:err1"]
    assert (tmp_path / "rank.1" / "stdout").read_text() == "out1\nno newline"
    assert (tmp_path / "rank.0" / "stderr").read_text() == "err0\n"


def test_timestamp_prefix():
    out = io.StringIO()
    run_workers([spec(0, "print('x')")], prefix_timestamp=True, stdout=out, stderr=io.StringIO())
    line = out.getvalue().strip()
    assert line.endswith("[0]<stdout>:x") and len(line) > len("[0]<stdout>:x") + 10


def test_first_failure_is_reported_and_others_stopped():
    specs = [spec(0, "import time; time.sleep(60)"),
             spec(1, "import sys; print('bye'); sys.exit(4)"),
             spec(2, "import time; time.sleep(60)")]
    with pytest.raises(JobFailedError) as exc:
        run_workers(specs, grace=2.0, stdout=io.StringIO(), stderr=io.StringIO())
    failure = exc.value.failure
    assert (failure.rank, failure.returncode, failure.hostname) == (1, 4, "localhost")
    assert failure.last_lines == ["[1]<stdout>:bye"]
    assert exc.value.exit_code == 4


def test_missing_program_is_a_start_error():
    bad = WorkerSpec(0, "localhost", ["/no/such/program"], {}, "/no/such/program")
    with pytest.raises(process.WorkerStartError, match="Could not start rank 0 on localhost"):
        run_workers([bad], stdout=io.StringIO(), stderr=io.StringIO())


def test_split_lines_ends_lines_at_carriage_returns_too():
    import os

    from horovod.runner.process import split_lines

    r, w = os.pipe()
    os.write(w, b"a\nb\r\nprog 1\rprog 2\rtail\r")
    os.write(w, b"\nlast")          # the \r\n straddles two reads: still one line
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        assert list(split_lines(pipe)) == [b"a\n", b"b\r\n", b"prog 1\r", b"prog 2\r", b"tail\r\n", b"last"]
