"""Who am I, and what this job can do: ``rank``, ``size``, ``local_rank`` ..., the data plane, and what is
enabled (what is built: :mod:`horovod.common.build`, re-exported here as upstream's basics have it).

Each reads the job state that ``init`` set up (:mod:`horovod.core.job_state`); before ``init`` (or after
``shutdown``) the who-am-I queries raise upstream's ValueError.
"""
from __future__ import annotations

from horovod.common.build import (  # noqa: F401  (part of basics' API, as upstream's)
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    mpi_built,
    nccl_built,
    rocm_built,
)
from horovod.core.job_state import state, topo


def generation() -> int:
    """Which ``init`` of this process's job is running (changes at every init; in an elastic job, the round)."""
    return state.generation


def is_initialized() -> bool:
    """True between a successful ``init()`` and ``shutdown()``."""
    return state.engine is not None


def size() -> int:
    """Number of processes in the job."""
    return topo().size


def rank() -> int:
    """This process's global rank."""
    return topo().rank


def local_size() -> int:
    """Number of processes on this host."""
    return topo().local_size


def local_rank() -> int:
    """This process's rank within its host."""
    return topo().local_rank


def cross_size() -> int:
    """Number of hosts that have a process with this local rank."""
    return topo().cross_size


def cross_rank() -> int:
    """Index of this host among the hosts with this local rank."""
    return topo().cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of processes."""
    current = topo()
    return current.size % current.local_size == 0 and current.cross_size * current.local_size == current.size


def data_plane() -> str:
    """Which data plane this job uses and why (shown by --check-build and logged at INFO)."""
    topo()
    return state.backend_reason


# ------------------------------------------------------------------ what is enabled (what is built: common/build.py)


def mpi_enabled() -> bool:
    """True when this job started on MPI (mpirun, ``horovodrun --mpi``, or ``init(comm=...)``)."""
    return state.engine is not None and state.mpi is not None


def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE (and HOROVOD_MPI_THREADS_DISABLE is not set), so the program
    may make its own MPI calls beside Horovod's; raises ValueError, as upstream, when MPI is not enabled."""
    topo()
    if state.mpi is None:
        raise ValueError("Horovod MPI is not enabled in this job (it was not started by mpirun or horovodrun "
                         "--mpi, nor given a communicator); mpi_threads_supported() needs MPI.")
    return state.mpi.threads_supported


def gloo_enabled() -> bool:
    """True when the job started through horovodrun's rendezvous (upstream's Gloo controller), not MPI."""
    return is_initialized() and state.mpi is None
