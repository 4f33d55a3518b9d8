"""Horovod under a real Slurm of two nodes (Debian's slurmctld, slurmd and munge, configured by
tests/support/slurm.py): each node is a network-namespace host of tests/support/hosts.py with its own slurmd.

- ``salloc -N 2 -n 4 horovodrun -np 4 python worker``: horovodrun reads the allocation and starts the ranks as
  one srun step (2 per node), which every rank's Slurm variables show; allreduce and allgather are checked.
- Ctrl-C (SIGINT) to that horovodrun ends the step: exit code 130, every rank gone.
- ``sbatch -N 2 -n 2`` with ``horovodrun python worker --fail 1`` (no -np: the allocation's task count; the
  script runs on the first node): rank 1 fails on the second node, srun stops the step, and the report the
  user sees names rank 1, its node, its exit code and its last line.
- ``srun -N 2 -n 3 python worker`` without horovodrun: 3 ranks (not a power of two, 2 + 1 per node) meet at rank
  0's rendezvous; its secret file is the user's, mode 0600, in a 0700 directory, a wrong secret is rejected, and
  the files are gone after the job.

The hosts and daemons start once for the module (about 2 s); each job takes a few seconds.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from horovod.runner.process import GRACE_SECONDS
from tests.support.hosts import namespace_hosts
from tests.support.launch import ROOT
from tests.support.slurm import SlurmNode, slurm_cluster

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

WORKER = ROOT / "tests" / "integration" / "workers" / "slurm_job.py"
JOB_TIMEOUT = 60


@pytest.fixture(scope="module")
def cluster():
    with namespace_hosts(2) as hosts:
        nodes = [SlurmNode(h.name, h.address, cpus=2, netns=h.netns) for h in hosts.hosts]
        with slurm_cluster(nodes, controller_addr=hosts.gateway) as running:
            yield running


@pytest.fixture
def job_env(cluster, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = cluster.env(home=home)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    env["HOROVOD_START_TIMEOUT"] = "20"
    return env


def run(argv, env, cwd):
    return subprocess.run([str(a) for a in argv], env=env, cwd=str(cwd), capture_output=True, text=True,
                          timeout=JOB_TIMEOUT, stdin=subprocess.DEVNULL)


def results(text: str) -> dict:
    """The RESULT records by rank, from prefixed (``[r]<stdout>:RESULT``) or plain lines."""
    found = {}
    for line in text.splitlines():
        if "RESULT " in line:
            record = json.loads(line.split("RESULT ", 1)[1])
            found[record["rank"]] = record
    return found


def test_horovodrun_in_salloc_starts_the_ranks_with_srun(cluster, job_env, tmp_path):
    # Like a login node, the shell of salloc must resolve the node names: run it in the first node's netns.
    proc = run(["ip", "netns", "exec", cluster.nodes[0].netns, "salloc", "-N", 2, "-n", 4,
                "horovodrun", "-np", 4, sys.executable, WORKER], job_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_rank = results(proc.stdout)
    assert sorted(by_rank) == [0, 1, 2, 3], proc.stdout
    nodes = [n.name for n in cluster.nodes]
    for rank, record in by_rank.items():
        assert f"[{rank}]<stdout>:RESULT " in proc.stdout
        assert record["size"] == 4 and record["local_rank"] == rank % 2 and record["local_size"] == 2
        assert record["cross_rank"] == rank // 2 and record["cross_size"] == 2
        assert record["sums"] == [10.0, 10.0] and record["gathered"] == [0, 1, 2, 3]
        env = record["env"]
        assert env["SLURM_PROCID"] == str(rank) and "SLURM_STEP_ID" in env    # a task of an srun step
        assert env["HOROVOD_RANK"] == str(rank) and env["HOROVOD_LOCAL_RANK"] == str(rank % 2)
        assert env["HOROVOD_CROSS_RANK"] == str(rank // 2) and env["HOROVOD_HOSTNAME"] == nodes[rank // 2]
        assert "SLURM_HOSTFILE" not in env and record["has_secret_env"]
        assert record["probe"] is None


def test_ctrl_c_to_horovodrun_ends_the_srun_step(cluster, job_env, tmp_path):
    piddir = tmp_path / "pids"
    piddir.mkdir()
    argv = ["ip", "netns", "exec", cluster.nodes[0].netns, "salloc", "-N", 2, "-n", 2,
            "horovodrun", sys.executable, WORKER, "--hold", piddir]
    proc = subprocess.Popen([str(a) for a in argv], env=job_env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while len(list(piddir.iterdir())) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        pids = [int(p.read_text()) for p in piddir.iterdir()]
        assert len(pids) == 2, proc.communicate(timeout=5)
        launcher = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "horovodrun"]
        assert len(launcher) == 1, launcher
        launcher[0].send_signal(signal.SIGINT)
        signalled = time.monotonic()
        out, err = proc.communicate(timeout=20)
        stopped_in = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert "Interrupted (SIGINT): all ranks were stopped." in err
    # srun ended the step itself: horovodrun did not have to kill it after its grace period
    assert "did not stop within" not in err and stopped_in < GRACE_SECONDS, (stopped_in, err)
    gone_by = time.monotonic() + 10
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert not any(psutil.pid_exists(pid) for pid in pids), pids


def test_a_failing_rank_under_sbatch_stops_the_step_and_is_named(cluster, job_env, tmp_path):
    out = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\nexec horovodrun {sys.executable} {WORKER} --fail 1\n")
    script.chmod(0o755)
    start = time.monotonic()
    proc = run(["sbatch", "--wait", "-N", 2, "-n", 2, "-o", out, script], job_env, tmp_path)
    elapsed = time.monotonic() - start
    text = out.read_text()
    assert elapsed < 30, (elapsed, text)    # rank 0 sleeps for 60 s unless srun stops it
    assert proc.returncode == 3, proc.stdout + proc.stderr + text     # the failed rank's exit code
    assert "srun: error: " in text and "task 1: Exited with exit code 3" in text
    assert "Process 1 failed (exit code 3) on " + cluster.nodes[1].name in text
    report = text[text.index("The first process to do so was:"):]
    assert "Process name: 1\n" in report and "Exit code: 3\n" in report
    assert f"Host: {cluster.nodes[1].name}\n" in report
    assert "Last 1 output lines of rank 1:\n    rank 1 fails on purpose" in report
    assert "[1]<stdout>:rank 1 fails on purpose" in text
    assert "RESULT" not in text      # rank 0 was stopped in its sleep


def test_plain_srun_ranks_meet_at_rank_0s_rendezvous(cluster, job_env, tmp_path):
    proc = run(["srun", "-N", 2, "-n", 3, sys.executable, WORKER, "--probe-secret"], job_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_rank = results(proc.stdout)
    assert sorted(by_rank) == [0, 1, 2], proc.stdout
    # (local rank, local size, cross rank, cross size): ranks 0, 1 on the first node, rank 2 alone on the second;
    # cross ranks join the ranks with the same local rank (local rank 1 exists on the first node only).
    layout = {0: (0, 2, 0, 2), 1: (1, 2, 0, 1), 2: (0, 1, 1, 2)}
    for rank, record in by_rank.items():
        assert record["size"] == 3
        got = (record["local_rank"], record["local_size"], record["cross_rank"], record["cross_size"])
        assert got == layout[rank], (rank, got)
        assert record["sums"] == [6.0, 6.0] and record["gathered"] == [0, 1, 2]
        assert "HOROVOD_RANK" not in record["env"] and not record["has_secret_env"]
    probe = by_rank[1]["probe"]
    home = Path(job_env["HOME"]) / ".horovod"
    assert probe["path"].startswith(str(home) + "/slurm-") and probe["path"].endswith(".0.key"), probe
    assert probe["mode"] == 0o600 and probe["uid"] == os.getuid() and probe["dir_mode"] == 0o700, probe
    assert "rejected" in probe["wrong_secret"], probe
    assert list(home.iterdir()) == []     # rank 0 removed the secret and address files
