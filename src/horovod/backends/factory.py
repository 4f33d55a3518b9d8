"""Choosing the data plane for a job from where its ranks live, whether it runs on MPI, and
HOROVOD_CPU_OPERATIONS.

The choice is a declared table, :data:`RULES`: each :class:`Rule` has a condition on the job's
:class:`Situation`, a builder of the backend, and the reason (a template of the sentence logged at ``init`` and
shown by ``horovodrun --check-build``). The first rule whose condition holds is the one used, as JAX's cluster
detectors are tried in their registered order.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, Union

from horovod.backends import spin
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


class Situation:
    """What the choice looks at: the mesh (who is where), the MPI context (None without MPI) and the knobs.

    Everything is read when first asked for, so a rule's condition reads only what it needs, and a builder
    makes only its own backend.
    """

    def __init__(self, mesh: Mesh, job: str, generation: Generation,
                 mpi: Union[MPIContext, SubsetMPI, None] = None) -> None:
        self.mesh, self.job, self.generation, self.mpi = mesh, job, generation, mpi
        self.size, self.rank = mesh.size, mesh.rank

    @functools.cached_property
    def choice(self) -> str:
        """HOROVOD_CPU_OPERATIONS, upper case ("" when unset)."""
        return config.get("HOROVOD_CPU_OPERATIONS")

    @functools.cached_property
    def by_host(self) -> Dict[str, List[int]]:
        """The ranks on each host, in rank order."""
        by_host: Dict[str, List[int]] = {}
        for r, h in enumerate(self.mesh.hosts):
            by_host.setdefault(h, []).append(r)
        return by_host

    @property
    def one_host(self) -> bool:
        return len(self.by_host) == 1

    @property
    def host_count(self) -> int:
        return len(self.by_host)

    @property
    def rank_counts(self) -> List[int]:
        """The distinct numbers of ranks per host, sorted."""
        return sorted({len(v) for v in self.by_host.values()})

    @property
    def uneven(self) -> bool:
        """Hosts run different numbers of ranks (the hierarchical algorithm does not apply)."""
        return len(self.rank_counts) != 1

    @property
    def mpi_usable(self) -> bool:
        """The job runs on MPI and the engine thread may call it (MPI_THREAD_MULTIPLE, not disabled)."""
        return self.mpi is not None and self.mpi.threads_supported

    @property
    def library(self) -> str:
        return self.mpi.library

    @property
    def no_threads_reason(self) -> str:
        return _no_threads_reason(self.mpi)

    @property
    def flat_asked(self) -> bool:
        """HOROVOD_HIERARCHICAL_ALLREDUCE is set, to a false value (unset, the plane across hosts is hierarchical)."""
        return config.is_set("HOROVOD_HIERARCHICAL_ALLREDUCE") and not config.get("HOROVOD_HIERARCHICAL_ALLREDUCE")

    @functools.cached_property
    def reduce_max(self) -> int:
        return _limit(config.get("HOROVOD_MPI_REDUCE_MAX_BYTES"))

    @functools.cached_property
    def move_max(self) -> int:
        return _limit(config.get("HOROVOD_MPI_MOVE_MAX_BYTES"))

    @property
    def reduce_max_text(self) -> str:
        return _size(self.reduce_max)

    @property
    def move_max_text(self) -> str:
        return _size(self.move_max)

    @functools.cached_property
    def comm(self) -> Comm:
        """The socket group over every rank of the mesh."""
        comm = Comm(self.rank, list(range(self.size)), self.mesh.data, self.mesh.hosts)
        comm.set_spin(spin.poll_microseconds(config.get("HOROVOD_SPIN_MICROSECONDS"), self.mesh.on_machine))
        return comm

    @property
    def local(self) -> List[int]:
        """The ranks on this rank's host."""
        return self.by_host[self.mesh.hosts[self.rank]]

    def shm(self, members: Optional[List[int]] = None) -> ShmBackend:
        """The shared-memory plane over this host's ranks (``members``: group positions, default all)."""
        host_tag = hashlib.sha256(self.mesh.hosts[self.rank].encode()).hexdigest()[:8]
        comm = self.comm if members is None else self.comm.sub(members)
        return ShmBackend(comm, f"{self.job}-{self.generation}-{host_tag}", config.get("HOROVOD_SHM_CHUNK_BYTES"))

    def validate(self) -> None:
        """ValueError, saying what to do, for an unknown HOROVOD_CPU_OPERATIONS or a forced MPI that cannot be."""
        if self.choice not in CHOICES:
            raise ValueError(f"HOROVOD_CPU_OPERATIONS={self.choice.lower()!r} is not a data plane; choose shm, tcp, "
                             "mpi (or gloo, which means the built-in choice).")
        if self.choice == "MPI":
            _check_mpi_usable(self.mpi)


@dataclass(frozen=True)
class Rule:
    """One entry of the table: when it applies, what it builds, and why (``reason`` is formatted with the
    situation as ``s``: the sentence logged at ``init`` and shown by ``horovodrun --check-build``)."""

    name: str
    condition: Callable[[Situation], bool]
    builder: Callable[[Situation], Backend]
    reason: str

    def explain(self, situation: Situation) -> str:
        """The reason, for this situation."""
        return self.reason.format(s=situation)


def _hierarchical_mpi(s: Situation) -> Backend:
    cross = s.mpi.comm.Split(s.local.index(s.rank), s.rank)
    return HierarchicalBackend(MPIBackend(s.mpi.comm), s.shm(s.local), _OwnedMPIBackend(cross))


