"""Upstream's elastic integration scenarios (its ``test/integration/elastic_common.py``) with a TensorFlow 2 program:
``workers/elastic_tensorflow2_main.py``, upstream's ``elastic_tensorflow2_main.py`` (a tf.keras model,
``DistributedGradientTape`` in a ``tf.function``, ``TensorFlowKerasState``, ``hvd.elastic.run``, a commit every
batch, a reset callback).

As upstream, the discovery script reads the worker's log file, one JSON line per epoch written by rank 0, to know
the epoch and answer that epoch's hosts, and the driver polls it faster than its 1 s: every 0.1 s here, where
upstream's 10 ms (a script run 100 times a second) made the first test take 54 s instead of 17 on a 2-core
machine. ``localhost`` and ``127.0.0.1`` are two hosts of this machine. Each test asserts what a user sees: the
exit status, the driver's and the workers' lines, and the log.

Two regressions are guarded here, for ``DistributedGradientTape`` and, with ``workers/elastic_keras_fit.py``, for
``horovod.keras``' ``model.fit``: the gradient allreduce was left out of a graph traced while the job had one
worker (the job grown to two then deadlocked), and the error of a failed collective inside a graph (a
``HorovodGroupedAllreduce`` node) was not taken for one, so every survivor of a failed rank exited too. The
scenarios that only the driver decides, the same for every framework, are tested once: the reset limit with
PyTorch (test_elastic.py), every host blacklisted and every rank failing at the driver's decision
(tests/unit/test_elastic_driver.py).
"""
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from tests.support.elastic import (
    TF2_WORKER,
    discovery_script,
    events,
    horovodrun_polling,
    log_lines,
    schedule_discovery_script,
)

pytest.importorskip("tensorflow")

FIT_WORKER = str(Path(TF2_WORKER).with_name("elastic_keras_fit.py"))
# A short elastic timeout (upstream's is 600 s) and a reset limit (the scenarios reset at most twice): a job that
# waits for slots it never gets, or that fails and re-forms over and over, ends within the test's time, saying so.
BOUNDED = ["--elastic-timeout", "20", "--reset-limit", "4"]
FAILED = "Horovod detected that one or more processes exited with non-zero status"
ADD_THEN_REMOVE = [(0, ["localhost:1"]), (1, ["localhost:1", "127.0.0.1:1"]), (None, ["127.0.0.1:1"])]
ONE_SLOT_EACH = [(None, ["localhost:1", "127.0.0.1:1"])]


