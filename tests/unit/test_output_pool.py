"""The pool that backs collectives' new outputs: memory comes back only once nothing can reach it."""
import numpy as np
import pytest

from horovod.core.engine.output_pool import ALIGNMENT, MIN_POOLED_BYTES, OutputPool

BIG = 4 * MIN_POOLED_BYTES


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_a_dropped_output_is_reused_with_the_asked_shape_and_dtype():
    pool = OutputPool(64 * MIN_POOLED_BYTES)
    first = pool.empty((BIG // 4,), np.float32)
    where = address(first)
    del first
    again = pool.empty((BIG // 8 // 4, 4), np.float64)
    assert address(again) == where and again.shape == (BIG // 32, 4) and again.dtype == np.float64
    assert again.flags.c_contiguous and again.flags.writeable


@pytest.mark.parametrize("keep", ["view", "view of a view", "memoryview", "torch"])
def test_memory_still_reachable_is_never_handed_out_again(keep):
    pool = OutputPool(64 * MIN_POOLED_BYTES)
    first = pool.empty((BIG // 4,), np.float32)
    first[:] = 7
    if keep == "view":
        held = first[10:]
    elif keep == "view of a view":
        held = first[10:].reshape(-1)[::2]
    elif keep == "memoryview":
        held = memoryview(first)
    else:
        torch = pytest.importorskip("torch")
        held = torch.from_numpy(first)
    del first
    second = pool.empty((BIG // 4,), np.float32)
    second[:] = 1
    assert np.asarray(held).min() == 7                 # untouched: second has other memory
    del held
    assert pool.idle_bytes() == BIG                     # the first buffer is free now, the second in use


def test_small_arrays_and_a_zero_capacity_bypass_the_pool():
    pool = OutputPool(64 * MIN_POOLED_BYTES)
    small = pool.empty((16,), np.float32)
    assert small.base is None
    off = OutputPool(0)
    assert off.empty((BIG,), np.uint8).base is None


def test_idle_memory_stays_within_the_capacity():
    pool = OutputPool(3 * BIG)
    arrays = [pool.empty((BIG,), np.uint8) for _ in range(4)]   # all in use: the pool may exceed it meanwhile
    del arrays
    assert pool.idle_bytes() == 4 * BIG
    reused = pool.empty((BIG,), np.uint8)                  # takes an idle one: nothing to evict
    assert pool.idle_bytes() == 3 * BIG
    bigger = pool.empty((3 * BIG // 2,), np.uint8)         # fits no idle buffer: the oldest idle ones go
    assert pool.idle_bytes() == BIG                        # idle + the new one within 3 * BIG
    del reused, bigger
    assert pool.idle_bytes() == BIG + BIG + 3 * BIG // 2
    assert sorted(pool._starts) == sorted(map(id, pool._buffers))     # a forgotten buffer's start goes too


@pytest.mark.parametrize("nbytes", [BIG, BIG + 8, 3 * BIG // 2 + 4])
def test_pooled_outputs_start_on_a_64_byte_boundary_new_and_reused(nbytes):
    # XLA (horovod.jax's DLPack hand-over) uses a host buffer in place only when it is 64-byte aligned.
    pool = OutputPool(64 * MIN_POOLED_BYTES)
    first = pool.empty((nbytes // 4,), np.float32)
    assert address(first) % ALIGNMENT == 0 and first.nbytes == nbytes // 4 * 4
    del first
    again = pool.empty((nbytes // 4,), np.float32)
    assert address(again) % ALIGNMENT == 0
