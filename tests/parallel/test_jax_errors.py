"""horovod.jax errors as a user sees them: cross-rank mismatches eagerly (HorovodInternalError naming the tensor
on every rank) and under jit (the same text inside JAX's runtime error), shapes a jitted program cannot have,
and local misuse (ValueError at the call). After every test a normal allreduce still works, eagerly and jitted.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import horovod.jax as hvd


@pytest.fixture(autouse=True)
def job_still_works():
    yield
    total = sum(range(hvd.size()))
    assert float(hvd.allreduce(jnp.float32(hvd.rank()), op=hvd.Sum, name="jax.errors.health")) == total
    assert float(jax.jit(lambda x: hvd.allreduce(x, op=hvd.Sum))(jnp.float32(hvd.rank()))) == total


def needs_peers():
    if hvd.size() == 1:
        pytest.skip("a cross-rank mismatch needs at least two ranks")


def test_mismatched_shapes_eagerly_name_the_tensor_on_every_rank():
    needs_peers()
    shape = (2, 3) if hvd.rank() == 0 else (3, 3)
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.allreduce(jnp.ones(shape), name="jax.mismatch")
    assert "allreduce.jax.mismatch" in str(info.value) and "shape" in str(info.value).lower(), str(info.value)


def test_mismatched_shapes_under_jit_carry_the_same_message():
    needs_peers()
    shape = (2,) if hvd.rank() == 0 else (4,)
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.jit(lambda x: hvd.allreduce(x, name="jax.jit.mismatch"))(jnp.ones(shape)).block_until_ready()
    assert "HorovodInternalError" in str(info.value) and "allreduce.jax.jit.mismatch" in str(info.value)


def test_allgather_under_jit_with_different_first_dims_names_them():
    needs_peers()
    rows = 1 if hvd.rank() == 0 else 2
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.jit(hvd.allgather)(jnp.ones((rows, 2))).block_until_ready()
    expected = [1] + [2] * (hvd.size() - 1)
    assert (f"allgather inside jax.jit needs the same first dimension on every rank (the output shape is fixed "
            f"when the program is traced), got first dimensions {expected}") in str(info.value), str(info.value)


def test_alltoall_splits_under_jit_are_refused_when_traced():
    with pytest.raises(ValueError, match="alltoall with splits= cannot run inside jax.jit"):
        jax.jit(lambda x: hvd.alltoall(x, splits=[1] * hvd.size()))(jnp.ones((hvd.size(), 2)))


def test_local_misuse_raises_value_error_at_the_call():
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(jnp.ones(2, jnp.complex64))
    with pytest.raises(ValueError, match="not supported"):
        jax.jit(hvd.allreduce)(jnp.ones(2, jnp.complex64))
    with pytest.raises(ValueError, match="expects a jax.Array"):
        hvd.allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match="at least one dimension"):
        jax.jit(hvd.allgather)(jnp.float32(1))
    with pytest.raises(ValueError, match="Average is not defined for bool"):
        hvd.allreduce(np.ones(2, bool))
