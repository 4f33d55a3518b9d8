"""The reduction every data plane and the fast rounds use (backends/reduce.py): parts combined in rank order, the
first two then each next into the result, then post-scaled. ``in_order`` fixes the parts once and returns the
function that reduces them into an output (a fast round keeps it for its slots); both must give the bits of the
explicit sequence below, for every count of parts, op and scale."""
import numpy as np
import pytest

from horovod.backends.reduce import in_order, reduce_in_order, scaled_copy
from horovod.common.types import ReduceOp

KERNELS = {ReduceOp.SUM: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.PRODUCT: np.multiply}


def _expected(parts, op, postscale):
    kernel = KERNELS[op]
    out = parts[0].copy()
    for part in parts[1:]:
        out = kernel(out, part)
    scaled = np.empty_like(out)
    scaled_copy(scaled, out, postscale)
    return scaled


@pytest.mark.parametrize("count", [1, 2, 3, 4])
@pytest.mark.parametrize("op", list(KERNELS))
@pytest.mark.parametrize("postscale", [1.0, 0.25, 1 / 3])
def test_in_order_gives_the_sequences_bits(count, op, postscale):
    rng = np.random.default_rng(count)
    parts = [rng.standard_normal(37).astype(np.float32) for _ in range(count)]
    want = _expected(parts, op, postscale)
    run = in_order(parts, op, postscale)
    for _ in range(2):                  # kept and called again, as a fast round does
        out = np.full(37, np.nan, np.float32)
        run(out)
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    out = np.empty(37, np.float32)
    reduce_in_order(out, parts, op, postscale)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def test_in_order_reads_the_parts_when_it_runs():
    """The parts are views of slots that change every round: the function must read them at each call."""
    parts = [np.zeros(4, np.float64), np.zeros(4, np.float64), np.zeros(4, np.float64)]
    run = in_order(parts, ReduceOp.SUM)
    out = np.empty(4)
    for step in range(3):
        for r, part in enumerate(parts):
            part[:] = 10 * step + r
        run(out)
        np.testing.assert_array_equal(out, np.full(4, 30.0 * step + 3))


def test_in_order_writes_a_strided_output():
    parts = [np.arange(6, dtype=np.int64).reshape(2, 3), np.full((2, 3), 10, np.int64)]
    out = np.zeros((2, 6), np.int64)
    in_order(parts, ReduceOp.SUM)(out[:, ::2])
    np.testing.assert_array_equal(out[:, ::2], np.arange(6).reshape(2, 3) + 10)
    np.testing.assert_array_equal(out[:, 1::2], 0)
