"""The engine: one background thread per process that negotiates and executes collectives."""
from horovod.core.engine.engine import Engine
from horovod.core.engine.entry import Entry

__all__ = ["Engine", "Entry"]
