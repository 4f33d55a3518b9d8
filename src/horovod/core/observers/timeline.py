"""The timeline as an engine observer: the engine's hooks become the timeline's events.

The writer itself is :class:`horovod.common.timeline.Timeline` (in the shared ground, because the data planes
mark their activities on it). Only rank 0 records; on other ranks :func:`start_timeline` does nothing.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

from horovod.common.timeline import Timeline, executing
from horovod.common.types import numpy_dtype
from horovod.core.controller import Coordinator
from horovod.core.controller.messages import TensorResponse
from horovod.core.engine import Engine
from horovod.core.engine.observer import EngineObserver


class TimelineObserver(EngineObserver):
    """Records negotiations (through the coordinator), cycles, executions and errors into one timeline. The
    global set's observer owns the file; process sets coordinated on the same rank record into it too."""

    def __init__(self, timeline: Timeline, owner: bool = True) -> None:
        self.timeline = timeline
        self.owner = owner

    def attach(self, coordinator: Optional[Coordinator]) -> None:
        if coordinator is not None:
            coordinator.timeline = self.timeline

    def detach(self, coordinator: Optional[Coordinator]) -> None:
        if coordinator is not None and coordinator.timeline is self.timeline:
            coordinator.timeline = None

    def on_cycle(self) -> None:
        self.timeline.cycle()

    def on_batch_start(self, names: List[str]) -> None:
        executing(self.timeline, names)     # the data plane marks its activities on this timeline

    def on_batch_end(self, batch: List[TensorResponse], now_ns: int) -> None:
        executing(None, [])
        timeline = self.timeline
        for response in batch:
            timeline.end_op(response.name, numpy_dtype(response.dtype).name, response.shape, now_ns)
        timeline.flush_soon()               # a finished op shows up in the file at once

    def on_error(self, names: List[str], message: str) -> None:
        for name in names:
            self.timeline.end_error(name, message)
        self.timeline.flush_soon()

    def close(self) -> None:
        if self.owner:
            self.timeline.close()


def recording(engine: Engine) -> Optional[TimelineObserver]:
    """The timeline ``engine`` records to, if any."""
    return engine.find_observer(TimelineObserver)


def start_timeline(engine: Engine, path: str, mark_cycles: bool = False, sets: Sequence[Engine] = ()) -> None:
    """Record a timeline to ``path`` (rank 0 writes it; other ranks have nothing to record), replacing the one
    being recorded. ``sets``: this rank's process-set engines; those it coordinates record into the same file."""
    if engine.coordinator is None:
        return
    timeline = Timeline(path, mark_cycles)
    old = _replace(engine, TimelineObserver(timeline))
    for other in sets:
        share(other, timeline)
    if old is not None:
        old.close()


def share(engine: Engine, timeline: Timeline) -> None:
    """Have a process set's engine record into ``timeline`` (a no-op where this rank does not coordinate it)."""
    if engine.coordinator is not None:
        _replace(engine, TimelineObserver(timeline, owner=False))


def _replace(engine: Engine, observer: TimelineObserver) -> Optional[TimelineObserver]:
    """Have ``observer`` record instead of the timeline observer watching ``engine`` (returned, not closed);
    the new one is added first, so that nothing goes unrecorded in between."""
    old = recording(engine)
    engine.add_observer(observer)
    if old is not None:
        engine.remove_observer(old)
    return old


def stop_timeline(engine: Engine, sets: Sequence[Engine] = ()) -> None:
    """Stop recording and close the file (a no-op when no timeline records); the process sets' observers go
    first, and only the global set's owns the file."""
    for current in (*sets, engine):
        old = recording(current)
        if old is not None:
            current.remove_observer(old)
            old.close()
