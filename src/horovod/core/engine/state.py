"""The engine's life cycle, explicit: running, stopping (a shutdown was asked for), aborting (a failure is being
reported to the peers), stopped (for a reason)."""
from __future__ import annotations

import enum


class EngineState(enum.Enum):
    """Where an engine is; it only ever moves forward: RUNNING -> STOPPING -> STOPPED after a shutdown, and
    RUNNING or STOPPING -> ABORTING -> STOPPED after a failure.

    - RUNNING: collectives are accepted and executed.
    - STOPPING: ``shutdown()`` was called; the engine tells its peers and ends its thread.
    - ABORTING: a peer was lost or a collective failed; the engine looks for the root cause (an abort message
      already on its way), tells the peers it can reach, then fails everything. Nothing more is executed.
    - STOPPED: the engine thread ended; every pending and later handle fails with the reason.
    """

    RUNNING = "running"
    STOPPING = "stopping"
    ABORTING = "aborting"
    STOPPED = "stopped"
