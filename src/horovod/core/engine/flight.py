"""The flight recorder's memory: the last collectives this rank took part in, one ring per process set.

Each engine (one per process set) keeps a :class:`FlightRing` of ``HOROVOD_FLIGHT_RECORDER_SIZE`` records. A
record is a small list made when the op layer submits a collective, under the engine lock the submission takes
anyway (one ``deque`` append, which drops the oldest record once the ring is full), and numbered per process set:
every collective this rank submitted to the set counts, so ranks that submit the same collectives number them
alike. The engine thread then writes the wall-clock time of each later state into it (negotiated: the
coordinator's response list arrived, or a fast round matched; started and done: the executor ran it; failed).
The record holds the request (name, op, dtype, shape, ...) by reference, never the buffers, and nothing is
formatted until the recorder writes it out (``horovod.core.observers.flight_recorder``), which reads every live
ring through :func:`rings`.
"""
from __future__ import annotations

import collections
import time
from typing import Callable, Deque, Dict, Iterable, List, Optional, Sequence

from horovod.common.types import RequestType

# A record's fields, by index.
SEQ, REQUEST, NBYTES, SUBMITTED, NEGOTIATED, STARTED, DONE, FAILED, PLANE, ERROR = range(10)
FAST_ROUND = "fast round"
_REDUCING = (RequestType.ALLREDUCE, RequestType.REDUCESCATTER)
_NO_DATA = (RequestType.BARRIER, RequestType.JOIN)

# process set id -> the ring of its newest engine on this rank. No lock: a signal handler reads it (the flight
# recorder's SIGUSR1), and single dict operations are atomic.
_rings: Dict[int, FlightRing] = {}


def plane_namer(backend) -> Callable[[int, int], str]:
    """``(request type, bytes) -> data plane name`` for ``backend``; a routed backend picks its plane by size, as
    :class:`horovod.backends.routed.RoutedBackend` does. Keeps names and thresholds only, never the backend."""
    name = getattr(backend, "name", type(backend).__name__)
    small, large = getattr(backend, "small", None), getattr(backend, "large", None)
    if small is None or large is None:
        return lambda rtype, nbytes: name
    small_name, large_name = small.name, large.name
    reduce_max, move_max = backend.reduce_max, backend.move_max

    def routed(rtype: int, nbytes: int) -> str:
        limit = reduce_max if rtype in _REDUCING else move_max
        return small_name if nbytes <= limit else large_name

    return routed


class FlightRing:
    """The last ``capacity`` collectives of one process set on this rank (see the module docstring)."""

    def __init__(self, capacity: int, process_set_id: int, ranks: Sequence[int], rank: int,
                 plane: Callable[[int, int], str]) -> None:
        self.capacity = capacity
        self.process_set_id = process_set_id
        self.ranks = list(ranks)            # the set's global ranks, by position
        self.rank = rank                    # this rank's position in the set
        self.plane = plane
        self.records: Deque[list] = collections.deque(maxlen=capacity)
        self.count = 0                      # collectives submitted to the set so far (the last sequence number)
        self.closed_at: Optional[float] = None
        _rings[process_set_id] = self

    @property
    def global_rank(self) -> int:
        return self.ranks[self.rank]

    def submit(self, entries: Iterable, now: float) -> None:
        """Record a submission of ``entries`` (engine lock held): one record each, kept on the entry."""
        append = self.records.append
        for entry in entries:
            self.count += 1
            tensor = entry.tensor
            record = [self.count, entry.request, 0 if tensor is None else tensor.nbytes, now,
                      None, None, None, None, None, None]
            append(record)
            entry.flight = record

    def snapshot(self) -> List[list]:
        """A copy of every record, oldest first (any thread; never blocks the engine)."""
        return [record[:] for record in tuple(self.records)]

    def plane_of(self, record: list) -> str:
        """The data plane that ran (or would run) ``record``'s collective."""
        if record[PLANE] is not None:
            return record[PLANE]
        rtype = record[REQUEST][1]
        if rtype in _NO_DATA:
            return "coordinator"
        return self.plane(rtype, record[NBYTES])

    def close(self) -> None:
        """The engine stopped; its records stay readable until a new engine of the set replaces them."""
        self.closed_at = time.time()


def rings() -> List[FlightRing]:
    """The rings of this process, by process set id."""
    return [ring for _, ring in sorted(list(_rings.items()), key=lambda item: item[0])]


# -------------------------------------------------------------------------- the engine thread's updates
def started(entries: Sequence, arrived: Optional[float], now: float) -> None:
    """``entries`` (None where this rank joined) were negotiated at ``arrived`` and start now."""
    for entry in entries:
        record = entry.flight if entry is not None else None
        if record is not None:
            record[NEGOTIATED] = arrived if arrived is not None else now
            record[STARTED] = now


def done(entries: Sequence, now: float) -> None:
    for entry in entries:
        record = entry.flight if entry is not None else None
        if record is not None:
            record[DONE] = now


def completed(entries: Sequence, arrived: Optional[float], now: float) -> None:
    """``entries`` were negotiated at ``arrived`` and completed with no data plane (a join)."""
    started(entries, arrived, now)
    done(entries, now)


def failed(entries: Iterable, now: float, message: str) -> None:
    """``entries`` failed with ``message`` (the first failure of each is kept)."""
    for entry in entries:
        record = entry.flight if entry is not None else None
        if record is not None and record[FAILED] is None:
            record[FAILED] = now
            record[ERROR] = message


def fast_round(record: Optional[list], now: float) -> None:
    """A fast round matched and reduced ``record``'s allreduce, without the coordinator."""
    if record is not None:
        record[NEGOTIATED] = record[STARTED] = record[DONE] = now
        record[PLANE] = FAST_ROUND
