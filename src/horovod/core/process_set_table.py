"""The registered process sets of this process, and the engines that run their collectives.

Every process set but the global one gets, on each of its members, an :class:`Engine` of its own: its own
coordinator (the set's lowest rank), control channel, response cache, fusion and data plane, over sockets (and,
under MPI, a communicator) that only it uses. So each set negotiates, fuses, caches and orders its own tensors;
two sets never wait for each other, whether they are disjoint or share ranks, and the same tensor name may be in
flight in two sets at once. (One engine for every set would have to order the sets' collectives against each
other on every shared rank, and a stalled set would block the others; docs/architecture.md says more.)

Registering a set is collective over the whole job, like upstream's: every rank calls it, in the same order, and
the members' listening addresses are exchanged by an allgather on the global set's engine, after which the
members connect among themselves as ``init`` connects the job (:func:`horovod.backends.mesh.build_mesh`).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from horovod.backends.factory import make_backend
from horovod.backends.mesh import build_mesh
from horovod.common import wire
from horovod.common.mpi_context import MPIContext
from horovod.common.topology import Topology
from horovod.common.types import RequestType, data_type_of
from horovod.core.controller.messages import make_request
from horovod.core.engine import Engine, Entry
from horovod.core.engine.handles import Handle
from horovod.core.engine.observer import EngineObserver
from horovod.core.engine.settings import EngineSettings

log = logging.getLogger(__name__)


@dataclasses.dataclass
class JobContext:
    """What starting a process set's engine needs to know about the job (kept by ``init``)."""

    topo: Topology
    key: bytes                  # the job secret that authenticates every connection
    generation: int             # this init's number (a new init() after shutdown() counts up)
    bind_addr: str              # where this rank listens for peers on other hosts
    mpi: Optional[MPIContext]
    timeout: float              # HOROVOD_START_TIMEOUT
    settings: Callable[[], EngineSettings]
    observers: Callable[[List[int], str], List[EngineObserver]]     # this member's, for (ranks, where)


@dataclasses.dataclass
class RegisteredSet:
    """A process set known to this rank: its id and ranks, and its engine where this rank is a member."""

    process_set_id: int
    ranks: List[int]
    engine: Optional[Engine]
    close: Callable[[], None]

    def describe(self) -> str:
        return f"process set {self.process_set_id} (ranks {self.ranks})"


class ProcessSetTable:
    """The process sets registered in this job, by id (the global set, id 0, is not in the table)."""

    def __init__(self) -> None:
        self._sets: Dict[int, RegisteredSet] = {}
        self._next_id = 1

    @property
    def next_id(self) -> int:
        """The id the next registered set gets (ids are never reused within one init)."""
        return self._next_id

    def get(self, process_set_id: int) -> Optional[RegisteredSet]:
        return self._sets.get(process_set_id)

    def id_of(self, ranks: List[int]) -> Optional[int]:
        """The id of the registered set with exactly these ranks, if any."""
        return next((i for i, s in self._sets.items() if s.ranks == ranks), None)

    def engines(self) -> List[Engine]:
        """The engines of the sets this rank is a member of."""
        return [s.engine for s in self._sets.values() if s.engine is not None]

    def ids_and_ranks(self) -> Dict[int, List[int]]:
        return {i: list(s.ranks) for i, s in self._sets.items()}

    def add(self, job: JobContext, global_engine: Engine, ranks: List[int]) -> RegisteredSet:
        """Register a set with these (sorted, distinct, valid) global ranks and start its engine on its members.
        Collective over the job."""
        process_set_id = self._next_id
        engine, close = start_set_engine(job, global_engine, process_set_id, ranks)
        self._next_id += 1
        registered = self._sets[process_set_id] = RegisteredSet(process_set_id, list(ranks), engine, close)
        log.debug("rank %d: registered %s", job.topo.rank, registered.describe())
        return registered

    def remove(self, process_set_id: int) -> None:
        """Stop the set's engine (on a member) and forget the set."""
        registered = self._sets.pop(process_set_id, None)
        if registered is not None:
            _stop(registered)

    def close(self) -> None:
        """Stop every set's engine (at shutdown)."""
        while self._sets:
            _stop(self._sets.pop(next(iter(self._sets))))


def _stop(registered: RegisteredSet) -> None:
    if registered.engine is not None:
        registered.engine.shutdown()
    registered.close()


def exchange(engine: Engine, tag: str, item: Any) -> List[Any]:
    """Every rank's ``item`` (anything msgpack packs), in rank order: an allgather on ``engine``'s set."""
    payload = np.frombuffer(wire.pack(item), np.uint8)
    sizes = _allgather(engine, f"{tag}.sz", np.array([payload.size], np.int64))
    data = _allgather(engine, f"{tag}.data", payload)
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(wire.unpack(data[offset:offset + n].tobytes()))
        offset += n
    return out


def _allgather(engine: Engine, name: str, arr: np.ndarray) -> np.ndarray:
    handle = Handle(name)
    request = make_request(name, RequestType.ALLGATHER, data_type_of(arr.dtype), arr.shape)
    engine.enqueue([Entry(request, arr, None, handle)])
    return handle.wait()


def start_set_engine(job: JobContext, global_engine: Engine, process_set_id: int,
                     ranks: List[int]):
    """Connect the members of a new process set and start their engine: (engine, close) on a member, (None,
    close) elsewhere. Every rank of the job calls it, in the same order."""
    topo = job.topo
    member = topo.rank in ranks
    sub_mpi = job.mpi.subset(ranks) if job.mpi is not None else None     # collective over the job
    generation = f"{job.generation}.ps{process_set_id}"
    tag = f"horovod.process_set.{generation}"
    if not member:
        exchange(global_engine, tag, None)
        return None, (sub_mpi.close if sub_mpi is not None else _nothing)
    position = ranks.index(topo.rank)
    set_topo = dataclasses.replace(topo, rank=position, size=len(ranks))

    def publish(me: dict, remaining: float) -> List[dict]:
        return [info for info in exchange(global_engine, tag, me) if info is not None]

    mesh = None
    try:
        mesh = build_mesh(set_topo, job.key, publish, generation, job.timeout, job.bind_addr)
        backend, reason = make_backend(mesh, wire.secret_fingerprint(job.key), generation, sub_mpi)
    except BaseException:
        if mesh is not None:
            mesh.close()
        if sub_mpi is not None:
            sub_mpi.close()
        raise

    def close() -> None:
        backend.close()
        mesh.close()
        if sub_mpi is not None:
            sub_mpi.close()

    settings = job.settings()
    settings.hosts = mesh.hosts
    where = f" in process set {process_set_id} (ranks {ranks})"
    observers = job.observers(ranks, where)
    engine = Engine(position, len(ranks), backend, mesh.control, settings, observers=observers, ranks=ranks,
                    process_set_id=process_set_id).start()
    log.info("rank %d: process set %d (ranks %s) started, data plane: %s", topo.rank, process_set_id, ranks,
             reason)
    return engine, close


def _nothing() -> None:
    return None
