"""horovod.jax's hand-over between JAX and numpy, and the host-call switch between eager and traced calls, in
one process (no Horovod job needed)."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from horovod.core.engine.output_pool import OutputPool
from horovod.jax.arrays import COPY_BELOW, check_array, is_traced, to_jax, to_numpy, tracing
from horovod.jax.host_calls import call_on_host


def test_to_numpy_reads_a_jax_array_without_copying_and_keeps_zero_dims():
    x = jnp.arange(6.0).reshape(2, 3)
    view = to_numpy(x)
    assert view.shape == (2, 3) and not view.flags.writeable and not view.flags.owndata
    assert to_numpy(jnp.float32(2)).shape == ()


def test_to_jax_shares_writable_numeric_memory_and_copies_the_rest():
    out = OutputPool(1 << 26).empty((1 << 20,), np.float32)   # a large output, as the op layer makes it
    out[:] = 0
    shared = to_jax(out)
    assert shared.unsafe_buffer_pointer() == out.ctypes.data, "the result should share the op layer's memory"
    out[0] = 7                                          # the op layer never writes a returned output again
    assert float(shared[0]) == 7
    bf16 = to_jax(np.ones(3, ml_dtypes.bfloat16))       # DLPack has no bfloat16: copied
    assert bf16.dtype == jnp.bfloat16 and float(bf16.sum()) == 3
    frozen = np.ones(2, np.int32)
    frozen.flags.writeable = False
    assert to_jax(frozen).tolist() == [1, 1]


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.bool_, ml_dtypes.bfloat16])
@pytest.mark.parametrize("count", [1, 1024, COPY_BELOW // 8 - 1])
def test_to_jax_copies_small_results(dtype, count):
    """Below COPY_BELOW a copy is cheaper than DLPack's import: the JAX array has its own memory, the values and
    the dtype device_put gives."""
    out = (np.arange(count) % 5).astype(dtype)
    got = to_jax(out)
    assert got.dtype == jax.device_put(out).dtype and got.shape == (count,)
    assert got.unsafe_buffer_pointer() != out.ctypes.data
    np.testing.assert_array_equal(np.asarray(got).astype(np.float64), out.astype(np.float64))


def test_check_array_accepts_numpy_and_scalars_and_names_the_fix_otherwise():
    assert isinstance(check_array(np.ones(2), "allreduce"), jax.Array)
    assert isinstance(check_array(3.0, "allreduce"), jax.Array)
    with pytest.raises(ValueError, match="allreduce expects a jax.Array .* convert it with jnp.asarray"):
        check_array([1, 2], "allreduce")


def test_call_on_host_runs_now_eagerly_and_as_an_ordered_callback_under_jit():
    seen = []

    def double(a):
        seen.append(type(a))
        return [a * 2]

    def fn(x):
        return call_on_host(double, [x], [jax.ShapeDtypeStruct(x.shape, x.dtype)])[0]

    assert fn(jnp.ones(2)).tolist() == [2, 2]
    assert jax.jit(fn)(jnp.ones(2)).tolist() == [2, 2]
    assert seen == [np.ndarray, np.ndarray]


def test_call_on_host_under_jit_refuses_a_shape_the_trace_did_not_assume():
    def fn(x):
        return call_on_host(lambda a: [np.ones(3, np.float32)], [x], [jax.ShapeDtypeStruct(x.shape, x.dtype)])[0]

    with pytest.raises(jax.errors.JaxRuntimeError, match=r"returned shape \(3,\) where \(2,\) was traced"):
        jax.jit(fn)(jnp.ones(2, jnp.float32)).block_until_ready()


def test_tracing_is_seen_with_and_without_array_arguments():
    assert not tracing() and not is_traced(jnp.ones(1))
    assert jax.jit(lambda: jnp.int32(tracing()))() == 1
    assert jax.jit(lambda x: jnp.int32(is_traced(x)))(jnp.ones(1)) == 1
