"""``horovod.keras.callbacks``: upstream's Keras callbacks (implemented in ``horovod._keras``)."""
from typing import Union

from horovod._keras import callbacks as _impl
from horovod._keras.callbacks import (  # noqa: F401
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)


class BestModelCheckpoint(_impl.BestModelCheckpoint):
    """Keep only the best model (``save_best_only=True``); upstream's ``horovod.keras`` signature (whole models)."""

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, mode: str = "auto",
                 save_freq: Union[str, int] = "epoch", filepath=None):
        super().__init__(monitor=monitor, verbose=verbose, save_weights_only=False, mode=mode, save_freq=save_freq,
                         filepath=filepath)
