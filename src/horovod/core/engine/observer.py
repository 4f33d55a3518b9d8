"""What the engine tells those who watch it: the timeline, the stall inspector and deadlock detector, the
autotuner, the flight recorder. The engine calls these hooks on its own thread and knows nothing else of its
observers. (The flight recorder's records themselves are written by the engine directly, see flight.py: a batch
hook would cost every collective a call, and turn the fast rounds off.)

Every hook does nothing by default, so an observer implements only what it needs. Hooks must be quick: they run
between collectives. A hook may raise :class:`~horovod.common.exceptions.HorovodInternalError` to end the job
(the stall inspector's shutdown does); the engine then aborts on every rank with that message.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

from horovod.core.controller import Coordinator
from horovod.core.controller.messages import TensorResponse


class EngineObserver:
    """Base class of engine observers (see the module docstring)."""

    def attach(self, coordinator: Optional[Coordinator]) -> None:
        """The observer was added to an engine; ``coordinator`` is rank 0's negotiation, None on other ranks."""

    def detach(self, coordinator: Optional[Coordinator]) -> None:
        """The observer was removed from the engine."""

    def on_cycle(self) -> None:
        """Rank 0 is about to emit a response list (a negotiation cycle)."""

    def on_batch_start(self, names: List[str]) -> None:
        """This rank starts executing one (possibly fused) collective over ``names``."""

    def on_batch_end(self, batch: List[TensorResponse], now_ns: int) -> None:
        """The collective over ``batch`` ended (successfully or not) at ``now_ns`` (perf_counter_ns)."""

    def on_error(self, names: List[str], message: str) -> None:
        """The coordinator failed ``names`` with ``message`` (mismatched requests, for example)."""

    def on_incident(self, kind: str, message: str) -> None:
        """Every rank: the job is in trouble. ``kind`` is "abort" (this engine aborts with ``message``; called
        before any pending handle fails) or "report" (a stall or deadlock report). Observers that keep records
        write them out (the flight recorder does); must not raise."""

    def inspect(self, coordinator: Coordinator, now: float, report: Callable[[str], None]) -> Optional[float]:
        """Rank 0, while some tensors are submitted by only part of the ranks: look at them. ``report`` logs a
        message on every rank. Returns the seconds until this observer wants to look again (None: no need)."""
        return None

    def propose(self, now: float) -> Optional[dict]:
        """Rank 0, after a response list ran: new tunables for every rank (see ``Engine.set_params``), or None."""
        return None

    @property
    def finished(self) -> bool:
        """True once the observer has nothing more to do; the engine then closes and drops it."""
        return False

    def close(self) -> None:
        """The engine stopped (or dropped this observer): release what it holds."""


def _implementing(observers: Sequence[EngineObserver], *hooks: str) -> Tuple[EngineObserver, ...]:
    """The observers whose class overrides one of ``hooks`` (the base class's are no-ops)."""
    return tuple(o for o in observers
                 if any(getattr(type(o), hook) is not getattr(EngineObserver, hook) for hook in hooks))


@dataclasses.dataclass(frozen=True)
class Hooks:
    """An engine's observers, and for each hook the ones that implement it: a hook nobody implements costs
    nothing between collectives (rank 0's stall inspector only inspects, so batches still run unobserved).
    Replaced as a whole when an observer comes or goes, never mutated: the engine thread reads it unlocked."""

    all: Tuple[EngineObserver, ...] = ()
    cycle: Tuple[EngineObserver, ...] = ()
    batch: Tuple[EngineObserver, ...] = ()
    error: Tuple[EngineObserver, ...] = ()
    incident: Tuple[EngineObserver, ...] = ()
    inspect: Tuple[EngineObserver, ...] = ()
    propose: Tuple[EngineObserver, ...] = ()

    @classmethod
    def of(cls, observers: Sequence[EngineObserver]) -> Hooks:
        observers = tuple(observers)
        return cls(observers, cycle=_implementing(observers, "on_cycle"),
                   batch=_implementing(observers, "on_batch_start", "on_batch_end"),
                   error=_implementing(observers, "on_error"), incident=_implementing(observers, "on_incident"),
                   inspect=_implementing(observers, "inspect"),
                   propose=_implementing(observers, "propose", "finished"))
