"""The arrays an eager horovod.tensorflow collective writes its result into, and how a result becomes a tensor
(horovod/tensorflow/kernel.py::_eager_empty, graph_call.py::_to_tensor): aligned where DLPack may take the
array without a copy, plain below, and every dtype comes back as the tensor's."""
import ml_dtypes
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from horovod.tensorflow import graph_call, kernel  # noqa: E402


@pytest.mark.parametrize("shape", [(), (1,), (3, 5), (kernel.ALIGNED_FROM // 4 - 1,)])
def test_small_results_are_plain_arrays(shape):
    arr = kernel._eager_empty(shape, np.float32)
    assert arr.shape == shape and arr.dtype == np.float32 and arr.flags.c_contiguous and arr.flags.writeable
    assert arr.base is None         # np.empty: no oversized buffer behind it to slice and align


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, ml_dtypes.bfloat16, np.bool_])
def test_results_from_the_dlpack_threshold_are_aligned(rows, dtype):
    shape = (rows, kernel.ALIGNED_FROM // np.dtype(dtype).itemsize)
    arr = kernel._eager_empty(shape, dtype)
    assert arr.shape == shape and arr.dtype == np.dtype(dtype) and arr.flags.c_contiguous
    assert arr.ctypes.data % kernel.ALIGN == 0


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int32, tf.int64, tf.uint8, tf.float16, tf.bfloat16,
                                   tf.bool])
@pytest.mark.parametrize("count", [1, 1024, 1 << 15])
def test_a_result_becomes_a_tensor_of_its_dtype(dtype, count):
    values = (np.arange(count) % 7).astype(dtype.as_numpy_dtype)
    arr = kernel._eager_empty((count,), dtype.as_numpy_dtype)
    arr[...] = values
    tensor = graph_call._to_tensor(arr, dtype)
    assert tensor.dtype == dtype and tuple(tensor.shape) == (count,)
    np.testing.assert_array_equal(np.asarray(tensor).astype(np.float64), values.astype(np.float64))
