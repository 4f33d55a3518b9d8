"""``horovodrun --job riseml.yml`` end to end: the lines run in order on every process with a barrier after each,
a line may be a real Horovod program, a failing line stops the job naming the rank, host and line, and the
workers map onto real hosts over ssh (the network-namespace hosts of tests/support/hosts.py)."""
import json
import shlex
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.hosts import hosts_or_skip
from tests.support.launch import horovodrun, rank_lines

pytestmark = pytest.mark.timeout(120)

# Line 1: record when this process started and ended the line; rank 0 is slow, so a process that started
# line 2 without waiting for every process to finish line 1 would show up in the timestamps.
STAMP = """
import json, os, socket, sys, time
rank = int(os.environ["HOROVOD_RANK"])
start = time.time()
time.sleep(1.5 if rank == 0 else 0.0)
with open(os.path.join(sys.argv[1], f"line1.{rank}.json"), "w") as f:
    json.dump({"start": start, "end": time.time(), "host": socket.gethostname()}, f)
"""

# Line 2: a Horovod program (hvd.init() through the line's rendezvous, one allreduce).
ALLREDUCE = """
import json, os, socket, sys, time
start = time.time()
import numpy as np
import horovod.numpy as hvd
hvd.init()
total = hvd.allreduce(np.array([float(hvd.rank() + 1)]), op=hvd.Sum)
with open(os.path.join(sys.argv[1], f"line2.{hvd.rank()}.json"), "w") as f:
    json.dump({"start": start, "size": hvd.size(), "sum": float(total[0]), "host": socket.gethostname()}, f)
print("allreduce done", flush=True)
hvd.shutdown()
"""


def _job(tmp_path: Path, workers: str, lines) -> Path:
    path = tmp_path / "riseml.yml"
    run = "\n".join(f"    - {json.dumps(line)}" for line in lines)
    path.write_text(f"project: test\ntrain:\n  framework: pytorch\n  pytorch:\n    horovod:\n"
                    f"      workers: {workers}\n  resources:\n    cpus: 1\n  run:\n{run}\n")
    return path


def _script(tmp_path: Path, name: str, source: str, out: Path) -> str:
    script = tmp_path / name
    script.write_text(source)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(str(out))}"


def _stamps_and_results(out: Path, size: int):
    line1 = [json.loads((out / f"line1.{rank}.json").read_text()) for rank in range(size)]
    line2 = [json.loads((out / f"line2.{rank}.json").read_text()) for rank in range(size)]
    assert all(r["size"] == size and r["sum"] == size * (size + 1) / 2 for r in line2), line2
    assert min(r["start"] for r in line2) >= max(r["end"] for r in line1), (line1, line2)
    return line1, line2


def test_two_local_workers_run_both_lines_in_order_with_a_barrier(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = _job(tmp_path, "2", [_script(tmp_path, "stamp.py", STAMP, out),
                               _script(tmp_path, "allreduce.py", ALLREDUCE, out)])
    proc = horovodrun(2, [], extra_args=["--job", str(job)], timeout=90)
    assert proc.returncode == 0, proc.stdout[-4000:]
    _stamps_and_results(out, 2)
    assert all("allreduce done" in rank_lines(proc.stdout, rank) for rank in range(2)), proc.stdout[-4000:]


def test_a_failing_line_stops_the_job_naming_the_process_and_the_line(tmp_path):
    marker = f"hvd-job-test-{time.time_ns()}"
    sleeper = f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(60)' {marker}"
    failing = f'if [ "$HOROVOD_RANK" = 1 ]; then echo giving up; exit 3; fi; {sleeper}'
    never = f"touch {shlex.quote(str(tmp_path / 'line3-ran'))}"
    job = _job(tmp_path, "{count: 1, processes: 2}", ["true", failing, never])
    start = time.monotonic()
    proc = horovodrun(2, [], extra_args=["--job", str(job)], timeout=60)
    assert proc.returncode == 3, proc.stdout[-4000:]
    assert time.monotonic() - start < 30, "rank 0's sleep must be stopped, not waited for"
    assert (f"Line 2 of {job}'s run list ({failing!r}, file line 11) failed on rank 1 (host localhost, exit code "
            "3); the other processes were stopped; the 1 line(s) after it did not run.") in proc.stdout
    assert "[1]<stdout>:giving up" in proc.stdout
    assert not (tmp_path / "line3-ran").exists()
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or ())]
    assert leftovers == []


def test_unknown_key_is_reported_with_its_line_before_anything_runs(tmp_path):
    job = tmp_path / "riseml.yml"
    ran = tmp_path / "ran"
    job.write_text(f"train:\n  pytorch:\n    horovod:\n      wrokers: 2\n  run:\n    - touch {ran}\n")
    proc = horovodrun(2, [], extra_args=["--job", str(job)], timeout=30)
    assert proc.returncode == 1
    assert (f"{job}, line 4: unknown key 'wrokers' in horovod; allowed keys: workers") in proc.stdout
    assert not ran.exists()


@pytest.mark.timeout(180)
def test_two_workers_on_two_hosts_over_ssh(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = _job(tmp_path, "2", [_script(tmp_path, "stamp.py", STAMP, out),
                               _script(tmp_path, "allreduce.py", ALLREDUCE, out)])
    with hosts_or_skip(2) as cluster:
        with cluster.dump_stacks_after(110):
            proc = horovodrun(2, [], hosts=",".join(h.address for h in cluster.hosts),
                              extra_args=cluster.launcher_args() + ["--job", str(job)],
                              env=cluster.launcher_env(), timeout=120)
        assert proc.returncode == 0, proc.stdout[-4000:]
        line1, line2 = _stamps_and_results(out, 2)
        names = [h.name for h in cluster.hosts]
        assert [r["host"] for r in line1] == names == [r["host"] for r in line2]   # worker i on host i
        assert cluster.python_pids() == []
