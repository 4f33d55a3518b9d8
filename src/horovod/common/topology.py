"""Who am I: rank, size and host layout from the launcher's environment.

Each launcher environment has one small detector class with the same two methods (the style of
``jax/_src/clusters``). :func:`detect` asks them in turn; the first present one wins, and with no launcher the
process is rank 0 of a job of size 1.
"""
from __future__ import annotations

import dataclasses
import os
import re
import socket
from typing import List, Optional

from horovod.common import config


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this process sits in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    source: str

    def validate(self) -> Topology:
        """Raise ValueError naming the variables when the layout is inconsistent."""
        if not (0 <= self.rank < self.size):
            raise ValueError(f"{self.source}: rank {self.rank} is outside the job size {self.size}.")
        if not (0 <= self.local_rank < self.local_size <= self.size):
            raise ValueError(
                f"{self.source}: local rank {self.local_rank} / local size {self.local_size} do not fit size "
                f"{self.size}."
            )
        if not (0 <= self.cross_rank < self.cross_size):
            raise ValueError(f"{self.source}: cross rank {self.cross_rank} / cross size {self.cross_size}.")
        return self


def _int(env: dict, name: str) -> Optional[int]:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer; check the launcher's environment.") from None


class Detector:
    """Interface: ``is_present`` and ``topology`` read one launcher's variables."""

    name = "detector"

    def is_present(self, env: dict) -> bool:
        raise NotImplementedError

    def topology(self, env: dict) -> Topology:
        raise NotImplementedError


def _knob(env: dict, name: str) -> Optional[int]:
    """A ``HOROVOD_*`` topology knob from ``env`` through :mod:`horovod.common.config`; None when unset."""
    return config.get(name, env) if config.is_set(name, env) else None


def _hostname(env: dict) -> str:
    return config.get("HOROVOD_HOSTNAME", env) or socket.gethostname()


class HorovodLauncher(Detector):
    """Our own ``horovodrun`` (and upstream's Gloo launcher): ``HOROVOD_RANK`` and friends."""

    name = "horovodrun"

    def is_present(self, env: dict) -> bool:
        return _knob(env, "HOROVOD_RANK") is not None and _knob(env, "HOROVOD_SIZE") is not None

    def topology(self, env: dict) -> Topology:
        rank, size = _knob(env, "HOROVOD_RANK"), _knob(env, "HOROVOD_SIZE")
        local_rank = _knob(env, "HOROVOD_LOCAL_RANK")
        local_size = _knob(env, "HOROVOD_LOCAL_SIZE")
        if local_rank is None or local_size is None:
            local_rank, local_size = rank, size
        cross_rank = _knob(env, "HOROVOD_CROSS_RANK")
        cross_size = _knob(env, "HOROVOD_CROSS_SIZE")
        if cross_rank is None or cross_size is None:
            cross_rank, cross_size = 0, 1
        hostname = _hostname(env)
        return Topology(rank, size, local_rank, local_size, cross_rank, cross_size, hostname, self.name)


class OpenMPI(Detector):
    """Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_*``."""

    name = "Open MPI"

    def is_present(self, env: dict) -> bool:
        return "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env

    def topology(self, env: dict) -> Topology:
        rank = _int(env, "OMPI_COMM_WORLD_RANK")
        size = _int(env, "OMPI_COMM_WORLD_SIZE")
        local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK")
        local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
        if local_rank is None or local_size is None:
            local_rank, local_size = rank, size
        node_rank = _int(env, "OMPI_COMM_WORLD_NODE_RANK")
        return _with_cross(rank, size, local_rank, local_size, node_rank, self.name)


class PMI(Detector):
    """MPICH / Intel MPI (Hydra) and other PMI launchers: ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``."""

    name = "PMI"

    def is_present(self, env: dict) -> bool:
        return "PMI_RANK" in env and "PMI_SIZE" in env

    def topology(self, env: dict) -> Topology:
        rank, size = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
        local_rank = _int(env, "MPI_LOCALRANKID")
        local_size = _int(env, "MPI_LOCALNRANKS")
        if local_rank is None or local_size is None:
            local_rank, local_size = rank, size
        return _with_cross(rank, size, local_rank, local_size, None, self.name)


class Slurm(Detector):
    """Slurm's ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``."""

    name = "Slurm"

    def is_present(self, env: dict) -> bool:
        return "SLURM_PROCID" in env and ("SLURM_NTASKS" in env or "SLURM_NPROCS" in env) and "SLURM_STEP_ID" in env

    def topology(self, env: dict) -> Topology:
        rank = _int(env, "SLURM_PROCID")
        size = _int(env, "SLURM_NTASKS") or _int(env, "SLURM_NPROCS")
        local_rank = _int(env, "SLURM_LOCALID") or 0
        node_id = _int(env, "SLURM_NODEID") or 0
        counts = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", ""))
        if counts is None or node_id >= len(counts):
            return _with_cross(rank, size, local_rank, size, node_id, self.name)
        # Cross ranks connect the ranks with the same local rank: the nodes running at least local_rank + 1 tasks.
        nodes_with_slot = [n for n, count in enumerate(counts) if count > local_rank]
        return Topology(rank, size, local_rank, counts[node_id], nodes_with_slot.index(node_id),
                        len(nodes_with_slot), socket.gethostname(), self.name)


def expand_slurm_counts(spec: str) -> List[int]:
    """Expand Slurm's compressed per-node counts (``2(x3),1``) to ``[2, 2, 2, 1]``; ValueError when unreadable."""
    counts: List[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not match:
            raise ValueError(f"Cannot read the Slurm task counts {spec!r}: {part!r} is not N or N(xM).")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _tasks_per_node(spec: str) -> Optional[List[int]]:
    """Slurm's tasks-per-node list expanded (:func:`expand_slurm_counts`), or None if empty or unparsable."""
    try:
        return expand_slurm_counts(spec) or None
    except ValueError:
        return None


def _with_cross(rank, size, local_rank, local_size, node_rank, source) -> Topology:
    # Launchers without cross variables: assume homogeneous blocks of local_size ranks per host.
    cross_size = max(1, size // local_size) if local_size else 1
    cross_rank = node_rank if node_rank is not None else rank // max(local_size, 1)
    cross_rank = min(cross_rank, cross_size - 1)
    return Topology(rank, size, local_rank, local_size, cross_rank, cross_size,
                    socket.gethostname(), source)


DETECTORS = [HorovodLauncher(), OpenMPI(), PMI(), Slurm()]


def detect(env: Optional[dict] = None) -> Topology:
    """The topology from the first launcher environment present, or a single process."""
    env = dict(os.environ) if env is None else env
    for detector in DETECTORS:
        if detector.is_present(env):
            return detector.topology(env).validate()
    return Topology(0, 1, 0, 1, 0, 1, _hostname(env), "single process")
