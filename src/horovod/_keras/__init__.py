"""The implementation shared by ``horovod.tensorflow.keras`` and ``horovod.keras`` (Keras 3, any backend):
the distributed optimizer, collectives on values, callbacks and ``load_model``."""
