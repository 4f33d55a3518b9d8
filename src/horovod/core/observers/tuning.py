"""The autotuner as an engine observer: it counts what rank 0 executes and proposes new tunables."""
from __future__ import annotations

from typing import List, Optional

from horovod.common.types import numpy_dtype
from horovod.core.controller.messages import TensorResponse
from horovod.core.engine.observer import EngineObserver
from horovod.core.observers.autotune import Autotuner


class AutotuneObserver(EngineObserver):
    """Feeds :class:`Autotuner` the tensors and bytes each response list ran; the engine broadcasts what it
    proposes, and drops the observer once tuning is done."""

    def __init__(self, tuner: Autotuner) -> None:
        self.tuner = tuner
        self._names: List[str] = []       # executed since the tuner last looked
        self._bytes = 0

    def on_batch_end(self, batch: List[TensorResponse], now_ns: int) -> None:
        self._names.extend(r.name for r in batch)
        self._bytes += sum(r.numel() * numpy_dtype(r.dtype).itemsize for r in batch)

    def propose(self, now: float) -> Optional[dict]:
        names, self._names = self._names, []
        nbytes, self._bytes = self._bytes, 0
        return self.tuner.record(names, nbytes, now)

    @property
    def finished(self) -> bool:
        return self.tuner.done

    def close(self) -> None:
        self.tuner.close()


def tuning(engine) -> Optional[AutotuneObserver]:
    """The autotuner still tuning ``engine`` (rank 0), if any."""
    return engine.find_observer(AutotuneObserver)
