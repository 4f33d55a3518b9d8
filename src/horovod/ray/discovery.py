"""Ray-based host discovery for elastic jobs (upstream's ``horovod.ray.elastic_v2.RayHostDiscovery``)."""
from __future__ import annotations

from typing import Dict, Optional

from horovod.runner.elastic.discovery import HostDiscovery

from .nodes import slots_by_host


class RayHostDiscovery(HostDiscovery):
    """The live Ray nodes and how many workers each holds (its CPUs, and GPUs with ``use_gpu``, per slot).

    A node that dies or leaves the cluster disappears from the answer; a node that joins appears in it, so the
    elastic driver grows the job onto it (up to ``max_workers``).
    """

    def __init__(self, use_gpu: bool = False, cpus_per_slot: float = 1, gpus_per_slot: Optional[float] = 1) -> None:
        super().__init__()
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot or 1

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        return slots_by_host(self.cpus_per_slot, self.gpus_per_slot if self.use_gpu else None)