def run_job(tmp_path: Path, schedule: List[Tuple[Optional[int], List[str]]], np: int, min_np: int, max_np: int,
            launcher_args: List[str] = (), worker_args: List[str] = (), exit_schedule: Optional[Dict] = None,
            exit_mode: str = "exception", env: Optional[Dict[str, str]] = None, timeout: float = 150):
    """Run the worker under ``schedule``'s discovery; (the completed launcher, rank 0's per-epoch log lines)."""
    logfile = tmp_path / "log.jsonl"
    script = schedule_discovery_script(tmp_path, logfile, schedule)
    args = ["--min-np", str(min_np), "--max-np", str(max_np), "--host-discovery-script", str(script), *BOUNDED,
            *launcher_args]
    command = [sys.executable, TF2_WORKER, "--logfile", str(logfile), "--discovery-schedule", json.dumps(schedule),
               "--discovery-wait", "20", *worker_args]
    if exit_schedule:
        command += ["--exit-schedule", json.dumps(exit_schedule), "--exit-mode", exit_mode]
    result = horovodrun_polling(np, command, args, {"TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}, timeout)
    return result, log_lines(logfile)


def summary(log: List[dict]) -> List[tuple]:
    """Each epoch's (epoch, size, host of rank 0, start rank of rank 0, rendezvous)."""
    return [(line["epoch"], line["size"], line["hostname"], line["start_rank"], line["rendezvous"]) for line in log]


def rounds(output: str) -> List[Tuple[int, int]]:
    """(rendezvous, size) of each round in which the training function started, in order; asserts that the
    ranks of each round started from the same model and that each round has its size in ranks."""
    hashes, seen = defaultdict(set), []
    for start in events(output, "START"):
        key = (int(start["rendezvous"]), int(start["size"]))
        hashes[key].add(start["hash"])
        seen.append(key)
    for key, found in hashes.items():
        assert len(found) == 1, f"the ranks of round {key} started from different models: {found}\n{output}"
    counts = {key: seen.count(key) for key in hashes}
    assert all(count == key[1] for key, count in counts.items()), f"ranks per round: {counts}\n{output}"
    return sorted(hashes)


def test_hosts_added_and_removed(tmp_path):
    # upstream's test_hosts_added_and_removed with one slot per host: size 1, then 2, then 1 on the new host only
    result, log = run_job(tmp_path, ADD_THEN_REMOVE, np=1, min_np=1, max_np=2)
    out = result.stdout
    assert result.returncode == 0, out[-8000:]
    assert summary(log) == [(0, 1, "localhost", 0, 1), (1, 2, "localhost", 0, 2), (2, 1, "127.0.0.1", 1, 3)], out
    assert rounds(out) == [(1, 1), (2, 2), (3, 1)], out[-8000:]
    assert "localhost:0 has been removed from the elastic job" in out
    assert [(d["size"], d["rank"]) for d in events(out, "DONE")] == [("1", "0")], out[-8000:]


@pytest.mark.slow
def test_a_failing_rank_blacklists_its_host_which_comes_back_after_its_cooldown(tmp_path):
    # upstream's test_single_rank_failure (exception mode), with one slot per host (two slots each cost two more
    # TensorFlow processes per round on a 2-core machine): the rank that started as 0 raises at epoch 1; its host
    # is blacklisted for 2 s (--blacklist-cooldown-range 1 2: clamp(2 + U(0, 1), 1, 2)), the other host's rank goes
    # on alone, and the host comes back: two ranks again.
    result, log = run_job(tmp_path, ONE_SLOT_EACH, np=2, min_np=1, max_np=2, exit_schedule={str((1, 0)): [0]},
                          launcher_args=["--blacklist-cooldown-range", "1", "2"],
                          worker_args=["--wait-for-size", json.dumps({"1": 2})], timeout=200)
    out = result.stdout
    assert result.returncode == 0, out[-8000:]
    assert "RuntimeError: check_rank and exit epoch=1 batch=0 start_rank=0 rank=0" in out
    assert "worker localhost:0 (rank 0) failed: exit code 1" in out
    assert "blacklist failing host: localhost" in out
    assert summary(log) == [(0, 2, "localhost", 0, 1), (1, 1, "127.0.0.1", 1, 2), (2, 2, "127.0.0.1", 1, 3)], out
    assert rounds(out) == [(1, 2), (2, 1), (3, 2)], out[-8000:]
    assert "hosts changed (added): the workers were notified" in out
    assert sorted(int(d["size"]) for d in events(out, "DONE")) == [2, 2], out[-8000:]


def test_a_killed_rank_on_tf_keras_leaves_the_job_to_the_other_host(tmp_path):
    # upstream's test_single_rank_failure in kill mode, with one slot per host, on tf-keras (Keras 2)
    pytest.importorskip("tf_keras")
    result, log = run_job(tmp_path, ONE_SLOT_EACH, np=2, min_np=1, max_np=2, exit_schedule={str((1, 0)): [0]},
                          exit_mode="kill", env={"TF_USE_LEGACY_KERAS": "1"})
    out = result.stdout
    assert result.returncode == 0, out[-8000:]
    assert "worker localhost:0 (rank 0) failed: killed by SIGKILL" in out
    assert "blacklist failing host: localhost" in out
    assert summary(log) == [(0, 2, "localhost", 0, 1), (1, 1, "127.0.0.1", 1, 2), (2, 1, "127.0.0.1", 1, 2)], out
    assert rounds(out) == [(1, 2), (2, 1)], out[-8000:]


def test_too_few_slots_after_a_failure_end_the_job_after_the_elastic_timeout(tmp_path):
    # upstream's test_min_hosts_timeout: min-np is the whole job, so losing a host leaves too few slots
    result, log = run_job(tmp_path, ONE_SLOT_EACH, np=2, min_np=2, max_np=2, exit_schedule={str((1, 0)): [0]},
                          launcher_args=["--elastic-timeout", "1"])
    out = result.stdout
    assert result.returncode == 1, out[-8000:]
    assert "Timed out waiting for minimum number of slots to become available" in out
    assert "with 1 usable slots on 1 hosts" in out
    assert ("blacklisted after a worker failed there, for the rest of the job (without --blacklist-cooldown-range a "
            "blacklisted host never comes back): localhost") in out
    assert summary(log) == [(0, 2, "localhost", 0, 1)], out[-8000:]


def test_keras_fit_grows_then_loses_the_new_worker(tmp_path):
    # horovod.keras (Keras 3) on TensorFlow: model.fit's train function, traced with one worker, allreduces once
    # a second joins; and the survivor of that worker's SIGKILL finds its failed collective in that graph
    pytest.importorskip("keras")
    hosts_file, script = discovery_script(tmp_path, ["localhost"])
    env = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3", "HOSTS_FILE": str(hosts_file),
           "EXTRA_HOST": "127.0.0.1:1", "GROW_AT": "1", "KILL_HOST": "127.0.0.1", "KILL_AT": "2",
           "MARKER": str(tmp_path / "killed")}
    args = ["--min-np", "1", "--max-np", "2", "--host-discovery-script", str(script), *BOUNDED]
    result = horovodrun_polling(1, [sys.executable, FIT_WORKER], args, env, 150)
    out = result.stdout
    assert result.returncode == 0, out[-8000:]
    assert (tmp_path / "killed").exists()
    assert "worker 127.0.0.1:0 (rank 1) failed: killed by SIGKILL" in out
    assert "a collective failed" in out and "restoring the last commit and re-forming the job" in out
    seen = defaultdict(list)            # rank -> its (line, hash) in order
    for rank, what, fields, digest in re.findall(r"^\[(\d)\]<stdout>:(START|DONE) (.*) hash=(\w+)$", out, re.M):
        seen[int(rank)].append((f"{what} {fields}", digest))
    assert [line for line, _ in seen[0]] == ["START size=1 epoch=0", "START size=2 epoch=1", "START size=1 epoch=2",
                                             "DONE size=1 epoch=4"], out[-8000:]
    assert [line for line, _ in seen[1]] == ["START size=2 epoch=1"], out[-8000:]
    assert seen[0][1][1] == seen[1][0][1], "the new worker was not synced from rank 0"
