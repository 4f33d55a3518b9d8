"""Deadlock detection end to end through the launcher: ranks that wait on different collectives are reported on
every rank, naming what each waits on, and the job ends (or, with the shutdown disabled, only reported); programs
that merely keep some ranks waiting are not reported. Workers: ``workers/deadlock.py``, ``workers/deadlock_free.py``.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.support.launch import ROOT, horovodrun, rank_lines
from tests.support.timing import SLACK_S

pytestmark = pytest.mark.timeout(240)
WORKERS = ROOT / "tests" / "integration" / "workers"
TIMEOUT = 120
DEFAULT_CHECK, DEFAULT_SHUTDOWN = 5.0, 5.0      # the knobs' defaults


def worker(name, *args):
    return [sys.executable, str(WORKERS / name), *[str(a) for a in args]]


def expected_lines(np_, kind):
    """What the report says each rank waits on."""
    others = list(range(1, np_))
    label = "rank" if len(others) == 1 else "ranks"
    first = f"Rank 0 waits on barrier.noname (BARRIER; not submitted by {label} {', '.join(map(str, others))})."
    return [first] + [f"Rank {r} waits on deadlock.grad ({kind.upper()}; not submitted by rank 0)." for r in others]


def reports(output, rank):
    """The deadlock reports ``rank`` logged: each as its lines, from the headline to the closing line."""
    lines, found = rank_lines(output, rank), []
    for i, line in enumerate(lines):
        if "[horovod ERROR" in line and "] Deadlock: every rank is blocked" in line:
            found.append(lines[i:i + 8])
    return found


@pytest.mark.parametrize("np_,kind,how,check,shutdown", [
    pytest.param(2, "reducescatter", "block", None, None, marks=pytest.mark.slow),     # the defaults (5 s + 5 s)
    (3, "allreduce", "block", 2.0, 1.0),
    (4, "reducescatter", "block", 2.0, 1.0),
    (3, "reducescatter", "poll", 2.0, 1.0),        # every rank polls with 10 ms timed waits from another thread
])
def test_ranks_waiting_on_different_collectives_end_the_job_with_the_report_on_every_rank(np_, kind, how, check,
                                                                                          shutdown):
    env = {}
    if check is not None:
        env = {"HOROVOD_DEADLOCK_CHECK_TIME_SECONDS": str(check), "HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS": str(shutdown)}
    check, shutdown = check or DEFAULT_CHECK, shutdown or DEFAULT_SHUTDOWN
    start = time.monotonic()
    result = horovodrun(np_, worker("deadlock.py", kind, how), timeout=TIMEOUT, env=env)
    out = result.stdout
    assert result.returncode != 0, out[-5000:]
    assert "Process name:" in out, out[-3000:]                  # the launcher names the rank that failed first
    assert time.monotonic() - start < check + shutdown + 60, "the job took too long to end"
    expected = expected_lines(np_, kind)
    for r in range(np_):
        logged = reports(out, r)
        assert logged, f"rank {r} logged no deadlock report:\n{out[-6000:]}"
        assert all(line in logged[0] for line in expected), (expected, logged[0])
        assert f"The job ends in {shutdown:g} s" in logged[0][np_ + 2], logged[0]
        res = [line for line in rank_lines(out, r) if line.startswith("RESULT")]
        assert res, f"rank {r} reported nothing:\n{out[-6000:]}"
        assert res[0].startswith("RESULT HorovodInternalError "), res
        elapsed = float(res[0].split()[2])
        assert check + shutdown <= elapsed + 0.1 < check + shutdown + SLACK_S, res
        message = res[0].split(" ", 3)[3].split(" | ")
        assert message[0].startswith("Deadlock: every rank is blocked"), message
        assert message[1:np_ + 1] == expected, message
        assert message[-1].startswith(f"Ended the job: the deadlock lasted HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS="
                                      f"{shutdown:g} s"), message


# ---------------------------------------------------------------------------------------------- report only
def run_until(np_, command, env, done, limit):
    """Start a job, read its output until ``done(output)`` holds or ``limit`` seconds pass, then end the job
    (SIGTERM to the launcher, which stops every rank). Returns (output, whether done held, seconds taken)."""
    full_env = dict(os.environ)
    full_env.update(env)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), full_env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner", "-np", str(np_), *command], env=full_env,
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, stdin=subprocess.DEVNULL)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(proc.stdout), daemon=True)
    reader.start()
    start = time.monotonic()
    held = False
    try:
        while time.monotonic() - start < limit and proc.poll() is None:
            if done("".join(chunks)):
                held = True
                break
            time.sleep(0.1)
        taken = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        reader.join(30)
    return "".join(chunks), held, taken


@pytest.mark.parametrize("np_", [2, 3])
def test_with_the_shutdown_disabled_the_deadlock_is_only_reported(np_):
    check, shutdown = 1.0, 1.0
    env = {"HOROVOD_DEADLOCK_CHECK_TIME_SECONDS": str(check), "HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS": str(shutdown),
           "HOROVOD_DEADLOCK_SHUTDOWN_DISABLE": "1"}
    reported_at = {}

    def every_rank_reported_then_waited(output):
        if all(reports(output, r) for r in range(np_)):
            reported_at.setdefault("t", time.monotonic())
        return "t" in reported_at and time.monotonic() - reported_at["t"] > shutdown + 2.0

    out, held, _ = run_until(np_, worker("deadlock.py", "reducescatter"), env, every_rank_reported_then_waited,
                             limit=TIMEOUT)
    assert held, f"not every rank reported the deadlock:\n{out[-6000:]}"
    expected = expected_lines(np_, "reducescatter")
    for r in range(np_):
        logged = reports(out, r)
        assert len(logged) == 1, logged                                   # reported once
        assert all(line in logged[0] for line in expected), (expected, logged[0])
        assert any("HOROVOD_DEADLOCK_SHUTDOWN_DISABLE is set" in line for line in logged[0]), logged[0]
        # Well past the shutdown time, every rank is still blocked in its collective: the test ended the job.
        assert "BLOCKED" in rank_lines(out, r), out[-3000:]
        assert not [line for line in rank_lines(out, r) if line.startswith("RESULT")], out[-3000:]


def test_stall_check_disable_turns_deadlock_detection_off():
    env = {"HOROVOD_DEADLOCK_CHECK_TIME_SECONDS": "0.5", "HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS": "0.5",
           "HOROVOD_STALL_CHECK_DISABLE": "1"}
    blocked_at = {}

    def blocked_for_a_while(output):
        if all("BLOCKED" in rank_lines(output, r) for r in range(2)):
            blocked_at.setdefault("t", time.monotonic())
        return "t" in blocked_at and time.monotonic() - blocked_at["t"] > 4.0

    out, held, _ = run_until(2, worker("deadlock.py", "allreduce"), env, blocked_for_a_while, limit=TIMEOUT)
    assert held, out[-3000:]
    assert "Deadlock" not in out, out[-3000:]
    assert not re.search(r"^\[\d\]<stdout>:RESULT", out, re.M), out[-3000:]


# ---------------------------------------------------------------------------------------------- no false alarms
@pytest.mark.parametrize("np_", [3])
def test_late_ranks_joins_groups_threads_and_the_torch_optimizer_are_not_deadlocks(np_):
    pytest.importorskip("torch")
    check = 1.0
    env = {"HOROVOD_DEADLOCK_CHECK_TIME_SECONDS": str(check), "HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS": "0.5"}
    # States held 2 s (twice the window), and threads that cross for 0.1 s.
    result = horovodrun(np_, worker("deadlock_free.py", 2 * check, 0.1), timeout=TIMEOUT, env=env)
    out = result.stdout
    assert "Deadlock" not in out, out[-6000:]
    assert result.returncode == 0, out[-6000:]
    scenarios = ["late_rank_with_the_response_cache", "late_rank_in_a_group", "joined_rank",
                 "two_threads_in_opposite_orders", "torch_distributed_optimizer"]
    for r in range(np_):
        passed = [line.split()[1] for line in rank_lines(out, r) if line.startswith("PASSED")]
        assert passed == scenarios, (r, passed)


@pytest.mark.parametrize("np_", [3])
def test_a_tf1_graph_whose_branch_is_slow_is_reported_but_not_ended(np_):
    """TensorFlow runs a session's independent collectives on several threads: a rank may wait on one collective
    while another thread still computes the input of the one the other ranks wait on. The crossed state lasts
    past the window and the grace period: it is reported, and the job finishes."""
    pytest.importorskip("tensorflow")
    check = 1.0
    env = {"HOROVOD_DEADLOCK_CHECK_TIME_SECONDS": str(check), "HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS": "0.5",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = horovodrun(np_, worker("deadlock_tf1_graph.py", 4 * check), timeout=TIMEOUT, env=env)
    out = result.stdout
    assert result.returncode == 0, out[-6000:]
    for r in range(np_):
        assert any(line.startswith("PASSED") for line in rank_lines(out, r)), out[-6000:]
    found = reports(out, 0)
    assert found, out[-6000:]
    assert "Rank 0 waits on allreduce.tf1.b (ALLREDUCE; not submitted by" in "\n".join(found[0])
    assert any("submit collectives from several threads" in line and "the job is not ended" in line
               for line in found[0]), found[0]

