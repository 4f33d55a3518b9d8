"""The process-set registry: registering sets (at ``init`` and with ``hvd.add_process_set``), removing them,
and finding a registered set's engine and ranks.

The sets themselves are :class:`~horovod.core.process_sets.ProcessSet`; the table of registered sets, with their
engines, is :mod:`horovod.core.process_set_table`, kept in the job state (:mod:`horovod.core.job_state`).
Adding and removing are collective: every rank calls them with the same ranks, and a mismatch is an error on
every rank that names what each asked for.
"""
from __future__ import annotations

import os
from typing import List, Optional, Sequence, Union

from horovod.common import config
from horovod.core import housekeeping
from horovod.core.engine import Engine
from horovod.core.job_state import engine, state, topo
from horovod.core.process_set_table import exchange
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.core.queries import rank


def registered_set(process_set: Optional[ProcessSet]):
    """The registry's entry for ``process_set`` (None for the global set); ValueError, saying what to do, when it is
    not registered (never, or no longer: an id set by hand, or a set removed with hvd.remove_process_set)."""
    if process_set is None or process_set is global_process_set or process_set.process_set_id == 0:
        return None
    set_id = process_set.process_set_id
    if set_id is None:
        raise ValueError(f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or register it "
                         "with hvd.add_process_set() before using it in a collective.")
    registered = state.sets.get(set_id)
    if registered is None:
        raise ValueError(f"{process_set} is not registered: this job has no process set with id {set_id} (it was "
                         "removed with hvd.remove_process_set, or the id was set by hand); register the set with "
                         "hvd.add_process_set() to use it.")
    return registered


def engine_for(process_set: Optional[ProcessSet]) -> Engine:
    """The engine that runs ``process_set``'s collectives on this rank (the global one for None or the global
    set); ValueError when the set is not registered, or this rank is not one of its members."""
    current = engine()
    registered = registered_set(process_set)
    if registered is None:
        return current
    if registered.engine is None:
        raise ValueError(f"Rank {state.topo.rank} is not in {registered.describe()}: only its members may run "
                         "collectives on it. Check process_set.included() before calling the collective.")
    return registered.engine


def process_set_ranks(process_set_id: int) -> List[int]:
    """The global ranks of the registered process set with this id; ValueError for an unknown id."""
    size = topo().size
    if process_set_id == 0:
        return list(range(size))
    registered = state.sets.get(process_set_id)
    if registered is None:
        raise ValueError(f"There is no process set with id {process_set_id}: it was never registered, or it was "
                         "removed. Registered ids: " + ", ".join(map(str, [0, *state.sets.ids_and_ranks()])) + ".")
    return list(registered.ranks)


def _process_set_rank(process_set_id: int) -> int:
    """Upstream's private helper: this rank's position in the set, or -1 when it is not a member."""
    ranks = process_set_ranks(process_set_id)
    return ranks.index(rank()) if rank() in ranks else -1


def _process_set_size(process_set_id: int) -> int:
    """Upstream's private helper: the number of ranks in the set."""
    return len(process_set_ranks(process_set_id))


