"""A worker of an elastic job joins the driver's rounds (``hvd.init()`` under ``horovodrun --min-np ...``).

In an elastic job the rank, size and host layout are not fixed at start: every ``init()`` asks the driver for
this worker's place in the next round (:func:`horovod.common.elastic_rendezvous.request_assignment`), keyed by
the worker's slot ``host:local_rank``, which never changes. The round number is the job's generation: it names
the round's peer addresses in the store, its Unix sockets and its shared memory, so rounds never mix.

When a round cannot be formed (a worker died before everyone connected, so the driver abandoned it, or a peer
never showed up) the worker asks for the next round instead of failing: only the driver decides that the job
ends (reset limit, no hosts left). When the driver says this worker's slot is no longer part of the job (its
host was removed), the process exits with status 0.
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Optional, Tuple, TypeVar

from horovod.common import config, elastic_rendezvous
from horovod.common.exceptions import HorovodInternalError
from horovod.common.topology import Topology

log = logging.getLogger("horovod.elastic")  # a named channel: see horovod.common.logging_setup

T = TypeVar("T")
SOURCE = "horovodrun (elastic)"


class _Slot:
    """This worker's slot and the last round it took part in (process-wide)."""

    key: Optional[str] = None
    hostname: str = ""
    last_round = -1


def wanted(comm: Optional[object]) -> bool:
    """True when this process is a worker of an elastic ``horovodrun`` job (and no communicator was given)."""
    return comm is None and config.get("HOROVOD_ELASTIC") and bool(config.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"))


def _slot() -> str:
    if _Slot.key is None:
        _Slot.hostname = config.get("HOROVOD_HOSTNAME")
        local_rank = config.get("HOROVOD_LOCAL_RANK") if config.is_set("HOROVOD_LOCAL_RANK") else None
        if not _Slot.hostname or local_rank is None:
            raise RuntimeError("HOROVOD_ELASTIC is set but HOROVOD_HOSTNAME / HOROVOD_LOCAL_RANK are not: elastic "
                               "workers must be started by `horovodrun --min-np ...` or "
                               "`horovodrun --host-discovery-script ...`.")
        _Slot.key = elastic_rendezvous.slot_key(_Slot.hostname, local_rank)
    return _Slot.key


def assignment() -> Tuple[Topology, int]:
    """This worker's place in the next round, from the driver: its topology and the round number.

    Exits the process (status 0) when the driver removed this worker's slot from the job; RuntimeError when the
    job already ended; ConnectionError when the driver is gone.
    """
    slot = _slot()
    kv = elastic_rendezvous.connect_from_env()
    if kv is None:
        raise RuntimeError("HOROVOD_ELASTIC is set but the job's rendezvous (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT and "
                           "the job secret) is not: start the job with horovodrun.")
    try:
        answer = elastic_rendezvous.request_assignment(kv, slot, _Slot.last_round)
    finally:
        kv.close()
    if "exit" in answer:
        log.warning("%s has been removed from the elastic job (%s): exiting", slot, answer["exit"])
        raise SystemExit(0)
    if "end" in answer:
        raise RuntimeError(answer["end"])
    round_id = int(answer["round"])
    _Slot.last_round = round_id
    elastic_rendezvous.note_round(answer)
    topo = Topology(answer["rank"], answer["size"], answer["local_rank"], answer["local_size"],
                    answer["cross_rank"], answer["cross_size"], _Slot.hostname, SOURCE).validate()
    # As upstream, the topology variables follow the job, for programs (and horovod.run) that read them.
    os.environ.update({"HOROVOD_RANK": str(topo.rank), "HOROVOD_SIZE": str(topo.size),
                       "HOROVOD_LOCAL_RANK": str(topo.local_rank), "HOROVOD_LOCAL_SIZE": str(topo.local_size),
                       "HOROVOD_CROSS_RANK": str(topo.cross_rank), "HOROVOD_CROSS_SIZE": str(topo.cross_size)})
    log.debug("%s joins round %d as rank %d of %d", slot, round_id, topo.rank, topo.size)
    return topo, round_id


def start(start_round: Callable[[Topology, int], T]) -> Tuple[Topology, int, T]:
    """Join rounds until one forms: ``start_round(topology, round)`` connects the peers and starts the engine.

    A round that cannot form (abandoned by the driver, a peer that never connected) is reported to the driver by
    asking for the next one; other errors propagate.
    """
    while True:
        topo, round_id = assignment()
        try:
            return topo, round_id, start_round(topo, round_id)
        except (HorovodInternalError, TimeoutError, ConnectionError) as exc:
            log.warning("round %d of the elastic job could not be formed on rank %d (%s); joining the next one",
                        round_id, topo.rank, exc)


def abandoned_check(kv, round_id: int) -> Callable[[], bool]:
    """For the mesh's address exchange: has the driver given ``round_id`` up?"""
    return lambda: elastic_rendezvous.round_abandoned(kv, round_id)
