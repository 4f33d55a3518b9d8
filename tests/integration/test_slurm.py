"""Horovod under a real Slurm (Debian's slurmctld, slurmd and munge, configured by tests/support/slurm.py).

- ``salloc -n 2 horovodrun -np 2 python worker``: horovodrun reads the allocation and starts the ranks as one
  srun step, which every rank's Slurm variables show; an allreduce and an allgather across them are checked.
- ``sbatch -n 2`` with ``horovodrun python worker --fail 1`` (no -np: the allocation's task count): rank 1 fails,
  srun stops the step, and the report the user sees names rank 1, its host, its exit code and its last line.
- ``srun -n 3 python worker`` without horovodrun: 3 ranks (not a power of two) meet at rank 0's rendezvous; its
  secret file is the user's, mode 0600, in a 0700 directory, a wrong secret is rejected, and the files are gone
  after the job.

The daemons start once for the module (about a second); each job takes a few seconds.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.launch import ROOT
from tests.support.slurm import slurm_cluster

pytestmark = pytest.mark.timeout(120)

WORKER = ROOT / "tests" / "integration" / "workers" / "slurm_job.py"
JOB_TIMEOUT = 60


@pytest.fixture(scope="module")
def cluster():
    with slurm_cluster() as running:
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
    proc = run(["salloc", "-n", 2, "horovodrun", "-np", 2, sys.executable, WORKER], job_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_rank = results(proc.stdout)
    assert sorted(by_rank) == [0, 1], proc.stdout
    for rank, record in by_rank.items():
        assert f"[{rank}]<stdout>:RESULT " in proc.stdout
        assert record["size"] == 2 and record["local_rank"] == rank and record["local_size"] == 2
        assert record["cross_rank"] == 0 and record["cross_size"] == 1
        assert record["sums"] == [3.0, 3.0] and record["gathered"] == [0, 1]
        env = record["env"]
        assert env["SLURM_PROCID"] == str(rank) and "SLURM_STEP_ID" in env    # a task of an srun step
        assert env["HOROVOD_RANK"] == str(rank) and env["HOROVOD_LOCAL_RANK"] == str(rank)
        assert env["HOROVOD_HOSTNAME"] == cluster.node and env["HOROVOD_CROSS_SIZE"] == "1"
        assert "SLURM_HOSTFILE" not in env and record["has_secret_env"]
        assert record["probe"] is None


def test_a_failing_rank_under_sbatch_stops_the_step_and_is_named(cluster, job_env, tmp_path):
    out = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\nexec horovodrun {sys.executable} {WORKER} --fail 1\n")
    script.chmod(0o755)
    start = time.monotonic()
    proc = run(["sbatch", "--wait", "-n", 2, "-o", out, script], job_env, tmp_path)
    elapsed = time.monotonic() - start
    text = out.read_text()
    assert elapsed < 30, (elapsed, text)    # rank 0 sleeps for 60 s unless srun stops it
    assert proc.returncode == 3, proc.stdout + proc.stderr + text     # the failed rank's exit code
    assert "srun: error: " in text and "task 1: Exited with exit code 3" in text
    assert "Process 1 failed (exit code 3) on " + cluster.node in text
    report = text[text.index("The first process to do so was:"):]
    assert "Process name: 1\n" in report and f"Host: {cluster.node}\n" in report and "Exit code: 3\n" in report
    assert "Last 1 output lines of rank 1:\n    rank 1 fails on purpose" in report
    assert "[1]<stdout>:rank 1 fails on purpose" in text
    assert "RESULT" not in text      # rank 0 was stopped in its sleep


def test_plain_srun_ranks_meet_at_rank_0s_rendezvous(cluster, job_env, tmp_path):
    proc = run(["srun", "-n", 3, sys.executable, WORKER, "--probe-secret"], job_env, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_rank = results(proc.stdout)
    assert sorted(by_rank) == [0, 1, 2], proc.stdout
    for rank, record in by_rank.items():
        assert record["size"] == 3 and record["local_rank"] == rank and record["local_size"] == 3
        assert record["sums"] == [6.0, 6.0] and record["gathered"] == [0, 1, 2]
        assert "HOROVOD_RANK" not in record["env"] and not record["has_secret_env"]
    probe = by_rank[1]["probe"]
    home = Path(job_env["HOME"]) / ".horovod"
    assert probe["path"].startswith(str(home) + "/slurm-") and probe["path"].endswith(".0.key"), probe
    assert probe["mode"] == 0o600 and probe["uid"] == os.getuid() and probe["dir_mode"] == 0o700, probe
    assert "rejected" in probe["wrong_secret"], probe
    assert list(home.iterdir()) == []     # rank 0 removed the secret and address files
