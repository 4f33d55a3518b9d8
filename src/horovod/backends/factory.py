"""Choosing the data plane for a job from where its ranks live, whether it runs on MPI, and
HOROVOD_CPU_OPERATIONS."""
from __future__ import annotations

import hashlib
import logging
import sys
from typing import Tuple, Union

from horovod.backends.base import Backend
from horovod.backends.comm import Comm
from horovod.backends.hierarchical import HierarchicalBackend
from horovod.backends.local import LocalBackend
from horovod.backends.mesh import Generation, Mesh
from horovod.backends.mpi import MPIBackend
from horovod.backends.routed import RoutedBackend
from horovod.backends.shm import ShmBackend
from horovod.backends.tcp import TcpBackend
from horovod.common import config
from horovod.common.mpi_context import MPIContext, SubsetMPI

log = logging.getLogger(__name__)

CHOICES = ("", "SHM", "TCP", "GLOO", "MPI", "AUTO")


def make_backend(mesh: Mesh, job: str, generation: Generation,
                 mpi: Union[MPIContext, SubsetMPI, None] = None) -> Tuple[Backend, str]:
    """The backend for this rank and a sentence saying why it was chosen.

    ``mpi`` is the job's MPI context when it started on MPI (mpirun, ``horovodrun --mpi``, ``init(comm=...)``),
    or a process set's part of it (``mesh`` is then the set's own).
    """
    size, rank = mesh.size, mesh.rank
    if size == 1:
        return LocalBackend(), "a single rank needs no data plane"
    choice = config.get("HOROVOD_CPU_OPERATIONS")
    if choice not in CHOICES:
        raise ValueError(f"HOROVOD_CPU_OPERATIONS={choice.lower()!r} is not a data plane; choose shm, tcp, mpi "
                         "(or gloo, which means the built-in choice).")
    if choice == "MPI":
        _check_mpi_usable(mpi)
    comm = Comm(rank, list(range(size)), mesh.data, mesh.hosts)
    comm.set_spin(config.get("HOROVOD_SPIN_MICROSECONDS"))
    if choice == "TCP":
        return TcpBackend(comm), "tcp, forced by HOROVOD_CPU_OPERATIONS=tcp"
    hosts = mesh.hosts
    by_host = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    local = by_host[hosts[rank]]
    chunk = config.get("HOROVOD_SHM_CHUNK_BYTES")
    host_tag = hashlib.sha256(hosts[rank].encode()).hexdigest()[:8]
    tag = f"{job}-{generation}-{host_tag}"
    mpi_usable = mpi is not None and mpi.threads_supported
    if choice == "MPI":
        return MPIBackend(mpi.comm), f"mpi ({mpi.library}), forced by HOROVOD_CPU_OPERATIONS=mpi"
    if len(by_host) == 1:
        shm = ShmBackend(comm, tag, chunk)
        if mpi is None or choice == "SHM":
            return shm, "shm: every rank is on this host" + (", forced by HOROVOD_CPU_OPERATIONS=shm"
                                                              if choice == "SHM" else "")
        if not mpi_usable:
            return shm, f"shm: every rank is on this host; MPI is not used for data because {_no_threads_reason(mpi)}"
        reduce_max = _limit(config.get("HOROVOD_MPI_REDUCE_MAX_BYTES"))
        move_max = _limit(config.get("HOROVOD_MPI_MOVE_MAX_BYTES"))
        if reduce_max == 0 and move_max == 0:
            return shm, "shm: every rank is on this host (HOROVOD_MPI_*_MAX_BYTES are 0)"
        return RoutedBackend(MPIBackend(mpi.comm), shm, reduce_max, move_max), (
            f"mpi+shm: every rank is on this host; MPI ({mpi.library}) runs reductions up to "
            f"{_size(reduce_max)} and data movement up to {_size(move_max)}, the built-in shm plane the rest, "
            "the faster choice measured for each (docs/benchmarks.md; HOROVOD_MPI_REDUCE_MAX_BYTES, "
            "HOROVOD_MPI_MOVE_MAX_BYTES)")
    if choice == "SHM":
        log.warning("HOROVOD_CPU_OPERATIONS=shm but the job spans %d hosts; using shm inside hosts and %s "
                    "between them.", len(by_host), "mpi" if mpi_usable else "tcp")
    if config.is_set("HOROVOD_HIERARCHICAL_ALLREDUCE") and not config.get("HOROVOD_HIERARCHICAL_ALLREDUCE"):
        if mpi_usable:
            return MPIBackend(mpi.comm), (f"mpi ({mpi.library}): one flat plane over the {len(by_host)} "
                                          "hosts, as HOROVOD_HIERARCHICAL_ALLREDUCE=0 asks")
        return TcpBackend(comm), (f"tcp: one flat ring over the {len(by_host)} hosts, as "
                                  "HOROVOD_HIERARCHICAL_ALLREDUCE=0 asks (unset, the plane is hierarchical)")
    sizes = {len(v) for v in by_host.values()}
    local_index = local.index(rank)
    if mpi_usable:
        if len(sizes) != 1:
            return MPIBackend(mpi.comm), (f"mpi ({mpi.library}): hosts have different numbers of ranks "
                                          f"({sorted(sizes)}), so the hierarchical algorithm does not apply")
        cross = mpi.comm.Split(local_index, rank)
        backend = HierarchicalBackend(MPIBackend(mpi.comm), ShmBackend(comm.sub(local), tag, chunk),
                                      _OwnedMPIBackend(cross))
        return backend, (f"hierarchical: shm inside each of {len(by_host)} hosts, MPI ({mpi.library}) between "
                         "them (MPI's transports, e.g. InfiniBand, beat sockets between hosts)")
    if len(sizes) != 1:
        return TcpBackend(comm), (f"tcp: hosts have different numbers of ranks ({sorted(sizes)}), so the "
                                  "hierarchical algorithm does not apply")
    cross = [members[local_index] for members in by_host.values()]
    backend = HierarchicalBackend(TcpBackend(comm), ShmBackend(comm.sub(local), tag, chunk),
                                  TcpBackend(comm.sub(sorted(cross))))
    return backend, f"hierarchical: shm inside each of {len(by_host)} hosts, tcp between them"


