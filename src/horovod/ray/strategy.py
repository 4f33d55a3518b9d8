"""Where a static job's workers go: a placement group, its actors, and their ranks (upstream's strategies).

- :class:`PackStrategy` (``num_workers``): one bundle per worker, packed onto as few nodes as possible (``PACK``).
- :class:`ColocatedStrategy` (``num_hosts`` and ``num_workers_per_host``): one bundle per host holding all that
  host's workers, every bundle on a different node (``STRICT_SPREAD``).

Both wait for the placement group at most ``placement_group_timeout_s`` and then fail with what the cluster has,
instead of waiting forever for resources that may never come. Ranks are assigned per node, so that local ranks,
local sizes and cross ranks describe the nodes the actors really landed on.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional

import ray
from ray.util.placement_group import get_current_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from horovod.runner.common.util.hosts import HostInfo, SlotInfo, get_host_assignments

from .nodes import cluster_cpus, host_name
from .worker import BaseHorovodWorker

log = logging.getLogger(__name__)

ACTOR_START_TIMEOUT_S = 120.0


@dataclasses.dataclass
class PlacedWorker:
    """A started worker actor, the node it runs on and its place in the job."""

    actor: Any
    slot: SlotInfo
    node_id: str
    pid: int


class BaseStrategy:
    """Reserves resources for the workers, starts them in the reservation and assigns their ranks."""

    strategy = "PACK"

    def __init__(self, settings, cpus_per_worker: float, use_gpu: bool, gpus_per_worker: Optional[float],
                 use_current_placement_group: bool = True) -> None:
        self.settings = settings
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.placement_group = None
        self._owns_group = False

    @property
    def num_workers(self) -> int:
        raise NotImplementedError

    def bundles(self) -> List[Dict[str, float]]:
        raise NotImplementedError

    def bundle_index(self, worker_index: int) -> int:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def _worker_resources(self, count: int = 1) -> Dict[str, float]:
        resources = {"CPU": self.cpus_per_worker * count}
        if self.gpus_per_worker:
            resources["GPU"] = self.gpus_per_worker * count
        return resources

    def reserve(self) -> None:
        """Get a placement group for the workers: the caller's (``use_current_placement_group``) or a new one,
        waiting for it at most ``placement_group_timeout_s``; TimeoutError saying what is missing."""
        current = get_current_placement_group() if self.use_current_placement_group else None
        if current is not None:
            self.placement_group = current
            return
        timeout = float(self.settings.placement_group_timeout_s)
        group = placement_group(self.bundles(), strategy=self.strategy)
        ready, _ = ray.wait([group.ready()], timeout=timeout)
        if not ready:
            remove_placement_group(group)
            raise TimeoutError(
                f"RayExecutor could not reserve {self.describe()} within placement_group_timeout_s={timeout:g} s: "
                f"the Ray cluster has {cluster_cpus()}. Ask for fewer workers or fewer CPUs per worker, add nodes "
                "to the cluster, or raise placement_group_timeout_s in RayExecutor.create_settings().")
        self.placement_group = group
        self._owns_group = True

    def create_workers(self, worker_cls=BaseHorovodWorker) -> List[PlacedWorker]:
        """Reserve the resources, start one actor per worker, and assign ranks per node (in rank order)."""
        self.reserve()
        remote_cls = ray.remote(worker_cls)
        actors = []
        for index in range(self.num_workers):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group,
                placement_group_bundle_index=-1 if not self._owns_group else self.bundle_index(index))
            actors.append(remote_cls.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                                             scheduling_strategy=strategy, max_restarts=0)
                          .remote(world_rank=index, world_size=self.num_workers))
        refs = [a.placement.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=ACTOR_START_TIMEOUT_S)
        if len(ready) < len(actors):
            for actor in actors:
                ray.kill(actor)
            raise TimeoutError(f"RayExecutor: {len(actors) - len(ready)} of {len(actors)} worker actors did not start "
                               f"within {ACTOR_START_TIMEOUT_S:.0f} s; check the Ray cluster's logs.")
        places = ray.get(refs)
        return assign_ranks(actors, places)

    def shutdown(self) -> None:
        """Release the placement group this strategy made (not a caller's)."""
        group, self.placement_group = self.placement_group, None
        if group is not None and self._owns_group:
            remove_placement_group(group)
        self._owns_group = False


def assign_ranks(actors: List[Any], places: List[Dict[str, Any]]) -> List[PlacedWorker]:
    """Ranks per node: the nodes in the order their first actor was started, each node's actors contiguous."""
    by_host: Dict[str, List[int]] = {}
    for index, place in enumerate(places):
        by_host.setdefault(host_name(place["node_ip"], place["node_id"]), []).append(index)
    slots = get_host_assignments([HostInfo(host, len(members)) for host, members in by_host.items()], len(actors))
    placed = []
    for slot in slots:
        index = by_host[slot.hostname][slot.local_rank]
        placed.append(PlacedWorker(actors[index], slot, places[index]["node_id"], places[index]["pid"]))
    return placed


class PackStrategy(BaseStrategy):
    """``num_workers`` workers of ``cpus_per_worker`` CPUs each, packed onto as few nodes as possible."""

    strategy = "PACK"

    def __init__(self, settings, num_workers: int, **kwargs) -> None:
        super().__init__(settings, **kwargs)
        self._num_workers = num_workers

    @property
    def num_workers(self) -> int:
        return self._num_workers

    def bundles(self) -> List[Dict[str, float]]:
        return [self._worker_resources() for _ in range(self._num_workers)]

    def bundle_index(self, worker_index: int) -> int:
        return worker_index

    def describe(self) -> str:
        return f"{self._num_workers} worker(s) with {self._worker_resources()} each (PACK)"


class ColocatedStrategy(BaseStrategy):
    """``num_hosts`` nodes with ``num_workers_per_host`` workers each, every host on a different node."""

    strategy = "STRICT_SPREAD"

    def __init__(self, settings, num_hosts: int, num_workers_per_host: int, **kwargs) -> None:
        super().__init__(settings, **kwargs)
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host

    @property
    def num_workers(self) -> int:
        return self.num_hosts * self.num_workers_per_host

    def bundles(self) -> List[Dict[str, float]]:
        return [self._worker_resources(self.num_workers_per_host) for _ in range(self.num_hosts)]

    def bundle_index(self, worker_index: int) -> int:
        return worker_index // self.num_workers_per_host

    def describe(self) -> str:
        return (f"{self.num_hosts} node(s) with {self._worker_resources(self.num_workers_per_host)} each for "
                f"{self.num_workers_per_host} worker(s) per node (STRICT_SPREAD)")
