"""``horovod.tensorflow.keras.callbacks``: upstream's Keras callbacks (implemented in ``horovod._keras``)."""
from horovod._keras.callbacks import (  # noqa: F401
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)