def _limit(nbytes: int) -> int:
    """A HOROVOD_MPI_*_MAX_BYTES value as a byte limit: negative means no limit."""
    return sys.maxsize if nbytes < 0 else nbytes


def _size(nbytes: int) -> str:
    if nbytes >= sys.maxsize:
        return "any size"
    if nbytes <= 0:
        return "0 B"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _no_threads_reason(mpi: Union[MPIContext, SubsetMPI]) -> str:
    if config.get("HOROVOD_MPI_THREADS_DISABLE"):
        return "HOROVOD_MPI_THREADS_DISABLE=1 (Horovod's engine thread may not call MPI then)"
    return (f"MPI was initialized without MPI_THREAD_MULTIPLE (with {mpi.thread_level_name}), so Horovod's engine "
            "thread may not call MPI beside the program's own calls")


def _check_mpi_usable(mpi: Union[MPIContext, SubsetMPI, None]) -> None:
    if mpi is None:
        raise ValueError("HOROVOD_CPU_OPERATIONS=mpi needs the job to start on MPI: launch it with "
                         "`horovodrun --mpi ...` or `mpirun ...`, or pass hvd.init(comm=...). Or unset the "
                         "variable to use the built-in shm/tcp data plane.")
    if not mpi.threads_supported:
        raise ValueError(f"HOROVOD_CPU_OPERATIONS=mpi, but {_no_threads_reason(mpi)}. Initialize MPI with "
                         "MPI_THREAD_MULTIPLE (mpi4py's default), or unset HOROVOD_CPU_OPERATIONS.")


class _OwnedMPIBackend(MPIBackend):
    """An MPI backend on a communicator made for it alone, which it frees when closed."""

    def close(self) -> None:
        try:
            self.comm.Free()
        except Exception:
            log.debug("could not free an MPI communicator", exc_info=True)
