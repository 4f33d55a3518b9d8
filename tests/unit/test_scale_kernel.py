"""The scaling kernel every data plane applies prescale and postscale factors with (backends/reduce.py).

Its numbers must be upstream's (ScaleBufferCPUImpl in horovod/common/ops/collective_operations.{h,cc}):
integers are multiplied by the factor as a double and truncated toward zero; float16 (and, by our choice,
bfloat16) is widened to float32, multiplied by (float)factor and rounded once; float32 uses (float)factor;
float64 the double. The references below compute element by element with numpy scalars and Python floats, a
different code path from the kernel's vectorised one.
"""
import math
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from horovod.backends.reduce import scale_dtype, scale_inplace, scaled_copy

INT_DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64]
HALF_DTYPES = [np.float16, ml_dtypes.bfloat16]
FACTORS = [0.1, 0.7392813412, 1 / 3, 2.5, 1e-3, -0.6]
N = 4099                                     # not a multiple of any vector width


def name(dtype):
    return np.dtype(dtype).name


def values(dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        lo, hi = max(int(info.min), -100_000), min(int(info.max), 100_000)
        return rng.integers(lo, hi, N, endpoint=True).astype(dtype)
    return (rng.standard_normal(N) * 100).astype(dtype)


def reference(x, factor):
    """Element by element, the way upstream's C++ loop computes it."""
    dtype = x.dtype
    out = np.empty_like(x)
    for i, v in enumerate(x.tolist()):
        if np.issubdtype(dtype, np.integer):
            exact = float(v) * float(factor)                          # double arithmetic, like C++
            out[i] = np.array(math.trunc(exact)).astype(dtype)       # truncation toward zero, then the C cast
        elif dtype in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
            out[i] = dtype.type(np.float32(v) * np.float32(factor))  # float32 product, one rounding to half
        elif dtype == np.dtype(np.float32):
            out[i] = np.float32(v) * np.float32(factor)
        else:
            out[i] = float(v) * float(factor)
    return out


def bits(a):
    return a.view(np.uint8)


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("dtype", INT_DTYPES + HALF_DTYPES + [np.float32, np.float64], ids=name)
def test_scaled_copy_gives_upstreams_numbers(dtype, factor):
    x = values(dtype)
    if factor < 0 and not np.issubdtype(np.dtype(dtype), np.signedinteger) \
            and np.issubdtype(np.dtype(dtype), np.integer):
        x = np.zeros_like(x)                 # a negative factor on unsigned data is undefined in C++ too
    expected = reference(x, factor)
    out = np.empty_like(x)
    scaled_copy(out, x, factor)
    assert np.array_equal(bits(out), bits(expected)), \
        f"{np.count_nonzero(out != expected)} of {N} elements differ from upstream's numbers"
    inplace = x.copy()
    scale_inplace(inplace, factor)
    assert np.array_equal(bits(inplace), bits(expected))


def test_integers_truncate_toward_zero():
    x = np.array([-7, -5, -1, 0, 1, 5, 7], np.int32)
    out = np.empty_like(x)
    scaled_copy(out, x, 0.5)
    assert out.tolist() == [-3, -2, 0, 0, 0, 2, 3]


def test_int64_is_scaled_in_double():
    x = np.array([2 ** 53 + 1, -(2 ** 53) - 1, 3], np.int64)
    out = np.empty_like(x)
    scaled_copy(out, x, 1.5)
    # (2**53 + 1) is not a double: it becomes 2**53 before the multiplication, as in upstream's C++.
    assert out.tolist() == [3 * 2 ** 52, -3 * 2 ** 52, 4]


def test_float16_factor_is_not_rounded_to_half_first():
    # 5 * (float)0.7392813412 = 3.69640684... rounds to 3.697265625 in half. float16 arithmetic would first
    # round the factor to half (0.7392578125): 3.69628906... which rounds to 3.6953125 instead.
    x = np.array([5.0], np.float16)
    out = np.empty_like(x)
    scaled_copy(out, x, 0.7392813412)
    assert float(out[0]) == 3.697265625
    assert float(np.float16(x[0] * np.float16(0.7392813412))) == 3.6953125


def test_float32_uses_the_factor_rounded_to_float():
    x = np.array([3.0], np.float32)
    out = np.empty_like(x)
    scaled_copy(out, x, 0.1)
    assert out[0] == np.float32(3.0) * np.float32(0.1)
    assert float(out[0]) != 3.0 * 0.1


def test_factor_one_copies_every_dtype_bit_for_bit():
    for dtype in INT_DTYPES + HALF_DTYPES + [np.float32, np.float64, np.bool_]:
        x = values(np.int8, 3).astype(dtype) if dtype is np.bool_ else values(dtype, 3)
        out = np.empty_like(x)
        scaled_copy(out, x, 1.0)
        assert np.array_equal(bits(out), bits(x))


def test_bool_cannot_be_scaled():
    x = np.ones(4, np.bool_)
    with pytest.raises(ValueError, match="bool"):
        scaled_copy(np.empty_like(x), x, 0.5)
    with pytest.raises(ValueError, match="bool"):
        scale_dtype(np.bool_)


def test_special_values_survive_scaling():
    for dtype in HALF_DTYPES + [np.float32, np.float64]:
        x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], dtype)
        out = np.empty_like(x)
        scaled_copy(out, x, 0.5)
        assert np.isposinf(out[0]) and np.isneginf(out[1]) and np.isnan(out[2])
        assert out[3] == 0 and not np.signbit(out[3]) and np.signbit(out[4])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_half_overflow_and_underflow_round_like_ieee():
    big = np.array([60000.0], np.float16)
    out = np.empty_like(big)
    scaled_copy(out, big, 2.0)
    assert np.isposinf(out[0])
    tiny = np.array([6.1e-5], np.float16)             # the smallest normal half; halved it is subnormal
    scaled_copy(out, tiny, 0.5)
    assert out[0] == np.float16(np.float32(tiny[0]) * np.float32(0.5)) and out[0] > 0


@pytest.mark.parametrize("dtype", INT_DTYPES + HALF_DTYPES + [np.float32, np.float64], ids=name)
def test_no_full_size_temporary(dtype):
    x = np.ones(1 << 20, dtype)                        # 1 to 8 MB
    out = np.empty_like(x)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        scaled_copy(out, x, 0.5)
        scale_inplace(out, 3.0)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < x.nbytes // 4, f"scaling allocated {peak} bytes for a {x.nbytes}-byte buffer"
