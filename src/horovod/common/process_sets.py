"""Process sets: groups of ranks that run collectives among themselves.

This release supports the global process set (every rank); creating other sets comes with the process-set
feature and raises NotImplementedError with that explanation until then.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

from horovod.common.exceptions import not_initialized


class ProcessSet:
    """A sorted set of global ranks; ``process_set_id`` is None until registered."""

    def __init__(self, ranks_or_comm: Union[Sequence[int], object]) -> None:
        self.process_set_id: Optional[int] = None
        self.mpi_comm = None
        self.own_rank: Optional[int] = None     # this process's global rank, set when the set is registered
        if hasattr(ranks_or_comm, "Get_rank"):
            self.mpi_comm = ranks_or_comm
            self.ranks: Optional[List[int]] = None
        else:
            self.ranks = sorted(int(r) for r in ranks_or_comm)

    def size(self) -> Optional[int]:
        """Number of ranks in the set (None if unregistered)."""
        if self.process_set_id is None:
            return None
        return len(self.ranks or [])

    def rank(self) -> Optional[int]:
        """This process's rank within the set (None if unregistered or not a member)."""
        if self.process_set_id is None:
            return None
        me = self._own()
        return self.ranks.index(me) if self.ranks and me in self.ranks else None

    def included(self) -> Optional[bool]:
        """True if this process belongs to the set."""
        if self.process_set_id is None:
            return None
        return self._own() in (self.ranks or [])

    def _own(self) -> int:
        if self.own_rank is None:
            raise not_initialized()
        return self.own_rank

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__

    def __eq__(self, other) -> bool:
        return isinstance(other, ProcessSet) and self.ranks == other.ranks and self.mpi_comm == other.mpi_comm

    def __hash__(self) -> int:
        return hash(tuple(self.ranks or ()))


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a new process set (needs the process-set feature, not in this release)."""
    raise NotImplementedError(
        "Process sets other than the global one are not available in this release yet; run collectives on the "
        "global process set (omit process_set=)."
    )


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a registered process set; the global set cannot be removed (returns False)."""
    if process_set is global_process_set or process_set.process_set_id == 0:
        return False
    raise NotImplementedError("Process sets other than the global one are not available in this release yet.")


def check_global(process_set: Optional[ProcessSet]) -> None:
    """Reject a process set other than the global one, saying why."""
    if process_set is None or process_set is global_process_set or process_set.process_set_id == 0:
        return
    raise NotImplementedError(
        f"{process_set} is not the global process set; only the global process set is supported in this release."
    )
