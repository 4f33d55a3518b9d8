"""Who hears of every engine of this process starting and stopping.

What watches every engine of a process (the data-plane watchdog, :mod:`horovod.core.observers.watchdog`)
registers a listener here; the engine calls :func:`tell` as it starts and once it has stopped, and knows nothing
of its listeners.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, List

log = logging.getLogger(__name__)

Listener = Callable[[Any, bool], None]       # (the engine, True when it started / False when it stopped)
_listeners: List[Listener] = []


def on_lifecycle(listener: Listener) -> None:
    """Have ``listener`` called as every engine of this process starts and stops."""
    if listener not in _listeners:
        _listeners.append(listener)


def tell(engine: Any, started: bool) -> None:
    """An engine started (``started``) or has stopped: tell every listener (a failing one is logged and skipped)."""
    for listener in list(_listeners):
        try:
            listener(engine, started)
        except Exception:
            log.debug("an engine lifecycle listener failed", exc_info=True)