def _hierarchical_tcp(s: Situation) -> Backend:
    local_index = s.local.index(s.rank)
    cross = sorted(members[local_index] for members in s.by_host.values())
    return HierarchicalBackend(TcpBackend(s.comm), s.shm(s.local), TcpBackend(s.comm.sub(cross)))


def _routed(s: Situation) -> Backend:
    shm = s.shm()       # shm, then MPI: both constructors exchange with the peers, in one order on every rank
    return RoutedBackend(MPIBackend(s.mpi.comm), shm, s.reduce_max, s.move_max)


def _flat_mpi(s: Situation) -> Backend:
    return MPIBackend(s.mpi.comm)


def _flat_tcp(s: Situation) -> Backend:
    return TcpBackend(s.comm)


def _shm(s: Situation) -> Backend:
    return s.shm()


_UNEVEN = "hosts have different numbers of ranks ({s.rank_counts}), so the hierarchical algorithm does not apply"

#: The data-plane rules, tried in order; the last one always applies.
RULES: Tuple[Rule, ...] = (
    Rule("single", lambda s: s.size == 1, lambda s: LocalBackend(), "a single rank needs no data plane"),
    Rule("forced-tcp", lambda s: s.choice == "TCP", _flat_tcp, "tcp, forced by HOROVOD_CPU_OPERATIONS=tcp"),
    Rule("forced-mpi", lambda s: s.choice == "MPI", _flat_mpi,
         "mpi ({s.library}), forced by HOROVOD_CPU_OPERATIONS=mpi"),
    Rule("one-host-forced-shm", lambda s: s.one_host and s.choice == "SHM", _shm,
         "shm: every rank is on this host, forced by HOROVOD_CPU_OPERATIONS=shm"),
    Rule("one-host-shm", lambda s: s.one_host and s.mpi is None, _shm, "shm: every rank is on this host"),
    Rule("one-host-mpi-without-threads", lambda s: s.one_host and not s.mpi_usable, _shm,
         "shm: every rank is on this host; MPI is not used for data because {s.no_threads_reason}"),
    Rule("one-host-mpi-sizes-0", lambda s: s.one_host and s.reduce_max == 0 and s.move_max == 0, _shm,
         "shm: every rank is on this host (HOROVOD_MPI_*_MAX_BYTES are 0)"),
    Rule("one-host-mpi+shm", lambda s: s.one_host, _routed,
         "mpi+shm: every rank is on this host; MPI ({s.library}) runs reductions up to {s.reduce_max_text} and data "
         "movement up to {s.move_max_text}, the built-in shm plane the rest, the faster choice measured for each "
         "(docs/benchmarks.md; HOROVOD_MPI_REDUCE_MAX_BYTES, HOROVOD_MPI_MOVE_MAX_BYTES)"),
    Rule("flat-mpi-asked", lambda s: s.flat_asked and s.mpi_usable, _flat_mpi,
         "mpi ({s.library}): one flat plane over the {s.host_count} hosts, as HOROVOD_HIERARCHICAL_ALLREDUCE=0 asks"),
    Rule("flat-tcp-asked", lambda s: s.flat_asked, _flat_tcp,
         "tcp: one flat ring over the {s.host_count} hosts, as HOROVOD_HIERARCHICAL_ALLREDUCE=0 asks (unset, the "
         "plane is hierarchical)"),
    Rule("uneven-mpi", lambda s: s.mpi_usable and s.uneven, _flat_mpi, "mpi ({s.library}): " + _UNEVEN),
    Rule("hierarchical-mpi", lambda s: s.mpi_usable, _hierarchical_mpi,
         "hierarchical: shm inside each of {s.host_count} hosts, MPI ({s.library}) between them (MPI's transports, "
         "e.g. InfiniBand, beat sockets between hosts)"),
    Rule("uneven-tcp", lambda s: s.uneven, _flat_tcp, "tcp: " + _UNEVEN),
    Rule("hierarchical-tcp", lambda s: True, _hierarchical_tcp,
         "hierarchical: shm inside each of {s.host_count} hosts, tcp between them"),
)


def rule_for(situation: Situation) -> Rule:
    """The first rule of :data:`RULES` whose condition holds in ``situation``."""
    return next(rule for rule in RULES if rule.condition(situation))


def make_backend(mesh: Mesh, job: str, generation: Generation,
                 mpi: Union[MPIContext, SubsetMPI, None] = None) -> Tuple[Backend, str]:
    """The backend for this rank and a sentence saying why it was chosen (the chosen rule's reason).

    ``mpi`` is the job's MPI context when it started on MPI (mpirun, ``horovodrun --mpi``, ``init(comm=...)``),
    or a process set's part of it (``mesh`` is then the set's own). ValueError for an unknown
    HOROVOD_CPU_OPERATIONS, or ``mpi`` forced where MPI cannot carry the data.
    """
    situation = Situation(mesh, job, generation, mpi)
    if situation.size > 1:
        situation.validate()
    rule = rule_for(situation)
    if not situation.one_host and situation.choice == "SHM":
        log.warning("HOROVOD_CPU_OPERATIONS=shm but the job spans %d hosts; using shm inside hosts and %s "
                    "between them.", situation.host_count, "mpi" if situation.mpi_usable else "tcp")
    return rule.builder(situation), rule.explain(situation)


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
