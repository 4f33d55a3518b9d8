"""``horovod.spark.run`` and ``run_elastic`` on a real Spark: ``local-cluster[2,2,1024]`` (two executor JVMs with
two cores each, so four task slots), started once for the module.

Every job runs under a watchdog: if it outlives its time, the ranks (``python -m horovod.spark.rank``, children of
the executors' Python workers) dump their stacks (each test function registers faulthandler on SIGUSR1; the dumps
reach the test's output through the driver) and are killed, so the job fails with their stacks instead of hanging.
"""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, List

import cloudpickle
import psutil
import pytest

import horovod.spark
from horovod.spark.failures import HorovodSparkError
from tests.support.spark import spark_fixture

spark = spark_fixture(executors=2, cores=2)
# The jobs' functions travel by value: the ranks need not import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _rank_processes() -> List[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "horovod.spark.rank" in " ".join(proc.cmdline()):
                found.append(proc)
    return found


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Dump the stacks of the job's ranks and kill them if the block runs longer than ``seconds``."""
    done = threading.Event()

    def fire() -> None:
        if done.wait(seconds):
            return
        ranks = _rank_processes()
        for proc in ranks:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGUSR1)
        time.sleep(2.0)
        for proc in ranks:
            with contextlib.suppress(psutil.Error):
                proc.kill()

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _wait_gone(pids: List[int], timeout: float = 15.0) -> List[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        time.sleep(0.1)
    return alive


def _record_pid(directory: str) -> None:
    Path(directory, f"{os.getpid()}.pid").write_text("")


def _pids(directory: Path) -> List[int]:
    return [int(p.stem) for p in directory.glob("*.pid")]


def topology_and_allreduce(scale):
    import faulthandler

    import torch

    import horovod.torch as hvd

    faulthandler.register(signal.SIGUSR1)
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    print(f"hello from rank {hvd.rank()}", flush=True)
    # The job secret reached the rank on its stdin: it is in the rank's environment now, but neither in the
    # environment it was started with (what `ps e` and /proc/<pid>/environ show) nor on its command line.
    started_with = Path("/proc/self/environ").read_bytes() + Path("/proc/self/cmdline").read_bytes()
    secret = os.environ["_HOROVOD_SECRET_KEY"]
    hidden = secret.encode() not in started_with and b"_HOROVOD_SECRET_KEY" not in started_with
    return (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), float(total[0]) * scale,
            os.environ.get("FROM_ENV_ARG"), hidden)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_proc", [2, 3])
def test_run_returns_results_by_rank(spark, num_proc):
    out = io.StringIO()
    with watchdog(90):
        results = horovod.spark.run(topology_and_allreduce, args=(2,), num_proc=num_proc, stdout=out,
                                    env={"FROM_ENV_ARG": "yes"})
    expected_sum = 2.0 * num_proc * (num_proc + 1) / 2
    # All executors run on this machine, so every rank is a local peer of every other.
    assert results == [(r, num_proc, r, num_proc, expected_sum, "yes", True) for r in range(num_proc)]
    for rank in range(num_proc):
        assert f"[{rank}]<stdout>:hello from rank {rank}\n" in out.getvalue()


def raises_on_rank_one(pid_dir):
    import faulthandler

    import torch

    import horovod.torch as hvd

    faulthandler.register(signal.SIGUSR1)
    _record_pid(pid_dir)
    hvd.init()
    hvd.allreduce(torch.ones(1))
    if hvd.rank() == 1:
        raise ValueError("rank one gives up")
    while True:                       # the others keep going until the failure reaches them
        hvd.allreduce(torch.ones(1))


@pytest.mark.timeout(120)
def test_task_that_raises_fails_the_job_naming_rank_and_executor(spark, tmp_path):
    with watchdog(90), pytest.raises(HorovodSparkError) as info:
        horovod.spark.run(raises_on_rank_one, args=(str(tmp_path),), num_proc=2)
    message = str(info.value)
    assert "the function raised ValueError('rank one gives up') on rank 1 on Spark executor " in message
    assert "Traceback from rank 1:" in message and "raises_on_rank_one" in message
    assert info.value.rank == 1 and info.value.executor in ("0", "1")
    assert isinstance(info.value.__cause__, ValueError)
    pids = _pids(tmp_path)
    assert len(pids) == 2
    assert _wait_gone(pids) == [], "rank processes outlived the failed job"


