"""``horovod.spark.run_elastic``: an elastic Horovod job on Spark tasks, driven by the project's elastic driver.

The driver runs ``max_num_proc`` ordinary (not barrier) Spark tasks, each of which hosts workers on command
(:mod:`horovod.spark.elastic_task`). :class:`horovod.runner.elastic.driver.ElasticDriver` runs the job as under
``horovodrun``, with two Spark-specific parts: the discovery of hosts from the live Spark tasks and the
workers that run in them (:mod:`horovod.spark.elastic_workers`).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from horovod.runner import run_func
from horovod.runner.common.util.settings import Settings
from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.gloo_run import job_env
from horovod.runner.process import JobFailedError
from horovod.runner.rendezvous import RendezvousServer

from . import driver, protocol
from .elastic_task import make_elastic_task_fn
from .elastic_workers import SparkTaskDiscovery, SparkTaskWorkers

log = logging.getLogger("horovod.spark")  # a named channel: see horovod.common.logging_setup

WHAT = "horovod.spark.run_elastic"


class ElasticSparkJob:
    """The arguments of one ``run_elastic`` call; :meth:`run` runs it."""

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict, sizes: Tuple[int, int, int],
                 start_timeout: Optional[float], elastic_timeout: Optional[float], reset_limit: Optional[int],
                 env: Optional[Dict[str, str]], verbose: int, nics: Optional[Sequence[str]]) -> None:
        self._fn = fn
        self._args, self._kwargs = args, kwargs
        self.num_proc, self.min_np, self.max_np = sizes
        self._start_timeout = driver.start_timeout_seconds(start_timeout)
        self._elastic_timeout = elastic_timeout
        self._reset_limit = reset_limit
        self._env = env
        self._verbose = verbose
        self._nics = list(nics) if nics else None

    def _function(self) -> Callable[[], Any]:
        fn, args, kwargs = self._fn, self._args, self._kwargs
        return lambda: fn(*args, **kwargs)

    def run(self, stdout=None, stderr=None, prefix_timestamp: bool = False) -> List[Any]:
        """Run the job to its end; the results by rank of its last round."""
        sc = driver.spark_context()
        driver.wait_for_slots(sc, self.num_proc, self._start_timeout, WHAT)
        with RendezvousServer(self._verbose) as rendezvous:
            store = rendezvous.store
            store.put(run_func.FUNC_SCOPE, run_func.FUNC_KEY, run_func.encode_function(self._function()))
            driver.forward_output(store, stdout, stderr, prefix_timestamp)
            addr = driver.driver_address(sc, self._nics)
            settings = Settings(num_proc=self.num_proc, hosts="", start_timeout=self._start_timeout, nics=self._nics)
            variables = {**job_env(addr, rendezvous.port, settings), "HOROVOD_ELASTIC": "1"}
            discovery = SparkTaskDiscovery(store)
            workers = SparkTaskWorkers(store, discovery, variables)
            task_fn = make_elastic_task_fn(addr, rendezvous.port, rendezvous.secret, self._env, self._start_timeout)
            rdd = sc.parallelize(range(self.max_np), self.max_np).mapPartitions(task_fn)
            job = driver.SparkJob(sc, rdd.collect, f"Elastic Horovod job, {self.min_np}-{self.max_np} ranks").start()
            try:
                self._wait_for_tasks(discovery, job)
                elastic = ElasticDriver(rendezvous, discovery, self.min_np, self.max_np, timeout=self._elastic_timeout,
                                        reset_limit=self._reset_limit, verbose=self._verbose)
                try:
                    slots = elastic.run(self.num_proc, workers.create_worker)
                except JobFailedError as exc:
                    raise_failure(store, exc)
            finally:
                store.put(protocol.DONE_SCOPE, protocol.DONE_KEY, b"1")
                workers.stop()
                job.done.wait(10.0)
                job.cancel()
            return run_func.collect_results(store, len(slots))

    def _wait_for_tasks(self, discovery: SparkTaskDiscovery, job: driver.SparkJob) -> None:
        deadline = time.monotonic() + self._start_timeout
        while len(discovery.live_tasks()) < self.num_proc:
            if job.done.is_set():
                raise RuntimeError(f"{WHAT}: the Spark job ended before its tasks started: {job.error_summary()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{WHAT}: timed out waiting for Spark tasks to start: {len(discovery.live_tasks())} of "
                    f"{self.num_proc} started within start_timeout={self._start_timeout:.0f}s. Please check that "
                    "you have enough resources to run all Horovod processes, or raise start_timeout "
                    "(HOROVOD_SPARK_START_TIMEOUT).")
            time.sleep(0.1)


def resolve_sizes(num_proc: Optional[int], min_num_proc: Optional[int], max_num_proc: Optional[int],
                  min_np: Optional[int], max_np: Optional[int], default: int) -> tuple:
    """``(num_proc, min_np, max_np)`` with upstream's aliases and defaults (min and max default to num_proc)."""
    for long, short, name in ((min_num_proc, min_np, "min_num_proc"), (max_num_proc, max_np, "max_num_proc")):
        if long is not None and short is not None and long != short:
            raise ValueError(f"{name}={long} and its alias={short} disagree; give only one of them.")
    num_proc = int(num_proc) if num_proc else default
    low = min_num_proc if min_num_proc is not None else (min_np if min_np is not None else num_proc)
    high = max_num_proc if max_num_proc is not None else (max_np if max_np is not None else num_proc)
    if not 1 <= low <= num_proc <= high:
        raise ValueError(f"run_elastic needs 1 <= min_num_proc ({low}) <= num_proc ({num_proc}) <= max_num_proc "
                         f"({high}).")
    return num_proc, int(low), int(high)


