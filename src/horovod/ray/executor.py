"""``RayExecutor``: Horovod workers as Ray actors (upstream's ``horovod.ray.runner.RayExecutor``).

.. code-block:: python

    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1)
    executor.start()
    results = executor.run(train_fn, kwargs={"epochs": 2})      # one result per rank
    executor.shutdown()

With ``num_workers`` the workers are packed onto as few nodes as possible; with ``num_hosts`` and
``num_workers_per_host`` each host gets its own node. With ``min_workers`` the job is elastic
(:mod:`horovod.ray.elastic`): workers that die are replaced and the job re-forms through ``hvd.elastic.run``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from .callbacks import run_with_callbacks
from .elastic import ElasticAdapter
from .settings import MiniSettings, create_settings
from .static import StaticAdapter
from .strategy import ColocatedStrategy, PackStrategy


class RayExecutor:
    """Runs Horovod jobs on a Ray cluster: one Ray actor per worker, the rendezvous in this (the driver) process."""

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        ssh_str: Optional[str] = None, placement_group_timeout_s: float = 100,
                        nics: Optional[List[str]] = None) -> MiniSettings:
        """The job's settings: ``timeout_s`` for the workers to meet at ``hvd.init()``,
        ``placement_group_timeout_s`` for the cluster to grant the workers' resources, ``nics`` to pin the
        interfaces the workers talk over."""
        return create_settings(timeout_s, ssh_identity_file, ssh_str, placement_group_timeout_s, nics)

    def __init__(self, settings: MiniSettings, num_workers: Optional[int] = None, num_hosts: Optional[int] = None,
                 num_workers_per_host: int = 1, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None, use_current_placement_group: bool = True,
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 reset_limit: Optional[int] = None, cooldown_range: Optional[Tuple[int, int]] = None,
                 elastic_timeout: float = 600, override_discovery: bool = True) -> None:
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker is set but use_gpu is False: pass use_gpu=True to give workers GPUs.")
        self.settings = settings
        self.num_workers, self.num_hosts, self.num_workers_per_host = num_workers, num_hosts, num_workers_per_host
        self.cpus_per_worker, self.use_gpu, self.gpus_per_worker = cpus_per_worker, use_gpu, gpus_per_worker
        self.elastic = min_workers is not None
        if self.elastic:
            if num_hosts is not None:
                raise ValueError("num_hosts does not apply to an elastic job (min_workers set): the job takes the "
                                 "slots the nodes offer, from min_workers up to max_workers.")
            self._adapter: Any = ElasticAdapter(
                settings, min_workers, max_workers, num_workers, cpus_per_worker, use_gpu, gpus_per_worker,
                reset_limit, cooldown_range, elastic_timeout, override_discovery)
            return
        if (num_workers is None) == (num_hosts is None):
            raise ValueError("Give RayExecutor either num_workers, or num_hosts (with num_workers_per_host); or "
                             "min_workers for an elastic job.")
        resources = dict(cpus_per_worker=cpus_per_worker, use_gpu=use_gpu, gpus_per_worker=gpus_per_worker,
                         use_current_placement_group=use_current_placement_group)
        if num_workers is not None:
            strategy: Any = PackStrategy(settings, num_workers, **resources)
        else:
            strategy = ColocatedStrategy(settings, num_hosts, num_workers_per_host, **resources)
        self._adapter = StaticAdapter(settings, strategy)

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[list] = None,
              executable_kwargs: Optional[dict] = None, extra_env_vars: Optional[Dict[str, Any]] = None) -> None:
        """Start the workers (static mode), each with ``executable_cls(*executable_args, **executable_kwargs)``
        for :meth:`execute`, and ``extra_env_vars`` in their environment. Raises TimeoutError when the cluster
        cannot grant the resources within ``placement_group_timeout_s``."""
        self._adapter.start(executable_cls, executable_args, executable_kwargs, extra_env_vars)

    def run(self, fn: Callable[..., Any], args: Optional[list] = None, kwargs: Optional[dict] = None,
            callbacks: Optional[List[Callable[[Any], None]]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; the results by rank. ``callbacks`` get every value rank 0 hands
        to :func:`horovod.ray.log_to_driver`. A failure raises :class:`horovod.ray.RayWorkerError` naming the
        rank and its node."""
        return run_with_callbacks(lambda queue: self._adapter.run(fn, args, kwargs, queue=queue), callbacks)

    def run_remote(self, fn: Callable[..., Any], args: Optional[list] = None,
                   kwargs: Optional[dict] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker, without waiting: the Ray object refs, by rank."""
        return self._static("run_remote").run_remote(fn, args, kwargs)

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable[[Any], None]]] = None) -> List[Any]:
        """``fn(executable)`` on every worker (the object ``start(executable_cls=...)`` made); results by rank."""
        adapter = self._static("execute")
        return run_with_callbacks(lambda queue: adapter.execute(fn, queue=queue), callbacks)

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on the worker of rank 0 only; its result."""
        return self._static("execute_single").execute_single(fn)

    def shutdown(self) -> None:
        """Stop the workers and release their resources (idempotent)."""
        self._adapter.shutdown()

    def _static(self, what: str) -> StaticAdapter:
        if self.elastic:
            raise NotImplementedError(f"RayExecutor.{what} is not available in elastic mode (min_workers set), as "
                                      "upstream: use run(fn).")
        return self._adapter