def killed_on_rank_one(pid_dir):
    import faulthandler

    import torch

    import horovod.torch as hvd

    faulthandler.register(signal.SIGUSR1)
    _record_pid(pid_dir)
    hvd.init()
    hvd.allreduce(torch.ones(1))
    print(f"rank {hvd.rank()} did its first allreduce", flush=True)
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        hvd.allreduce(torch.ones(1))


@pytest.mark.timeout(120)
def test_rank_killed_mid_job_fails_the_job(spark, tmp_path):
    with watchdog(90), pytest.raises(HorovodSparkError) as info:
        horovod.spark.run(killed_on_rank_one, args=(str(tmp_path),), num_proc=2, stdout=io.StringIO())
    message = str(info.value)
    assert "rank 1 on Spark executor " in message
    assert "exited (killed by SIGKILL) before it reported a result" in message
    assert "rank 1 did its first allreduce" in message       # its last output lines
    assert _wait_gone(_pids(tmp_path)) == [], "rank processes outlived the failed job"


@pytest.mark.timeout(60)
def test_impossible_num_proc_fails_with_a_clear_message(spark):
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"waiting for 5 Spark task slots: the cluster has 4 .* Lower num_proc to "
                                           r"at most 4"):
        horovod.spark.run(topology_and_allreduce, args=(1,), num_proc=5, start_timeout=3)
    assert time.monotonic() - started < 30


@pytest.mark.timeout(30)
def test_use_mpi_is_refused_naming_the_alternative():
    with pytest.raises(NotImplementedError, match="use_mpi=True.*Leave use_mpi unset .*use_gloo=True"):
        horovod.spark.run(topology_and_allreduce, use_mpi=True)


def waits_for_its_executor_to_die(pid_dir):
    import faulthandler

    import torch

    import horovod.torch as hvd

    faulthandler.register(signal.SIGUSR1)
    hvd.init()
    hvd.allreduce(torch.ones(1))
    Path(pid_dir, f"rank{hvd.rank()}.{os.getpid()}.pid").write_text("")
    while True:
        hvd.allreduce(torch.ones(1))
        time.sleep(0.01)


def _kill_executor_of_rank_one(pid_dir: Path, killed: list) -> None:
    deadline = time.monotonic() + 60
    while not list(pid_dir.glob("rank1.*.pid")) and time.monotonic() < deadline:
        time.sleep(0.05)
    rank1 = int(next(pid_dir.glob("rank1.*.pid")).name.split(".")[1])
    killed.extend(p.pid for p in psutil.Process(rank1).parents() if p.name() == "java")
    killed.append(rank1)
    psutil.Process(killed[0]).kill()


@pytest.mark.timeout(120)
def test_executor_killed_mid_job_fails_the_job_naming_it(spark, tmp_path):
    killed: list = []
    killer = threading.Thread(target=_kill_executor_of_rank_one, args=(tmp_path, killed), daemon=True)
    killer.start()
    with watchdog(90), pytest.raises(HorovodSparkError) as info:
        horovod.spark.run(waits_for_its_executor_to_die, args=(str(tmp_path),), num_proc=2, stdout=io.StringIO(),
                          stderr=io.StringIO())
    killer.join()
    message = str(info.value)
    assert "rank 1 on Spark executor " in message and "was lost with its Spark task" in message
    assert "ExecutorLostFailure" in message
    assert _wait_gone([int(p.name.split(".")[1]) for p in tmp_path.glob("rank*.pid")]) == []