def run_elastic(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Dict[str, Any]] = None,
                num_proc: Optional[int] = None, min_num_proc: Optional[int] = None,
                max_num_proc: Optional[int] = None, start_timeout: Optional[float] = None,
                elastic_timeout: Optional[float] = None, reset_limit: Optional[int] = None,
                env: Optional[Dict[str, str]] = None, stdout=None, stderr=None, verbose: int = 1,
                nics: Optional[Sequence[str]] = None, prefix_output_with_timestamp: bool = False,
                min_np: Optional[int] = None, max_np: Optional[int] = None) -> List[Any]:
    """Run the elastic function ``fn(*args, **kwargs)`` (it uses ``hvd.elastic.run`` and a State) on Spark tasks,
    from ``num_proc`` ranks, between ``min_num_proc`` and ``max_num_proc`` (both default to ``num_proc``, which
    defaults to ``spark.default.parallelism``); returns the results by rank of the last round.

    A worker whose rank fails, or whose task or executor is lost, ends the round; the job re-forms with the
    survivors (its executor is left out) and grows again onto executors Spark starts later. Raises
    RankFunctionError or JobFailedError when the job fails, RuntimeError when ``num_proc`` tasks do not start
    within ``start_timeout``, the reset limit is reached, or fewer than ``min_num_proc`` slots remain for
    ``elastic_timeout`` seconds.
    """
    sizes = resolve_sizes(num_proc, min_num_proc, max_num_proc, min_np, max_np,
                          int(num_proc) if num_proc else _parallelism())
    job = ElasticSparkJob(fn, tuple(args), dict(kwargs or {}), sizes, start_timeout, elastic_timeout, reset_limit,
                          env, verbose, nics)
    return job.run(stdout, stderr, prefix_output_with_timestamp)


def _parallelism() -> int:
    from .driver import spark_context

    return spark_context().defaultParallelism


def raise_failure(store, exc: JobFailedError) -> None:
    """Raise the function's own error for the failed rank when it reported one, else ``exc``."""
    error = run_func.failure_for_rank(store, exc.failure.rank, exc.failure.hostname)
    if error is not None:
        raise error from error.__cause__
    raise exc
