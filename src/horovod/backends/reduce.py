"""Reduction and scaling kernels on numpy buffers (each call releases the GIL inside numpy)."""
from __future__ import annotations

from typing import Dict

import ml_dtypes
import numpy as np

from horovod.common.types import ReduceOp

_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}

# The precision a scale factor is applied in, per buffer dtype: upstream's ScaleBufferCPUImpl
# (horovod/common/ops/collective_operations.{h,cc}). Integers are multiplied by the factor as a double and
# truncated back; float16 is widened to float32 and multiplied by (float)factor, then rounded to nearest even;
# float32 uses (float)factor; float64 the double. Upstream has no CPU bfloat16 (or int16) scaling: bfloat16 is
# treated like float16 (float32 arithmetic, one rounding), and every integer width like the others.
_SCALE_DTYPE: Dict[np.dtype, np.dtype] = {
    **{np.dtype(t): np.dtype(np.float64) for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32,
                                                   np.uint64, np.int64)},
    np.dtype(np.float16): np.dtype(np.float32),
    np.dtype(ml_dtypes.bfloat16): np.dtype(np.float32),
    np.dtype(np.float32): np.dtype(np.float32),
    np.dtype(np.float64): np.dtype(np.float64),
}


def ufunc(op: ReduceOp) -> np.ufunc:
    """The elementwise numpy function for a backend reduce op (Average arrives here as SUM)."""
    try:
        return _UFUNCS[ReduceOp(op)]
    except KeyError:
        raise ValueError(f"reduce op {ReduceOp(op).name} has no elementwise kernel") from None


def reduce_into(dst: np.ndarray, src: np.ndarray, op: ReduceOp) -> None:
    """``dst = dst (op) src`` in place."""
    _UFUNCS[op](dst, src, out=dst)


def combine(dst: np.ndarray, a: np.ndarray, b: np.ndarray, op: ReduceOp) -> None:
    """``dst = a (op) b``."""
    _UFUNCS[op](a, b, out=dst)


def scale_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype in which a buffer of ``dtype`` is multiplied by a scale factor (upstream's rules).

    ValueError for dtypes that cannot be scaled (bool).
    """
    compute = _SCALE_DTYPE.get(np.dtype(dtype))
    if compute is None:
        raise ValueError(f"prescale_factor and postscale_factor are not supported for {np.dtype(dtype).name} "
                         "tensors; leave them at 1.0 or cast the tensor to a numeric type.")
    return compute


def scaled_copy(dst: np.ndarray, src: np.ndarray, factor: float) -> None:
    """``dst = src * factor`` with upstream's exact numbers (see ``_SCALE_DTYPE``); a plain copy when factor is 1.

    ``dst`` may be ``src`` itself. float32 and float64 are multiplied straight into ``dst``; other dtypes are
    converted in numpy's small internal blocks, so no full-size temporary is made for any dtype. Overflow
    gives inf as upstream's C++ does (numpy also emits its usual RuntimeWarning).
    """
    if factor == 1.0:
        np.copyto(dst, src)
        return
    compute = _SCALE_DTYPE.get(dst.dtype) or scale_dtype(dst.dtype)
    np.multiply(src, compute.type(factor), out=dst, dtype=compute, casting="unsafe")


def scale_inplace(buf: np.ndarray, factor: float) -> None:
    """``buf *= factor`` with the same numbers as :func:`scaled_copy`."""
    if factor != 1.0:
        scaled_copy(buf, buf, factor)
