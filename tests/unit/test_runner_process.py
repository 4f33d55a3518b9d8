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


LONG_ERROR = """
import sys
class PeerError(Exception):
    pass
try:
    raise KeyError("inner")
except KeyError as exc:
    raise PeerError("rank 1 stopped sending\\nits state: stopped\\n" + "\\n".join(f"stack {i}" for i in range(30))) from exc
"""


def test_a_long_exception_s_first_lines_are_in_the_report_when_its_last_lines_miss_them():
    """A rank's exception message longer than the last lines (a stall report with a peer's stack): the report
    still shows what went wrong, the exception's first lines, above the last lines."""
    with pytest.raises(JobFailedError) as exc:
        run_workers([spec(0, LONG_ERROR)], stdout=io.StringIO(), stderr=io.StringIO())
    failure = exc.value.failure
    assert failure.exception == ["[0]<stderr>:PeerError: rank 1 stopped sending",
                                 "[0]<stderr>:its state: stopped", "[0]<stderr>:stack 0", "[0]<stderr>:stack 1"]
    assert failure.last_lines[-1] == "[0]<stderr>:stack 29"
    text = str(exc.value)
    assert ("The exception rank 0 raised (its first lines):\n    [0]<stderr>:PeerError: rank 1 stopped "
            "sending\n    [0]<stderr>:its state: stopped\n") in text, text
    assert text.index("its first lines") < text.index("Last 10 output lines of rank 0"), text


def test_a_short_exception_is_shown_once_in_the_last_lines():
    with pytest.raises(JobFailedError) as exc:
        run_workers([spec(0, "print('before'); raise ValueError('bad value')")], stdout=io.StringIO(),
                    stderr=io.StringIO())
    assert exc.value.failure.exception == []
    assert "[0]<stderr>:ValueError: bad value" in exc.value.failure.last_lines
    assert "its first lines" not in str(exc.value)


def test_the_tail_keeps_the_last_exception_of_a_chain_and_ignores_other_threads_lines():
    from horovod.runner.output_tail import OutputTail

    tail = OutputTail()
    for line in ["Traceback (most recent call last):", '  File "a.py", line 1', "    f()", "KeyError: 'x'", "",
                 "The above exception was the direct cause of the following exception:", "",
                 "Traceback (most recent call last):", '  File "a.py", line 3', "[12:00] [horovod WARNING] a log line",
                 "    g()", "    ^^^", "horovod.common.exceptions.HorovodInternalError: stalled", "peer state",
                 "", "after"]:
        tail.add(line, "[3]:" + line)
    assert tail.exception == ["[3]:horovod.common.exceptions.HorovodInternalError: stalled", "[3]:peer state"]
    assert tail.unseen_exception() == []          # both are still among the last lines
    for i in range(10):
        tail.add(f"more {i}", f"[3]:more {i}")
    assert tail.unseen_exception() == tail.exception and list(tail.lines)[-1] == "[3]:more 9"
    mixed = OutputTail()          # a line of the other stream, printed meanwhile, is not part of the message
    for stream, line in [("stderr", "Traceback (most recent call last):"), ("stderr", '  File "a.py", line 1'),
                         ("stderr", "ValueError: first"), ("stdout", "RESULT printed"), ("stderr", "second")]:
        mixed.add(line, line, stream)
    assert mixed.exception == ["ValueError: first", "second"]
    bare = OutputTail()
    for line in ["Traceback (most recent call last):", '  File "a.py", line 1', "KeyboardInterrupt"]:
        bare.add(line, line)
    assert bare.exception == ["KeyboardInterrupt"]


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