def _get_process_set_ids_and_ranks() -> dict:
    """Upstream's private helper: {process_set_id: ranks} for every registered set, the global one included."""
    return {0: process_set_ranks(0), **state.sets.ids_and_ranks()}


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a process set after ``init`` and return it with its id (needs HOROVOD_DYNAMIC_PROCESS_SETS=1 or
    ``init(process_sets="dynamic")``). Collective: every rank calls it with the same ranks, in the same order."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None and process_set.mpi_comm is not None:
        raise NotImplementedError(
            "Dynamically adding process sets defined by an MPI communicator is not implemented. "
            "Please build the process set via a list of ranks.")
    with state.lock:
        current = engine()
        if not config.get("HOROVOD_DYNAMIC_PROCESS_SETS"):
            raise ValueError(
                "Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets after Horovod initialization.")
        ranks = _checked_ranks(process_set.ranks)
        everyone = exchange(current, f"horovod.process_set.add.{state.generation}.{state.sets.next_id}", ranks)
        _check_same(everyone, "add_process_set")
        if _existing_id(ranks) is not None:
            raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
        _bind(process_set, state.sets.add(state.job, current, ranks).process_set_id)
        return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` and stop its engine; False for the global set or a set that is not registered.
    Collective, as ``add_process_set``. ValueError, naming the set, while collectives are in flight on it."""
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    with state.lock:
        current = engine()
        if not config.get("HOROVOD_DYNAMIC_PROCESS_SETS"):
            raise ValueError(
                "Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow removing process sets after Horovod initialization.")
        registered = state.sets.get(set_id)
        if registered is None:
            return False
        housekeeping.settle(set_id)
        mine = registered.engine.in_flight() if registered.engine is not None else []
        everyone = exchange(current, f"horovod.process_set.remove.{state.generation}.{set_id}", mine)
        busy = {rank: names for rank, names in enumerate(everyone) if names}
        if busy:
            shown = "; ".join(f"rank {r}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
                              for r, names in busy.items())
            raise ValueError(f"Cannot remove {registered.describe()}: collectives are still in flight on it "
                             f"({shown}). Wait for them to complete (synchronize their handles) first.")
        process_set._invalidate()
        state.sets.remove(set_id)
        return True


def static_sets(process_sets: Union[Sequence[ProcessSet], str, None]) -> List[ProcessSet]:
    """``init``'s process_sets argument as a list; "dynamic" allows adding sets later, as upstream (which sets
    HOROVOD_DYNAMIC_PROCESS_SETS=1 in the environment)."""
    if process_sets is None:
        return []
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(f"hvd.init(process_sets={process_sets!r}): pass a list of hvd.ProcessSet, or "
                             "'dynamic' to add process sets later with hvd.add_process_set().")
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
        return []
    sets = list(process_sets)
    for ps in sets:
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"hvd.init(process_sets=...) takes hvd.ProcessSet objects, got {ps!r}.")
    return sets


def register_static(process_sets: List[ProcessSet]) -> None:
    """Register ``init``'s process sets: the union of every rank's, in a deterministic order (sets made from MPI
    communicators can differ by rank: a Split gives each rank its own). As upstream, every rank passes sets or
    none does; without any, nothing is exchanged."""
    if not process_sets:
        return
    mine = [_checked_ranks(_comm_ranks(ps) if ps.ranks is None else ps.ranks) for ps in process_sets]
    everyone = exchange(state.engine, f"horovod.process_set.init.{state.generation}", mine)
    for ranks in [r for theirs in everyone for r in theirs]:
        if _existing_id(ranks) is None:
            state.sets.add(state.job, state.engine, ranks)
    seen = {0}
    for index, (ps, ranks) in enumerate(zip(process_sets, mine)):
        set_id = _existing_id(ranks)
        if set_id in seen:
            raise ValueError(f"Horovod could not be initialized because process_sets entry number {index} is a "
                             f"duplicate: {ps}")
        seen.add(set_id)
        _bind(ps, set_id)


def _comm_ranks(process_set: ProcessSet) -> List[int]:
    if state.mpi is None:
        raise ValueError(f"{process_set} is made from an MPI communicator, but this job does not run on MPI; launch "
                         "it with mpirun or `horovodrun --mpi`, or build the process set from a list of ranks.")
    return state.mpi.comm_ranks(process_set.mpi_comm)


def _checked_ranks(ranks: Optional[Sequence[int]]) -> List[int]:
    """Sorted, distinct ranks of this job; ValueError saying what is wrong otherwise."""
    size = state.topo.size
    ranks = sorted(int(r) for r in (ranks or []))
    if not ranks:
        raise ValueError("A process set needs at least one rank.")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"Process set ranks {ranks} contain duplicates; give each rank once.")
    bad = [r for r in ranks if not 0 <= r < size]
    if bad:
        raise ValueError(f"Process set ranks {bad} are not ranks of this job (valid ranks are 0..{size - 1}).")
    return ranks


def _check_same(everyone: List[list], what: str) -> None:
    """Every rank must have asked for the same set; otherwise every rank raises, naming what each asked for."""
    if any(theirs != everyone[0] for theirs in everyone):
        asked = "; ".join(f"rank {r} asked for {theirs}" for r, theirs in enumerate(everyone))
        raise ValueError(f"{what} is collective: every rank must call it with the same ranks, in the same order, "
                         f"but {asked}.")


def _existing_id(ranks: List[int]) -> Optional[int]:
    """The id of the registered set (the global one included) with exactly these ranks."""
    if ranks == list(range(state.topo.size)):
        return 0
    return state.sets.id_of(ranks)


def _bind(process_set: ProcessSet, set_id: int) -> None:
    """Give a user's ProcessSet the registered set's id and ranks (a set made from a communicator learns them
    here); it is invalidated at shutdown."""
    process_set.process_set_id = set_id
    process_set.own_rank = state.topo.rank
    process_set.ranks = list(state.sets.get(set_id).ranks)
    state.bound.add(process_set)
