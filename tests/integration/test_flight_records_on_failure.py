"""The flight recorder end to end through the launcher: a stalled rank and a killed rank are named by the records
the surviving ranks wrote (and by ``python -m horovod.timeline flight``), the launcher chooses the folder and names
it in its failure message, and SIGUSR1 to a running rank writes its record while faulthandler still dumps its
stacks."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.support.launch import ROOT, _job_env, horovodrun, rank_lines

pytestmark = pytest.mark.timeout(180)
WORKER = str(ROOT / "tests" / "integration" / "workers" / "flight.py")
TIMEOUT = 90
NOTE = re.compile(r"Flight records of ranks ([\d, ]+): (\S+) \(compare them with: python -m horovod.timeline "
                  r"flight (\S+)\)")


def flight(folder):
    result = subprocess.run([sys.executable, "-m", "horovod.timeline", "flight", str(folder)], capture_output=True,
                            text=True, timeout=60, env=_job_env(None))
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("np_", [2, 3])
def test_a_stalled_rank_is_named_by_every_ranks_record(tmp_path, np_):
    folder = tmp_path / "records"
    result = horovodrun(np_, [sys.executable, WORKER, "stall", "1"], timeout=TIMEOUT,
                        env={"HOROVOD_FLIGHT_RECORDER_DIR": str(folder), "HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                             "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    out = result.stdout
    assert result.returncode != 0, out[-3000:]
    note = NOTE.search(out)
    assert note and note.group(2) == str(folder) == note.group(3), out[-3000:]
    # Every rank wrote, the stalled one too (its engine aborts while it sleeps).
    assert sorted(os.listdir(folder)) == [f"rank.{r}.json" for r in range(np_)]
    assert note.group(1) == ", ".join(map(str, range(np_)))
    for r in range(np_):
        record = json.loads((folder / f"rank.{r}.json").read_text())
        assert record["reason"] == "abort" and "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in record["detail"]
    report = flight(folder)
    others = ", ".join(str(r) for r in range(np_) if r != 1)
    assert "first divergence at #7: ALLREDUCE allreduce.step.late (float64 [3], 24 B, AVERAGE)" in report, report
    assert f"    submitted:  {others}\n" in report and f"    failed:     {others}\n" in report, report
    assert "    never came: 1\n" in report, report
    assert "last completed: " + ", ".join(f"rank {r}: #6" for r in range(np_)) in report, report


def test_a_killed_rank_is_named_and_the_launcher_chooses_the_folder(tmp_path):
    env = _job_env(None)
    env.pop("HOROVOD_FLIGHT_RECORDER_DIR", None)         # the launcher chooses one under its working directory
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.run([sys.executable, "-m", "horovod.runner", "-np", "3", sys.executable, WORKER, "kill", "2",
                           str(marks)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env,
                          timeout=TIMEOUT)
    out = proc.stdout
    assert proc.returncode == 128 + signal.SIGKILL and "killed by SIGKILL" in out, out[-3000:]
    note = NOTE.search(out)
    assert note, out[-3000:]
    folder = note.group(2)
    assert re.fullmatch(re.escape(str(tmp_path / "horovod-flight")) + r"/\d{8}-\d{6}-[0-9a-f]{4}", folder), folder
    # The survivors wrote before the launcher stopped them (it waits for them a moment).
    assert note.group(1) == "0, 1" and sorted(os.listdir(folder)) == ["rank.0.json", "rank.1.json"]
    report = flight(folder)
    assert "first divergence at #7: ALLREDUCE allreduce.step.late" in report, report
    assert "    submitted:  0, 1\n" in report and "    never came: 2 (wrote no record)\n" in report, report


def test_sigusr1_writes_the_record_and_faulthandler_still_dumps_the_stacks(tmp_path):
    folder, stop = tmp_path / "records", tmp_path / "stop"
    env = _job_env({"HOROVOD_FLIGHT_RECORDER_DIR": str(folder)})
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner", "-np", "2", sys.executable, WORKER, "wait",
                             str(stop)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=env, start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and len([x for x in list(lines) if "]<stdout>:READY " in x]) < 2:
            time.sleep(0.05)
        ready = {int(m.group(1)): int(m.group(2)) for m in
                 (re.match(r"\[(\d+)\]<stdout>:READY (\d+)", x) for x in list(lines)) if m}
        assert set(ready) == {0, 1}, "".join(lines)[-3000:]
        os.kill(ready[1], signal.SIGUSR1)
        path = folder / "rank.1.json"
        while time.monotonic() < deadline and not path.exists():
            time.sleep(0.05)
        assert path.exists(), "".join(lines)[-3000:]
        stop.write_text("")
        proc.wait(timeout=TIMEOUT)
        reader.join(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(lines)
    assert proc.returncode == 0, out[-3000:]
    record = json.loads(path.read_text())
    assert record["reason"] == "SIGUSR1" and record["rank"] == 1
    assert [x["name"] for x in record["process_sets"][0]["entries"]][-1] == "allgather.gathered"
    assert os.listdir(folder) == ["rank.1.json"]            # only the signalled rank wrote
    stack = "\n".join(rank_lines(out, 1))
    # Every thread's stack: the main thread's, idling, and the engine thread's.
    assert "Current thread" in stack and "idle_until" in stack and "worker_loop" in stack, stack[-3000:]
    assert "Flight record of rank 1 (SIGUSR1) written to" in stack, stack[-3000:]
