"""prescale_factor and postscale_factor through horovod.tensorflow give upstream's numbers exactly: an integer
tensor is multiplied by the factor in float64 and truncated back, float16 is multiplied in float32 and rounded
once, float32 uses the factor as a float32, float64 the double; op Average is a Sum whose postscale factor is
divided by the number of ranks first (upstream: ``postscale_factor /= size``).

Every rank's values are integers of at most 100 in magnitude, so the sum across ranks is exact in every dtype
and in any order; wherever a result does not depend on a rounded sum the comparison is bit for bit.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import horovod.tensorflow as hvd  # noqa: E402

MODES = ["eager", "function", "graph"]
DTYPES = [tf.int32, tf.int64, tf.float16, tf.float32, tf.float64]
FACTORS = [(0.7, 1.0), (1.0, 1.3), (0.7, 1.3)]
COLLECTIVES = ["allreduce", "grouped_allreduce", "reducescatter", "grouped_reducescatter"]


def values(rank, n, salt=0):
    return ((np.arange(n) * 7 + 13 * rank + salt) % 201 - 100).astype(np.float64)


def compute_dtype(dtype):
    """The precision upstream scales a buffer of ``dtype`` in."""
    if dtype.is_integer or dtype == tf.float64:
        return np.float64
    return np.float32


def scaled(x, factor, dtype):
    """Upstream's ScaleBuffer: x * factor in the compute precision, then back to ``dtype`` (truncating ints)."""
    c = compute_dtype(dtype)
    y = x.astype(c) * c(factor)
    return np.trunc(y) if dtype.is_integer else y.astype(dtype.as_numpy_dtype).astype(np.float64)


def expected(parts, dtype, op, pre, post):
    """The reduced result from every rank's values (one row per rank)."""
    stacked = np.stack([scaled(p, pre, dtype) if pre != 1.0 else p for p in parts])
    total = stacked[0]
    for part in stacked[1:]:   # the data planes reduce in rank order
        total = total + part
        if dtype == tf.float16:
            total = total.astype(np.float16).astype(np.float64)
    factor = post / len(parts) if op == hvd.Average else post
    return scaled(total, factor, dtype) if factor != 1.0 else total


def run(mode, build):
    if mode == "eager":
        out = build()
    elif mode == "function":
        out = tf.function(build)()
    else:
        with tf.Graph().as_default():
            fetches = build()
            with tf.compat.v1.Session() as sess:
                return sess.run(fetches)
    return tf.nest.map_structure(lambda t: t.numpy(), out)


def block(full, rank, size):
    rows = full.shape[0] // size
    return full[rank * rows:(rank + 1) * rows]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_scale_factors_give_upstreams_numbers(collective, dtype, mode):
    size, rank = hvd.size(), hvd.rank()
    shape = (2 * size, 17)
    n = int(np.prod(shape))
    cases = [(op, pre, post) for op in (hvd.Sum, hvd.Average) for pre, post in FACTORS]

    def tensor(salt):
        return tf.cast(tf.constant(values(rank, n, salt).reshape(shape)), dtype)

    def build():
        outs = []
        for op, pre, post in cases:
            kw = dict(op=op, prescale_factor=pre, postscale_factor=post)
            if collective == "allreduce":
                outs.append([hvd.allreduce(tensor(0), **kw)])
            elif collective == "grouped_allreduce":
                outs.append(hvd.grouped_allreduce([tensor(0), tensor(1)], **kw))
            elif collective == "reducescatter":
                outs.append([hvd.reducescatter(tensor(0), **kw)])
            else:
                outs.append(hvd.grouped_reducescatter([tensor(0), tensor(1)], **kw))
        return outs

    results = run(mode, build)
    for (op, pre, post), got in zip(cases, results):
        for salt, out in enumerate(got):
            parts = [values(r, n, salt).reshape(shape) for r in range(size)]
            want = expected(parts, dtype, op, pre, post)
            if collective.endswith("reducescatter"):
                want = block(want, rank, size)
            out = np.asarray(out)
            assert out.dtype == dtype.as_numpy_dtype
            where = f"{collective} {dtype.name} op={op} pre={pre} post={post} tensor {salt}"
            if dtype.is_integer or pre == 1.0 or size == 1:
                # exact: the only rounding is upstream's scaling, applied to an exact sum
                np.testing.assert_array_equal(out.astype(np.float64), want, err_msg=where)
            else:
                # prescaled floats are summed after rounding: the order of the sum may change the last bit
                rtol = {tf.float16: 1e-3, tf.float32: 1e-6, tf.float64: 1e-13}[dtype]
                np.testing.assert_allclose(out.astype(np.float64), want, rtol=rtol, atol=rtol, err_msg=where)


def test_integer_scaling_truncates_toward_zero():
    """7 * 0.3 = 2.1 -> 2 and -7 * 0.3 = -2.1 -> -2 (a cast from double, not a floor or a rounding)."""
    size = hvd.size()
    out = hvd.allreduce(tf.constant([7, -7, 5, -5], tf.int32), op=hvd.Sum, postscale_factor=0.3 / size)
    np.testing.assert_array_equal(out.numpy(), np.trunc(np.array([7, -7, 5, -5]) * size * (0.3 / size)))
