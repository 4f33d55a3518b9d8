"""Starting Horovod on MPI: under ``mpirun``/``horovodrun --mpi``, or on a communicator given to ``hvd.init``.

MPI replaces the launcher's rendezvous store. From the main thread, during ``init`` only, it gives each rank its
place (rank and size from the communicator; local ranks from ``MPI_Comm_split_type(SHARED)``; cross ranks from a
split by local rank), a fresh job secret from rank 0, and an allgather of every rank's listening addresses, from
which the authenticated socket mesh is built as under horovodrun. The data plane may then be MPI itself
(:class:`horovod.backends.mpi.MPIBackend`, on a duplicate of the communicator that only Horovod uses) or the
built-in ones; ``backends.factory`` chooses.

mpi4py is imported here and only here (the core does not need it otherwise).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import socket
from typing import Any, List, Optional

from horovod.common import config
from horovod.common.topology import Topology

log = logging.getLogger(__name__)

# Variables an MPI launcher sets in every rank (Open MPI, PMIx-based launchers, MPICH/Intel MPI's Hydra).
LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE")
INSTALL_ADVICE = ("Install mpi4py and an MPI (`pip install horovod[mpi]` brings mpi4py and Open MPI), or launch "
                  "with `horovodrun -np N python script.py`, which needs no MPI.")


def mpi4py_available() -> bool:
    """True when mpi4py can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):
        return False


def launched_by_mpi(env: Optional[dict] = None) -> bool:
    """True when an MPI launcher started this process and horovodrun's own rendezvous is absent."""
    env = os.environ if env is None else env
    if config.is_set("HOROVOD_RANK", env) and config.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", env):
        return False
    return any(env.get(name) for name in LAUNCHER_VARS)


def wanted(comm: Any) -> bool:
    """Should ``init`` start on MPI?  A communicator given, HOROVOD_CONTROLLER=mpi, or an MPI launcher."""
    controller = config.get("HOROVOD_CONTROLLER")
    if comm is not None:
        if controller == "GLOO":
            raise ValueError("hvd.init(comm=...) needs the MPI controller, but HOROVOD_CONTROLLER=gloo; unset it.")
        return True
    if controller == "MPI":
        return True
    if controller == "GLOO":
        return False
    return launched_by_mpi()


def _import_mpi():
    """Import mpi4py.MPI, initializing MPI (thread level MULTIPLE unless HOROVOD_MPI_THREADS_DISABLE)."""
    if not mpi4py_available():
        raise RuntimeError(f"this process was started by an MPI launcher (or asked for MPI), but mpi4py is not "
                           f"installed. {INSTALL_ADVICE}")
    import mpi4py

    if config.get("HOROVOD_MPI_THREADS_DISABLE"):
        # Only applies when Horovod is the first to initialize MPI; a program that imported mpi4py.MPI first
        # chose its own level, which Query_thread reports.
        mpi4py.rc.thread_level = "single"
    try:
        from mpi4py import MPI
    except ImportError as exc:   # mpi4py present, but its MPI library does not load
        raise RuntimeError(f"mpi4py is installed but its MPI library could not be loaded ({exc}). "
                           f"{INSTALL_ADVICE}") from exc
    return MPI


