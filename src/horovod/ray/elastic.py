"""Elastic Horovod on Ray: the project's elastic driver, with Ray actors as its workers and Ray's nodes as hosts.

:class:`ElasticAdapter` is what ``RayExecutor(..., min_workers=...)`` runs (upstream's ``elastic_v2``): the driver
(:class:`horovod.runner.elastic.driver.ElasticDriver`, the one ``horovodrun --min-np`` uses) polls
:class:`~horovod.ray.discovery.RayHostDiscovery`, places one actor per slot on its node, re-forms the job when an
actor dies (its node is blacklisted, for ``cooldown_range`` when given) and replaces it from the nodes still
offering slots. The function uses ``hvd.elastic.run`` exactly as under ``horovodrun``.
:class:`ElasticRayExecutor` is upstream's older, deprecated face of the same thing.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import ray

from horovod.common.elastic_rendezvous import WORKER_ID_ENV, slot_key
from horovod.common.wire import SECRET_ENV
from horovod.runner.common.util.hosts import SlotInfo
from horovod.runner.elastic.discovery import HostDiscovery
from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.gloo_run import job_env, slot_env
from horovod.runner.process import JobFailedError
from horovod.runner.rendezvous import RendezvousServer

from .callbacks import run_with_callbacks, with_queue
from .discovery import RayHostDiscovery
from .elastic_worker import RayWorkerHandle
from .errors import RayWorkerError
from .nodes import node_ids_by_host
from .settings import ElasticRaySettings, write_identity
from .static import runner_settings
from .worker import BaseHorovodWorker

log = logging.getLogger(__name__)


class ElasticAdapter:
    """Runs a function as an elastic job on the Ray cluster, from ``min_workers`` up to ``max_workers`` workers."""

    def __init__(self, settings, min_workers: int, max_workers: Optional[int] = None,
                 num_workers: Optional[int] = None, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None, reset_limit: Optional[int] = None,
                 cooldown_range: Optional[Tuple[int, int]] = None, elastic_timeout: float = 600,
                 override_discovery: bool = True) -> None:
        if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
            raise ValueError(f"min_workers={min_workers} and max_workers={max_workers}: need 1 <= min_workers <= "
                             "max_workers.")
        self.settings = settings
        self.min_workers, self.max_workers = min_workers, max_workers
        self.num_workers = max(num_workers or min_workers, min_workers)
        self.reset_limit, self.cooldown_range, self.elastic_timeout = reset_limit, cooldown_range, elastic_timeout
        self.resources: Dict[str, float] = {"num_cpus": cpus_per_worker}
        if use_gpu:
            self.resources["num_gpus"] = gpus_per_worker or 1
        given = getattr(settings, "discovery", None)
        self.discovery: HostDiscovery = given if given is not None and not override_discovery else \
            RayHostDiscovery(use_gpu, cpus_per_worker, gpus_per_worker)
        self.extra_env: Dict[str, str] = {}
        self.handles: Dict[str, RayWorkerHandle] = {}
        self._started = False

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[list] = None,
              executable_kwargs: Optional[dict] = None, extra_env_vars: Optional[Dict[str, Any]] = None) -> None:
        """Remember the workers' extra environment; the workers themselves start with each ``run``."""
        if executable_cls is not None:
            raise ValueError("RayExecutor in elastic mode (min_workers set) takes no executable_cls: workers come "
                             "and go, so use run(fn) with a function that builds what it needs.")
        self.extra_env = {str(k): str(v) for k, v in (extra_env_vars or {}).items()}
        self._started = True

    def run(self, fn: Callable[..., Any], args: Optional[list] = None, kwargs: Optional[dict] = None,
            queue: Optional[Any] = None) -> List[Any]:
        """Run ``fn(*args, **kwargs)`` as an elastic job until it finishes; the last round's results by rank.

        Raises RayWorkerError when the job fails (naming the first failed rank and its node), RuntimeError when
        the reset limit or the elastic timeout is reached.
        """
        if not self._started:
            raise RuntimeError("The RayExecutor is not started: call start() first.")
        args, kwargs = list(args or []), dict(kwargs or {})
        func = with_queue(_bind(fn, args, kwargs), queue)
        rendezvous = RendezvousServer(verbose=self.settings.verbose)
        port = rendezvous.start()
        driver = ElasticDriver(rendezvous, self.discovery, self.min_workers, self.max_workers,
                               timeout=self.elastic_timeout, reset_limit=self.reset_limit,
                               cooldown_range=self.cooldown_range, verbose=self.settings.verbose)
        common = {**job_env(ray.util.get_node_ip_address(), port, runner_settings(self.settings, self.num_workers)),
                  "HOROVOD_ELASTIC": "1"}
        actor_cls = ray.remote(BaseHorovodWorker)
        self.handles = {}

        def create_worker(slot: SlotInfo, events, worker_id: str) -> RayWorkerHandle:
            node_id = node_ids_by_host().get(slot.hostname)
            if node_id is None:
                raise RuntimeError(f"the Ray node {slot.hostname} left the cluster before its worker started")
            env = {**self.extra_env, **slot_env(slot), **common, WORKER_ID_ENV: worker_id,
                   SECRET_ENV: rendezvous.secret}
            log.info("starting a worker on %s[%d] as rank %d of %d", slot.hostname, slot.local_rank, slot.rank,
                     slot.size)
            handle = RayWorkerHandle(actor_cls, slot, node_id, env, func, events, self.resources)
            self.handles[slot_key(slot.hostname, slot.local_rank)] = handle
            return handle

        try:
            final = driver.run(self.num_workers, create_worker)
        except JobFailedError as exc:
            failure = exc.failure
            raise RayWorkerError(f"The elastic job on Ray failed.\n{exc}", failure.rank, failure.hostname) from None
        finally:
            rendezvous.stop()
            for handle in self.handles.values():
                handle.kill()
        return self._results(final)

    def _results(self, final: List[SlotInfo]) -> List[Any]:
        by_rank = {}
        for slot in final:
            handle = self.handles.get(slot_key(slot.hostname, slot.local_rank))
            if handle is not None and handle.result is not None:
                by_rank[handle.result["rank"]] = handle.result["value"]
        return [by_rank[rank] for rank in sorted(by_rank)]

    def shutdown(self) -> None:
        for handle in self.handles.values():
            handle.kill()
        self.handles = {}
        self._started = False


