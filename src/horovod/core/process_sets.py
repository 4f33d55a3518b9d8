"""Process sets: groups of ranks that run collectives among themselves.

A :class:`ProcessSet` names its members by global rank. Registering it (``hvd.init(process_sets=[...])`` or
``hvd.add_process_set``, see :mod:`horovod.core.process_set_registry`) gives it an id and, on each member, an engine of its
own (see :mod:`horovod.core.process_set_table`); every collective takes ``process_set=`` and runs on that set's
engine. ``global_process_set`` (id 0) is every rank.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

from horovod.common.exceptions import not_initialized


class ProcessSet:
    """A sorted set of global ranks (or an mpi4py communicator whose ranks are learned at registration);
    ``process_set_id`` is None until registered."""

    def __init__(self, ranks_or_comm: Union[Sequence[int], object]) -> None:
        self.process_set_id: Optional[int] = None
        self.mpi_comm = None
        self.own_rank: Optional[int] = None     # this process's global rank, set when the set is registered
        self.ranks: Optional[List[int]] = None
        if hasattr(ranks_or_comm, "Get_rank"):
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet should be initialized with a list of process ranks or an mpi4py Comm "
                             "object") from None
        if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks or an mpi4py Comm "
                             f"object, got {list(ranks_or_comm)!r}")
        self.ranks = [int(r) for r in ranks]

    def size(self) -> Optional[int]:
        """Number of ranks in the set (None if unregistered)."""
        if self.process_set_id is None:
            return None
        return len(self.ranks or [])

    def rank(self) -> Optional[int]:
        """This process's rank within the set (None if unregistered or not a member). Collectives still take
        global ranks (a broadcast's ``root_rank``, for example)."""
        if self.process_set_id is None:
            return None
        me = self._own()
        return self.ranks.index(me) if self.ranks and me in self.ranks else None

    def included(self) -> Optional[bool]:
        """True if this process belongs to the set (None before its ranks are known)."""
        if self.ranks is None:
            return None
        return self._own() in self.ranks

    def _own(self) -> int:
        if self.own_rank is None:
            raise not_initialized()
        return self.own_rank

    def _invalidate(self) -> None:
        """Forget the registration (the set was removed, or Horovod shut down)."""
        self.process_set_id = None

    def describe(self) -> str:
        """How error messages name the set: ``process set 2 (ranks [0, 2])``."""
        return f"process set {self.process_set_id} (ranks {self.ranks})"

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__

    def __eq__(self, other) -> bool:
        if not isinstance(other, ProcessSet):
            return NotImplemented
        if self.process_set_id is not None and other.process_set_id is not None:
            return self.process_set_id == other.process_set_id
        return self.ranks == other.ranks and self.mpi_comm == other.mpi_comm

    def __hash__(self) -> int:
        return hash(tuple(self.ranks or ()))


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
