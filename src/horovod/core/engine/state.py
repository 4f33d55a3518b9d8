"""The engine's life cycle, explicit: running, stopping (a shutdown was asked for), stopped (for a reason)."""
from __future__ import annotations

import enum


class EngineState(enum.Enum):
    """Where an engine is; it only ever moves forward (RUNNING -> STOPPING -> STOPPED, or RUNNING -> STOPPED).

    - RUNNING: collectives are accepted and executed.
    - STOPPING: ``shutdown()`` was called; the engine tells its peers and ends its thread.
    - STOPPED: the engine thread ended or aborted; every pending and later handle fails with the reason.
    """

    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