class MPIContext:
    """Horovod's communicator and what MPI told this rank about the job."""

    def __init__(self, comm: Any = None) -> None:
        MPI = _import_mpi()
        self.MPI = MPI
        base = self._resolve(MPI, comm)
        self.comm = base.Dup()             # Horovod's own traffic never matches the user's
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        # Process sets are made from this one, by the user's thread, while the engine thread may be using comm.
        self.sets_comm = self.comm.Dup()
        self.local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.cross = self.comm.Split(self.local.Get_rank(), self.rank)
        self.thread_level = MPI.Query_thread()
        self.thread_level_name = next((name for name in ("MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED",
                                                         "MPI_THREAD_SERIALIZED", "MPI_THREAD_MULTIPLE")
                                       if getattr(MPI, name[4:]) == self.thread_level), str(self.thread_level))
        self.threads_supported = (self.thread_level == MPI.THREAD_MULTIPLE
                                  and not config.get("HOROVOD_MPI_THREADS_DISABLE"))
        self.library = " ".join(MPI.Get_library_version().splitlines()[0].split(",")[0].split())
        self.world_ranks = self._world_ranks(MPI)

    @staticmethod
    def _resolve(MPI, comm: Any):
        world = MPI.COMM_WORLD
        if comm is None:
            return world
        if isinstance(comm, MPI.Comm):
            if comm == MPI.COMM_NULL:
                raise ValueError("hvd.init(comm=...) got MPI.COMM_NULL: this process is not part of that "
                                 "communicator, so it cannot run Horovod on it.")
            return comm
        try:
            if isinstance(comm, (str, bytes)):
                raise TypeError
            ranks = sorted({int(r) for r in comm})
        except (TypeError, ValueError):
            raise ValueError(f"hvd.init(comm=...) takes an mpi4py communicator or a list of ranks of "
                             f"COMM_WORLD, not {type(comm).__name__} {comm!r}.") from None
        me = world.Get_rank()
        bad = [r for r in ranks if not 0 <= r < world.Get_size()]
        if bad:
            raise ValueError(f"hvd.init(comm={list(comm)}): rank(s) {bad} are not in COMM_WORLD "
                             f"(size {world.Get_size()}).")
        if me not in ranks:
            raise ValueError(f"hvd.init(comm={ranks}) was called on COMM_WORLD rank {me}, which is not in the "
                             "list; only the listed ranks may call it.")
        # Collective over the listed ranks only, so the other ranks are free to do something else.
        return world.Create_group(world.Get_group().Incl(ranks), tag=0x4856)

    def _world_ranks(self, MPI) -> List[int]:
        group = self.comm.Get_group()
        try:
            return list(MPI.Group.Translate_ranks(group, list(range(self.size)), MPI.COMM_WORLD.Get_group()))
        finally:
            group.Free()

    def topology(self) -> Topology:
        """Where this rank sits, from MPI (not from the launcher's environment, which a sub-communicator
        would contradict)."""
        hostname = config.get("HOROVOD_HOSTNAME") or socket.gethostname()
        return Topology(self.rank, self.size, self.local.Get_rank(), self.local.Get_size(), self.cross.Get_rank(),
                        self.cross.Get_size(), hostname, "MPI").validate()

    def job_secret(self) -> bytes:
        """A secret for this job's sockets, made by rank 0 and shared over MPI (which is the trusted channel)."""
        return self.comm.bcast(os.urandom(32) if self.rank == 0 else None, root=0)

    def publish(self, me: dict, remaining: float) -> List[dict]:
        """The mesh's address exchange: an allgather over MPI (a collective, so no timeout applies)."""
        return self.comm.allgather(me)

    def comm_ranks(self, comm: Any) -> List[int]:
        """The Horovod ranks of the members of ``comm`` (a communicator of the user's, e.g. for a process set),
        in ``comm``'s order; ValueError when some member is not in Horovod's job."""
        theirs, ours = comm.Get_group(), self.comm.Get_group()
        try:
            ranks = list(self.MPI.Group.Translate_ranks(theirs, list(range(comm.Get_size())), ours))
        finally:
            theirs.Free()
            ours.Free()
        if any(r == self.MPI.UNDEFINED or r < 0 for r in ranks):
            raise ValueError(f"the MPI communicator {comm} has members outside Horovod's communicator; a process set "
                             "made from a communicator may only contain ranks of the Horovod job.")
        return ranks

    def subset(self, ranks: List[int]) -> Optional[SubsetMPI]:
        """A communicator of Horovod's ``ranks`` (a process set), or None on a rank that is not one of them.
        Collective: every rank of the job calls it, in the same order."""
        member = self.rank in ranks
        comm = self.sets_comm.Split(0 if member else self.MPI.UNDEFINED, ranks.index(self.rank) if member else 0)
        return SubsetMPI(self, comm) if member else None

    def close(self) -> None:
        """Free Horovod's communicators (MPI itself stays initialized: mpi4py finalizes it at exit)."""
        for comm in (self.cross, self.local, self.sets_comm, self.comm):
            try:
                comm.Free()
            except Exception:   # MPI already finalized, or the job is tearing down after a failure
                log.debug("could not free an MPI communicator", exc_info=True)


class SubsetMPI:
    """What a process set's data plane needs of MPI: its own communicator, and the job's MPI facts."""

    def __init__(self, parent: MPIContext, comm: Any) -> None:
        self.comm = comm
        self.MPI = parent.MPI
        self.threads_supported = parent.threads_supported
        self.thread_level_name = parent.thread_level_name
        self.library = parent.library

    def close(self) -> None:
        try:
            self.comm.Free()
        except Exception:
            log.debug("could not free a process set's MPI communicator", exc_info=True)
