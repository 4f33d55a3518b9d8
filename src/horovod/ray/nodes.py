"""The Ray nodes as Horovod sees them: a host name per node, and the slots each live node offers.

Several Ray nodes may share one machine (and one IP address: ``ray.cluster_utils.Cluster``, or containers on a
host network). Each node must still be its own host for Horovod, or local ranks and local sizes would be wrong,
so a node's host name is its IP address followed by the start of its node id: ``10.0.0.5-3f2a9c1d``. It is what
the workers get as ``HOROVOD_HOSTNAME``; the data plane only compares host names, it never resolves them.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import ray

NODE_ID_CHARS = 8


def host_name(node_ip: str, node_id: str) -> str:
    """Horovod's host name for the Ray node ``node_id`` at ``node_ip``."""
    return f"{node_ip}-{node_id[:NODE_ID_CHARS]}"


def alive_nodes() -> List[dict]:
    """The live nodes of the connected Ray cluster, in the order Ray lists them (``ray.nodes()`` records)."""
    return [node for node in ray.nodes() if node.get("Alive")]


def node_slots(node: dict, cpus_per_slot: float, gpus_per_slot: Optional[float]) -> int:
    """How many workers of ``cpus_per_slot`` CPUs (and ``gpus_per_slot`` GPUs, when given) the node holds."""
    resources = node.get("Resources", {})
    slots = int(resources.get("CPU", 0) // cpus_per_slot) if cpus_per_slot else 1 << 30
    if gpus_per_slot:
        slots = min(slots, int(resources.get("GPU", 0) // gpus_per_slot))
    return max(slots, 0)


def slots_by_host(cpus_per_slot: float, gpus_per_slot: Optional[float] = None) -> Dict[str, int]:
    """``{host name: slots}`` for every live node with at least one slot (upstream's ``RayHostDiscovery``)."""
    found = {}
    for node in alive_nodes():
        slots = node_slots(node, cpus_per_slot, gpus_per_slot)
        if slots > 0:
            found[host_name(node["NodeManagerAddress"], node["NodeID"])] = slots
    return found


def node_ids_by_host() -> Dict[str, str]:
    """``{host name: Ray node id}`` for the live nodes (to place a worker on the host the driver chose)."""
    return {host_name(node["NodeManagerAddress"], node["NodeID"]): node["NodeID"] for node in alive_nodes()}


def cluster_cpus() -> str:
    """The live nodes' CPUs, for error messages: ``2 nodes with 2, 2 CPUs``."""
    cpus = [node.get("Resources", {}).get("CPU", 0) for node in alive_nodes()]
    return f"{len(cpus)} node(s) with {', '.join(f'{c:g}' for c in cpus) or 'no'} CPUs"
