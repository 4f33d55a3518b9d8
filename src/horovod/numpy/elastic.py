"""``horovod.numpy.elastic``: elastic training for programs on plain arrays (this project's; upstream has no numpy
binding): ``run`` and an ``ObjectState`` whose attributes are synced with ``broadcast_object``."""
from __future__ import annotations

from typing import Any, Callable

from horovod.common import elastic as _elastic
from horovod.common.elastic import run_fn
from horovod.core import basics
from horovod.core.ops import broadcast_object

__all__ = ["ObjectState", "run"]


class ObjectState(_elastic.ObjectState):
    """State made of picklable objects given as keyword arguments (arrays included), synced from rank 0."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(bcast_object=lambda obj: broadcast_object(obj, 0, "elastic.state"), get_rank=basics.rank,
                         **kwargs)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, ...)`` to keep running as workers come and go (see :mod:`horovod.common.elastic`)."""
    return run_fn(func, _reset)


def _reset() -> None:
    basics.shutdown()
    basics.init()