def elastic_training(pid_dir, total_steps):
    import faulthandler

    import torch

    import horovod.torch as hvd

    faulthandler.register(signal.SIGUSR1)
    hvd.init()
    state = hvd.elastic.TorchState(step=0, sizes=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        _record_pid(pid_dir)
        while state.step < total_steps:
            total = hvd.allreduce(torch.ones(1), op=hvd.Sum)
            state.sizes.append(int(total[0]))
            state.step += 1
            if state.step == 5 and hvd.rank() == 0:
                Path(pid_dir, "step5").write_text(str(os.getpid()))
            time.sleep(0.1)
            state.commit()
        return state.step, state.sizes, os.environ["HOROVOD_HOSTNAME"], resets

    return train(state)


def _executor_jvms() -> List[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.name() == "java" and "CoarseGrainedExecutorBackend" in " ".join(proc.cmdline()):
                found.append(proc)
    return found


def _kill_executor_without_rank_zero(pid_dir: Path, stop: threading.Event, killed: dict) -> None:
    """Once rank 0 did 5 steps, SIGKILL the executor JVM that does not host rank 0 (its state must survive)."""
    while not stop.is_set() and not (pid_dir / "step5").exists():
        time.sleep(0.05)
    if stop.is_set():
        return
    rank0_jvms = {p.pid for p in psutil.Process(int((pid_dir / "step5").read_text())).parents()}
    victim = next(jvm for jvm in _executor_jvms() if jvm.pid not in rank0_jvms)
    args = victim.cmdline()
    killed["executor"] = args[args.index("--executor-id") + 1]
    killed["ranks"] = [pid for pid in _pids(pid_dir) if victim.pid in {p.pid for p in psutil.Process(pid).parents()}]
    victim.kill()


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_run_elastic_goes_on_without_a_lost_executor(spark, tmp_path):
    stop, killed = threading.Event(), {}
    killer = threading.Thread(target=_kill_executor_without_rank_zero, args=(tmp_path, stop, killed), daemon=True)
    killer.start()
    out = io.StringIO()
    try:
        with watchdog(120):
            results = horovod.spark.run_elastic(elastic_training, args=(str(tmp_path), 40), num_proc=4,
                                                min_num_proc=2, stdout=out, stderr=out)
    finally:
        stop.set()
        killer.join()
    assert killed and len(killed["ranks"]) == 2, f"the test killed no executor with two ranks: {killed}"
    steps, sizes, hosts, resets = zip(*results)
    assert set(steps) == {40} and len(set(map(tuple, sizes))) == 1, results
    assert sizes[0][0] == 4, sizes[0]                       # the job started with four ranks
    # It went on with the two survivors, rank 0 through a reset with its state, and grew again by the tasks Spark
    # retried on the executor it starts in place of the lost one, each as the driver's discovery saw it start
    # before the 40 steps were done: none, one (seen once on a loaded machine) or both...
    assert len(results) in (2, 3, 4) and resets[0], results
    # ... never again on the executor that was lost, whose ranks are gone.
    assert not any(host.endswith(f"-executor-{killed['executor']}") for host in hosts), hosts
    assert _wait_gone(killed["ranks"]) == []


# Pure parts, no Spark needed.

@pytest.mark.timeout(30)
def test_ranks_are_placed_contiguously_per_host():
    from horovod.spark.task import place_ranks

    slots = place_ranks(["b", "a", "b", "a", "b"])          # partition -> host, in Spark's task order
    assert [(s.hostname, s.rank, s.local_rank, s.local_size) for s in slots] == [
        ("b", 0, 0, 3), ("a", 3, 0, 2), ("b", 1, 1, 3), ("a", 4, 1, 2), ("b", 2, 2, 3)]
    assert {(s.cross_rank, s.cross_size) for s in slots if s.hostname == "a"} == {(1, 2)}


@pytest.mark.timeout(30)
def test_root_failure_prefers_the_rank_that_failed_on_its_own():
    from horovod.common import wire
    from horovod.common.exceptions import HorovodInternalError
    from horovod.common.kvstore import KVStoreServer
    from horovod.runner import run_func
    from horovod.spark import protocol
    from horovod.spark.failures import root_failure

    store = KVStoreServer(b"k" * 32, host="127.0.0.1")
    store.start()
    try:
        assert root_failure(store) is None
        place = protocol.TaskPlace("h", "3", 0)
        # Rank 0 failed first, only because its peer was lost; rank 1 was killed.
        store.put(run_func.RESULT_SCOPE, "0", run_func.encode_failure(HorovodInternalError("peer lost"), "tb0"))
        store.put(protocol.EXIT_SCOPE, "0", protocol.exit_record(1, [], place, 10.0))
        store.put(protocol.EXIT_SCOPE, "1", protocol.exit_record(-9, ["last words"],
                                                                 protocol.TaskPlace("h", "4", 1), 11.0))
        store.put(protocol.EXIT_SCOPE, "2", protocol.exit_record(0, [], place, 12.0))
        error = root_failure(store)
        assert (error.rank, error.executor) == (1, "4")
        assert str(error).startswith("horovod.spark.run: rank 1 on Spark executor 4 (host h, task 1) exited "
                                     "(killed by SIGKILL) before it reported a result.\nLast 1 output lines")
        assert "Ranks that failed after it: 0." in str(error)
        assert wire.unpack(store.get(protocol.EXIT_SCOPE, "2"))["returncode"] == 0
    finally:
        store.stop()


@pytest.mark.timeout(30)
def test_a_rank_that_died_shows_its_exception_s_first_lines_and_its_last_lines(tmp_path):
    """A rank's process that died before it reported a result: the error carries the first lines of its last
    exception (kept by the task, as horovodrun keeps them) above its last lines."""
    from horovod.common.kvstore import KVStoreServer
    from horovod.spark import protocol, task
    from horovod.spark.failures import root_failure

    script = tmp_path / "dies.py"
    script.write_text("raise SystemError('the rank broke\\nits peer: stopped\\n' + "
                      "'\\n'.join(f'stack {i}' for i in range(30)))\n")
    store = KVStoreServer(b"k" * 32, host="127.0.0.1")
    store.start()

    class Client:            # the task's store client: the exit record reaches the driver's store
        def put(self, scope, key, value):
            store.put(scope, key, value)

    try:
        # A RankProcess around this script instead of the rank bootstrap: the same pumps, tail and report.
        rank = task.RankProcess.__new__(task.RankProcess)
        rank._client, rank._label, rank._seq, rank._lock = Client(), 1, 0, threading.Lock()
        rank.tail = task.OutputTail()
        rank.proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        rank._pumps = [threading.Thread(target=rank._pump, args=(pipe, name), daemon=True)
                       for pipe, name in ((rank.proc.stdout, "stdout"), (rank.proc.stderr, "stderr"))]
        for pump in rank._pumps:
            pump.start()
        assert task.run_and_report(Client(), rank, "1", protocol.TaskPlace("h", "3", 1)) == 1
        text = str(root_failure(store))
        assert ("exited (exit code 1) before it reported a result.\nThe exception rank 1 raised (its first lines):\n"
                "    SystemError: the rank broke\n    its peer: stopped\n    stack 0\n    stack 1\n"
                "Last 10 output lines of rank 1:\n") in text, text
        assert text.endswith("    stack 29"), text
    finally:
        store.stop()


@pytest.mark.timeout(30)
def test_run_elastic_checks_its_sizes():
    from horovod.spark.elastic import resolve_sizes

    assert resolve_sizes(4, None, None, 2, 6, 8) == (4, 2, 6)
    assert resolve_sizes(None, None, None, None, None, 3) == (3, 3, 3)
    with pytest.raises(ValueError, match="min_num_proc=2 and its alias=3 disagree"):
        resolve_sizes(4, 2, None, 3, None, 8)
    with pytest.raises(ValueError, match=r"1 <= min_num_proc \(5\) <= num_proc \(4\)"):
        resolve_sizes(4, 5, None, None, None, 8)


@pytest.mark.timeout(30)
def test_executor_id_from_the_standalone_log_url_else_the_fallback():
    from horovod.spark.protocol import executor_id

    url = "http://10.0.0.5:8081/logPage/?appId=app-1&executorId=7&logType=stderr"
    assert executor_id("x", {"SPARK_LOG_URL_STDERR": url}) == "7"
    assert executor_id("at 10.0.0.5:4321", {}) == "at 10.0.0.5:4321"
