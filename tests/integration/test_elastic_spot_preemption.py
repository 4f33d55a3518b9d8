"""Spot preemption end to end: SIGTERM, sent from outside to one worker of a running elastic job (as a cloud sends it
to a spot instance it reclaims), makes that worker leave at its next commit with status 0; the others re-form
without it at that commit, no failure is counted and no host is blacklisted, and the job ends with status 0.

The worker is ``workers/elastic_train.py`` (its docstring lists the lines read here); the test finds the worker to
preempt among the machine's processes by its environment (its slot and this test's progress file).
"""
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.support.elastic import (
    WORKER,
    assert_each_sample_once_per_epoch,
    assert_same_model_after_every_reset,
    discovery_script,
    events,
    read_progress,
    wait_for,
)
from tests.support.hosts import hosts_or_skip
from tests.support.launch import _job_env, horovodrun
from tests.support.timing import SLACK_S

PREEMPTED = "rank {rank} on host {host} was preempted (SIGTERM) and left the job; continuing with {n}"


def _local_worker(slot: str, progress: Path) -> psutil.Process:
    """The running worker process of ``slot`` (``host:index``) in the job that writes ``progress``."""
    for proc in psutil.process_iter(["name"]):
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("PROGRESS_FILE") == str(progress) and env.get("HOROVOD_ELASTIC_WORKER_ID", "").startswith(
                f"{slot}#"):
            return proc
    raise AssertionError(f"no running worker for slot {slot}")


def _preempt_at(step: int, progress: Path, find, seen: dict) -> threading.Thread:
    """A thread that sends SIGTERM to the worker ``find()`` returns once rank 0 reported ``step``."""

    def act() -> None:
        wait_for(f"step {step}", lambda: read_progress(progress)[0] >= step)
        victim = find()
        seen["pid"] = victim.pid
        victim.send_signal(signal.SIGTERM)
        seen["step"] = read_progress(progress)[0]

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow      # the quick tier keeps SIGTERM to horovodrun
def test_a_preempted_rank_0_leaves_and_the_others_go_on_without_a_failure(tmp_path):
    # localhost:0 is rank 0; after it leaves, localhost:1 becomes rank 0 (local rank 0 of 1) and 127.0.0.1 rank 1.
    progress = tmp_path / "progress"
    seen = {}
    thread = _preempt_at(5, progress, lambda: _local_worker("localhost:0", progress), seen)
    env = {"EPOCHS": "2", "PROGRESS_FILE": str(progress)}
    result = horovodrun(3, [sys.executable, WORKER], extra_args=["--min-np", "2", "-H", "localhost:2,127.0.0.1:1"],
                        env=env, timeout=150)
    thread.join(timeout=5)
    out = result.stdout
    assert result.returncode == 0, out[-6000:]
    assert "pid" in seen, out[-6000:]
    assert PREEMPTED.format(rank=0, host="localhost", n=2) + " workers" in out, out[-6000:]
    assert "received SIGTERM (preemption)" in out and "leaves the elastic job" in out, out[-6000:]
    assert "blacklist" not in out and "failed" not in out, out[-6000:]
    sizes = [start["size"] for start in events(out, "START")]
    assert sizes[:3] == ["3", "3", "3"] and sizes[3:] == ["2", "2"], out[-6000:]
    dones = events(out, "DONE")   # output lines carry the rank a worker started with: the survivors were 1 and 2
    assert sorted(d["rank"] for d in dones) == [1, 2] and {d["size"] for d in dones} == {"2"}, out[-6000:]
    assert "the elastic job finished after 1 reset(s)" in out
    assert_same_model_after_every_reset(out)
    assert_each_sample_once_per_epoch(out, 96, 2)
    assert not psutil.pid_exists(seen["pid"]) or psutil.Process(seen["pid"]).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_preempted_host_is_not_blacklisted_and_rejoins_once_rediscovered(tmp_path):
    with hosts_or_skip(2) as cluster:
        hosts_file, script = discovery_script(tmp_path, [host.address for host in cluster.hosts])
        progress = tmp_path / "progress"
        victim = cluster.hosts[1]
        seen = {}

        def remote_worker() -> psutil.Process:
            pids = [pid for pid in cluster.python_pids() if pid in victim.pids()]
            assert len(pids) == 1, f"expected one worker on {victim.address}: {pids}"
            return psutil.Process(pids[0])

        def reclaim_then_replace() -> None:
            _preempt_at(5, progress, remote_worker, seen).join()
            wait_for("the job at size 1", lambda: read_progress(progress)[1] == 1)
            hosts_file.write_text(f"{cluster.hosts[0].address}:1\n")    # the instance is gone ...
            time.sleep(3.0)     # ... for three discovery periods (1 s each), so that the driver sees it gone
            hosts_file.write_text("".join(f"{host.address}:1\n" for host in cluster.hosts))    # ... and back

        intervention = threading.Thread(target=reclaim_then_replace, daemon=True)
        intervention.start()
        env = cluster.launcher_env({"EPOCHS": "12", "END_AFTER_REGROW": "12", "STEP_SLEEP": "0.1",
                                     "PROGRESS_FILE": str(progress)})
        args = ["--min-np", "1", "--max-np", "2", "--host-discovery-script", str(script), *cluster.launcher_args()]
        with cluster.dump_stacks_after(230):
            result = horovodrun(2, [sys.executable, WORKER], extra_args=args, env=env, timeout=240)
        intervention.join(timeout=5)
        out = result.stdout
        assert result.returncode == 0, out[-6000:]
        assert "pid" in seen, out[-6000:]
        assert PREEMPTED.format(rank=1, host=victim.address, n=1) + " worker\n" in out, out[-6000:]
        assert f"host {victim.address} is no longer listed by the discovery" in out, out[-6000:]
        assert "blacklist" not in out and "failed" not in out, out[-6000:]
        sizes = [start["size"] for start in events(out, "START")]
        shrunk = sizes.index("1")
        assert sizes[:shrunk] == ["2", "2"] and "2" in sizes[shrunk:], f"the host never rejoined: {sizes}"
        dones = events(out, "DONE")
        assert sorted(d["rank"] for d in dones) == [0, 1] and {d["size"] for d in dones} == {"2"}, out[-6000:]
        assert_same_model_after_every_reset(out)
        assert cluster.python_pids() == [], "no worker may outlive the job on any host"


def test_sigterm_to_horovodrun_still_stops_the_whole_job(tmp_path):
    # Only a SIGTERM delivered to a worker is a preemption: horovodrun's own stops every worker, as before.
    progress = tmp_path / "progress"
    env = _job_env({"EPOCHS": "50", "PROGRESS_FILE": str(progress)})
    launcher = subprocess.Popen([sys.executable, "-m", "horovod.runner", "-np", "2", "--min-np", "2",
                                 "-H", "localhost:1,127.0.0.1:1", sys.executable, WORKER], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        wait_for("step 3", lambda: read_progress(progress)[0] >= 3, timeout=120)
        workers = [_local_worker(slot, progress) for slot in ("localhost:0", "127.0.0.1:0")]
        started = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        out, _ = launcher.communicate(timeout=60)
        stopped_in = time.monotonic() - started
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 128 + signal.SIGTERM, out[-6000:]
    assert "horovodrun received SIGTERM; all ranks were stopped." in out, out[-6000:]
    assert "preempted" not in out and "preemption" not in out, out[-6000:]
    # The workers die of the SIGTERM at once, as before: the driver did not wait out its grace period for them.
    assert stopped_in < 3.0 + SLACK_S, (stopped_in, out[-6000:])
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, alive