def _bind(fn: Callable[..., Any], args: list, kwargs: dict) -> Callable[[], Any]:
    return lambda: fn(*args, **kwargs)


class ElasticRayExecutor:
    """Upstream's elastic executor, deprecated since Horovod 0.25: use ``RayExecutor(settings, min_workers=...)``.

    ``create_settings(...)``, ``start()`` and ``run(worker_fn, callbacks=None)`` behave as upstream's; it runs on
    the same elastic machinery as ``RayExecutor``.
    """

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: Optional[int] = None, reset_limit: Optional[int] = None,
                        elastic_timeout: float = 600, timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        nics: Optional[List[str]] = None, ssh_str: Optional[str] = None,
                        cooldown_range: Optional[Tuple[int, int]] = None, verbose: int = 1,
                        **kwargs: Any) -> ElasticRaySettings:
        """The settings of an elastic job (upstream's ``ElasticRayExecutor.create_settings``)."""
        write_identity(ssh_identity_file, ssh_str)
        return ElasticRaySettings(nics=list(nics) if nics else None, verbose=verbose,
                                  ssh_identity_file=ssh_identity_file, timeout_s=timeout_s, min_num_proc=min_num_proc,
                                  max_num_proc=max_num_proc, reset_limit=reset_limit, cooldown_range=cooldown_range,
                                  elastic_timeout=elastic_timeout)

    def __init__(self, settings: ElasticRaySettings, use_gpu: bool = False, cpus_per_slot: float = 1,
                 gpus_per_slot: Optional[float] = None, env_vars: Optional[Dict[str, Any]] = None,
                 override_discovery: bool = True) -> None:
        warnings.warn("ElasticRayExecutor is deprecated (as in upstream Horovod since 0.25): use "
                      "RayExecutor(settings, min_workers=..., max_workers=...) instead.", DeprecationWarning,
                      stacklevel=2)
        self.settings = settings
        self.env_vars = env_vars
        self._adapter = ElasticAdapter(
            settings, settings.min_num_proc, settings.max_num_proc, cpus_per_worker=cpus_per_slot, use_gpu=use_gpu,
            gpus_per_worker=gpus_per_slot, reset_limit=settings.reset_limit, cooldown_range=settings.cooldown_range,
            elastic_timeout=settings.elastic_timeout, override_discovery=override_discovery)

    def start(self) -> None:
        """Prepare the job (the workers start with ``run``)."""
        self._adapter.start(extra_env_vars=self.env_vars)

    def run(self, worker_fn: Callable[[], Any], callbacks: Optional[List[Callable[[Any], None]]] = None) -> List[Any]:
        """Run ``worker_fn`` as an elastic job; its results by rank, from the workers of the last round."""
        return run_with_callbacks(lambda queue: self._adapter.run(worker_fn, queue=queue), callbacks)
