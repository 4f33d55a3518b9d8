"""``horovod.keras.Compression.powersgd`` on each Keras backend: the TensorFlow backend gives the optimizer its
PowerSGD state (its training is checked against the reference in tests/parallel/test_tensorflow_powersgd.py);
the other backends refuse it when the optimizer is made, saying which backend and bindings support it."""
import keras
import pytest

import horovod.keras as hvd


def test_powersgd_on_this_backend():
    compression = hvd.Compression.powersgd(matrix_approximation_rank=2)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=compression)
        assert opt.powersgd_state is not None and opt.powersgd_state.settings == compression
        return
    with pytest.raises(ValueError, match=f"TensorFlow Keras backend only, not '{backend}': set "
                                         "KERAS_BACKEND=tensorflow, or use horovod.torch.DistributedOptimizer"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=compression)
