"""Keras 3 on Spark ML: ``KerasEstimator`` trains a Keras model with Horovod, ``KerasModel`` predicts."""
from horovod.spark.keras.estimator import KerasEstimator, KerasModel

__all__ = ["KerasEstimator", "KerasModel"]
