"""The Keras elastic callbacks (upstream's ``horovod/_keras/elastic.py``), shared by ``horovod.tensorflow.keras``
and ``horovod.keras``: commit the state every few batches, and keep ``state.batch`` / ``state.epoch`` current so
that training resumes where it stopped after a reset. Like the other callbacks here, each works with Keras 3
(any backend) and with tf-keras's ``model.fit``."""
from __future__ import annotations

from typing import Any, Optional

from horovod._keras.callbacks import _Callback


class CommitStateCallback(_Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at the end of every epoch."""

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self.batches_remaining = self.batches_per_commit      # every rank counts from the same point after a sync

    def on_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(_Callback):
    """Keep ``state.batch`` at the last finished batch (0 after each epoch). With ``steps_per_epoch``, the first
    epoch after a reset is shortened by the batches already done."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: Optional[int] = None

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(_Callback):
    """Keep ``state.epoch`` at the number of finished epochs across resets (Keras counts from 0 in each fit)."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        # +1: a reset after state.batch went back to 0 must not repeat the finished epoch.
        self.state.epoch = self.initial_epoch + epoch + 1
