"""This process's Horovod job as ``init`` left it: the state that bootstrap writes and the process-set registry
and the queries read.

One :data:`state` per process, guarded by its lock. :func:`engine` and :func:`topo` give the running engine and
this rank's topology, or upstream's ValueError when Horovod is not initialized.
"""
from __future__ import annotations

import threading
import weakref
from typing import Optional

from horovod.common import mpi_context, topology
from horovod.common.exceptions import not_initialized
from horovod.core.engine import Engine
from horovod.core.process_set_table import JobContext, ProcessSetTable
from horovod.core.process_sets import ProcessSet


class JobState:
    """What ``init`` set up: topology, engine, data-plane reason, MPI context, the registered process sets."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.topo: Optional[topology.Topology] = None
        self.engine: Optional[Engine] = None
        self.backend_reason = ""
        self.mpi: Optional[mpi_context.MPIContext] = None
        self.generation = 0
        self.atexit_registered = False
        self.job: Optional[JobContext] = None
        self.sets = ProcessSetTable()
        # The ProcessSet objects given ids in this init (invalidated at shutdown); weak, as the user owns them.
        self.bound: weakref.WeakSet[ProcessSet] = weakref.WeakSet()


state = JobState()


def engine() -> Engine:
    """The running engine; the upstream ValueError when Horovod is not initialized."""
    current = state.engine
    if current is None:
        raise not_initialized()
    return current


def topo() -> topology.Topology:
    """This rank's topology; the upstream ValueError when Horovod is not initialized."""
    if state.engine is None or state.topo is None:
        raise not_initialized()
    return state.topo
