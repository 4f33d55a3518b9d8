"""``horovod.torch``'s integer handles: what ``*_async`` returns and ``poll``/``synchronize`` take."""
from __future__ import annotations

from typing import Any, Callable

from horovod.core.engine.handles import Handle
from horovod.core.handle_map import HandleMap


class Pending:
    """An op-layer handle plus how to turn its numpy results back into torch tensors: what the ``start_*``
    functions of ``horovod.torch.async_ops`` return. An async call registers it for an integer handle; a blocking
    call takes its :meth:`result` at once, with no handle (the map's lock and entries cost a small call more than
    a microsecond, docs/benchmarks.md)."""

    __slots__ = ("handle", "finish", "keep")

    def __init__(self, handle: Handle, finish: Callable[[Any], Any], keep: Any) -> None:
        self.handle = handle
        self.finish = finish
        self.keep = keep            # inputs and outputs stay alive until the result is taken

    def result(self) -> Any:
        """Wait for the collective and return its result as torch tensors (HorovodInternalError if it failed)."""
        return self.finish(self.handle.wait())


handle_map: HandleMap[Pending] = HandleMap()


def poll(handle: int) -> bool:
    """True once the collective behind ``handle`` has finished."""
    return handle_map.require(handle).handle.poll()


def synchronize(handle: int):
    """Wait for ``handle`` and return its output (HorovodInternalError if the collective failed)."""
    pending = handle_map.pop(handle)
    if pending is None:
        return None
    return pending.result()
