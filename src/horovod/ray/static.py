"""A fixed-size Horovod job on Ray: the workers of one placement group, rendezvousing through the driver.

The driver runs the job's authenticated rendezvous store (:class:`horovod.runner.rendezvous.RendezvousServer`);
each worker actor gets the same environment ``horovodrun`` gives a rank (:func:`horovod.runner.gloo_run.slot_env`
and :func:`~horovod.runner.gloo_run.job_env`, plus the job secret, sent as a Ray method argument), so that
``hvd.init()`` inside the actor works unchanged.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional

import ray

from horovod.common.wire import SECRET_ENV
from horovod.runner.common.util.settings import Settings
from horovod.runner.gloo_run import job_env, slot_env
from horovod.runner.rendezvous import RendezvousServer

from .callbacks import with_queue
from .errors import RayWorkerError, worker_failure
from .strategy import BaseStrategy, PlacedWorker

log = logging.getLogger(__name__)

FAILURE_GRACE_S = 2.0


def runner_settings(settings, num_proc: int) -> Settings:
    """The runner's settings for :func:`job_env` from a Ray job's settings."""
    return Settings(num_proc=num_proc, hosts="", verbose=settings.verbose, start_timeout=settings.start_timeout,
                    nics=settings.nics)


class StaticAdapter:
    """Starts the workers of a static job and runs functions on them."""

    def __init__(self, settings, strategy: BaseStrategy) -> None:
        self.settings = settings
        self.strategy = strategy
        self.workers: List[PlacedWorker] = []
        self._rendezvous: Optional[RendezvousServer] = None

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[list] = None,
              executable_kwargs: Optional[dict] = None, extra_env_vars: Optional[Dict[str, Any]] = None) -> None:
        """Reserve the resources, start the actors, give them their environment, and make their executables."""
        if self.workers:
            raise RuntimeError("RayExecutor.start() was called twice; call shutdown() before starting again.")
        began = time.monotonic()
        self._rendezvous = RendezvousServer(verbose=self.settings.verbose)
        port = self._rendezvous.start()
        try:
            self.workers = self.strategy.create_workers()
            self._rendezvous.init([w.slot for w in self.workers])
            common = job_env(ray.util.get_node_ip_address(), port,
                             runner_settings(self.settings, len(self.workers)))
            extra = {str(k): str(v) for k, v in (extra_env_vars or {}).items()}
            self._call_all(lambda w: w.actor.update_env_vars.remote(
                {**extra, **slot_env(w.slot), **common, SECRET_ENV: self._rendezvous.secret}), "update_env_vars")
            self._call_all(lambda w: w.actor.start_executable.remote(executable_cls, executable_args,
                                                                     executable_kwargs), "executable_cls")
        except BaseException:
            self.shutdown()
            raise
        log.info("RayExecutor started %d workers in %.1f s: %s", len(self.workers), time.monotonic() - began,
                 ", ".join(f"rank {w.slot.rank}@{w.slot.hostname}" for w in self.workers))

    def _require_started(self) -> None:
        if not self.workers:
            raise RuntimeError("The RayExecutor has no workers: call start() first (or again after a failure, "
                               "which stops them).")

    def _call_all(self, call: Callable[[PlacedWorker], Any], what: str) -> List[Any]:
        self._require_started()
        return self.gather([call(w) for w in self.workers], what)

    def run_remote(self, fn: Callable[..., Any], args: Optional[list] = None, kwargs: Optional[dict] = None,
                   queue: Optional[Any] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; the object refs, by rank."""
        self._require_started()
        args, kwargs = list(args or []), dict(kwargs or {})
        call = with_queue(lambda _executable: fn(*args, **kwargs), queue)
        return [w.actor.execute.remote(call) for w in self.workers]

    def run(self, fn: Callable[..., Any], args: Optional[list] = None, kwargs: Optional[dict] = None,
            queue: Optional[Any] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; the results by rank."""
        return self.gather(self.run_remote(fn, args, kwargs, queue), "the function")

    def execute(self, fn: Callable[[Any], Any], queue: Optional[Any] = None) -> List[Any]:
        """``fn(executable)`` on every worker; the results by rank."""
        call = with_queue(fn, queue)
        return self._call_all(lambda w: w.actor.execute.remote(call), "the function")

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on the worker of rank 0 only."""
        self._require_started()
        return self.gather([self.workers[0].actor.execute.remote(fn)], "the function")[0]

    def gather(self, refs: List[Any], what: str) -> List[Any]:
        """The values of ``refs`` (one per worker, in rank order). The first failure raises RayWorkerError naming
        its rank and node; when the other workers do not finish within :data:`FAILURE_GRACE_S` after it (they
        are likely waiting for the failed rank in a collective), every worker is stopped."""
        pending = {ref: index for index, ref in enumerate(refs)}
        results: List[Any] = [None] * len(refs)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                index = pending.pop(ref)
                try:
                    results[index] = ray.get(ref)
                except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as exc:
                    raise self._failed(exc, index, pending, what) from None
        return results

    def _failed(self, exc: BaseException, index: int, pending: Dict[Any, int], what: str) -> RayWorkerError:
        """The error for the first failure, ``exc`` of worker ``index``; the root cause instead when, within
        FAILURE_GRACE_S, another worker's actor is found dead: a rank that raised because a peer vanished
        (HorovodInternalError naming it) can reach the driver before Ray reports the dead actor."""
        done, still_running = ray.wait(list(pending), num_returns=len(pending), timeout=FAILURE_GRACE_S) \
            if pending else ([], [])
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as dead:
                exc, index = dead, pending[ref]
                break
            except ray.exceptions.RayTaskError:
                pass
        worker = self.workers[index]
        error = worker_failure(exc, worker.slot.rank, worker.slot.hostname, worker.node_id, what)
        if still_running or isinstance(exc, ray.exceptions.RayActorError):
            log.error("rank %d failed; stopping all %d workers", worker.slot.rank, len(self.workers))
            self.shutdown()
            error.args = (error.args[0] + "\nThe other workers were stopped; call start() to run again.",)
        return error

    def shutdown(self) -> None:
        """Stop the actors, release the placement group and stop the rendezvous (idempotent)."""
        workers, self.workers = self.workers, []
        for worker in workers:
            try:
                ray.kill(worker.actor, no_restart=True)
            except Exception as exc:  # already gone
                log.debug("could not kill the actor of rank %d: %s", worker.slot.rank, exc)
        self.strategy.shutdown()
        if self._rendezvous is not None:
            self._rendezvous.stop()
            self._rendezvous = None
