"""``horovod.spark.run``: a Horovod job whose ranks are the tasks of one Spark barrier stage.

The driver starts the job's rendezvous (the authenticated KV store of :mod:`horovod.runner.rendezvous`) and puts
the cloudpickled function there, as ``horovod.run`` does. Then it runs ``num_proc`` tasks in Spark's barrier
execution mode, so that all of them are scheduled together or none is. Each task places its rank from the stage's
task list (ranks contiguous per host), starts the rank in a child process (:mod:`horovod.spark.task`), forwards its
output, and records how it ended. The driver watches the store: the first failure stops the whole job
(:mod:`horovod.spark.failures` names the root cause), a stage that does not start within ``start_timeout`` is
cancelled, and on success the results come back by rank.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from horovod.runner import run_func
from horovod.runner.common.util.settings import Settings
from horovod.runner.gloo_run import job_env
from horovod.runner.rendezvous import RendezvousServer

from . import driver, failures, protocol
from .static_task import make_task_fn

log = logging.getLogger("horovod.spark")  # a named channel: see horovod.common.logging_setup

FAILURE_SETTLE_SECONDS = 2.0   # after a first failure, how long the other ranks get to report theirs


def check_controller(use_mpi: Optional[bool], use_gloo: Optional[bool], extra_mpi_args: Optional[str],
                     what: str = "horovod.spark.run") -> None:
    """Refuse MPI mode, which this release does not run inside Spark tasks (see docs/spark.md)."""
    if use_mpi and use_gloo:
        raise ValueError(f"{what}: use_mpi and use_gloo cannot both be True; give at most one of them.")
    if use_mpi:
        raise NotImplementedError(
            f"{what}(use_mpi=True) is not supported: this Horovod does not start mpirun inside Spark tasks. "
            "Leave use_mpi unset (or pass use_gloo=True): the built-in controller, the default, runs the same "
            "program with the same collectives over TCP and shared memory.")
    if extra_mpi_args:
        log.warning("%s: extra_mpi_args=%r is ignored: the job does not use mpirun", what, extra_mpi_args)


def run(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Dict[str, Any]] = None,
        num_proc: Optional[int] = None, start_timeout: Optional[float] = None, use_mpi: Optional[bool] = None,
        use_gloo: Optional[bool] = None, extra_mpi_args: Optional[str] = None,
        env: Optional[Dict[str, str]] = None, stdout=None, stderr=None, verbose: int = 1,
        nics: Optional[Sequence[str]] = None, prefix_output_with_timestamp: bool = False,
        executable: Optional[str] = None) -> List[Any]:
    """Run ``fn(*args, **kwargs)`` as a Horovod job of ``num_proc`` ranks, one per Spark task, and return the
    results by rank.

    ``num_proc`` defaults to ``spark.default.parallelism``; ``start_timeout`` (seconds for every task to start)
    to ``HOROVOD_SPARK_START_TIMEOUT``, else 600. ``env`` adds variables to the ranks' environment; the ranks'
    output goes to ``stdout``/``stderr`` (default: this process's) with ``[rank]<stdout>:`` prefixes;
    ``executable`` is the Python that runs each rank (default: the executors' Python); ``nics`` names the network
    interface the tasks reach the driver and each other on.

    Raises HorovodSparkError (a RuntimeError naming the rank, its executor and the traceback) when a rank
    failed, RuntimeError when the tasks did not start within ``start_timeout`` or Spark failed the job, and
    NotImplementedError for ``use_mpi=True``. No rank process is left running in any case.
    """
    check_controller(use_mpi, use_gloo, extra_mpi_args)
    sc = driver.spark_context()
    num_proc = int(num_proc) if num_proc else sc.defaultParallelism
    timeout = driver.start_timeout_seconds(start_timeout)
    started_at = time.monotonic()
    driver.wait_for_slots(sc, num_proc, timeout, "horovod.spark.run")
    call_args, call_kwargs = tuple(args), dict(kwargs or {})

    def wrapped_fn():
        return fn(*call_args, **call_kwargs)

    with RendezvousServer(verbose) as rendezvous:
        store = rendezvous.store
        store.put(run_func.FUNC_SCOPE, run_func.FUNC_KEY, run_func.encode_function(wrapped_fn))
        driver.forward_output(store, stdout, stderr, prefix_output_with_timestamp)
        addr = driver.driver_address(sc, nics)
        settings = Settings(num_proc=num_proc, hosts="", start_timeout=timeout, nics=list(nics) if nics else None)
        variables = job_env(addr, rendezvous.port, settings)
        task_fn = make_task_fn(addr, rendezvous.port, rendezvous.secret, variables, env, executable, timeout)
        rdd = sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(task_fn)
        job = driver.SparkJob(sc, rdd.collect, f"Horovod job with {num_proc} ranks").start()
        if verbose:
            log.info("horovod.spark.run: %d ranks in Spark job group %s, rendezvous at %s:%d", num_proc,
                     job.group, addr, rendezvous.port)
        try:
            _supervise(job, store, num_proc, timeout - (time.monotonic() - started_at))
        finally:
            job.cancel()
        return run_func.collect_results(store, num_proc)


def _supervise(job: driver.SparkJob, store, num_proc: int, start_timeout: float) -> None:
    """Wait for the job; raise the root failure (after the other ranks had a moment to report theirs), a start
    timeout, or Spark's own error."""
    deadline = time.monotonic() + max(start_timeout, 1.0)
    first_failure: Optional[float] = None
    while not job.done.wait(0.1):
        failed = failures.failed_ranks(store)
        if failed:
            first_failure = first_failure or time.monotonic()
            reported = len(store.items(protocol.EXIT_SCOPE))
            if reported >= num_proc or time.monotonic() - first_failure > FAILURE_SETTLE_SECONDS:
                break
        started = len(store.items(protocol.TASKS_SCOPE))
        if started < num_proc and time.monotonic() > deadline:
            raise RuntimeError(
                f"horovod.spark.run: timed out waiting for Spark tasks to start: {started} of {num_proc} started "
                f"within start_timeout={start_timeout:.0f}s. Please check that you have enough resources to run "
                "all Horovod processes (one Spark task slot per rank, all at once), or raise start_timeout "
                "(HOROVOD_SPARK_START_TIMEOUT).")
    if failures.lost_ranks(store):
        job.done.wait(FAILURE_SETTLE_SECONDS)       # Spark's account of the lost task
    spark_error = job.error_summary() if job.error is not None else None
    error = failures.root_failure(store, spark_error=spark_error, spark_partition=driver.failed_partition(job.error))
    if error is not None:
        raise error
    if job.error is not None:
        raise RuntimeError(f"horovod.spark.run: the Spark job failed: {job.error_summary()}") from None
