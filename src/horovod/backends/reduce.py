"""Reduction and scaling kernels on numpy buffers (each call releases the GIL inside numpy)."""
from __future__ import annotations

import numpy as np

from horovod.common.types import ReduceOp

_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
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


def scaled_copy(dst: np.ndarray, src: np.ndarray, factor: float) -> None:
    """``dst = src * factor`` (a plain copy when factor is 1); integer results truncate, as upstream."""
    if factor == 1.0:
        np.copyto(dst, src)
    elif dst.dtype == np.bool_:
        raise ValueError("scale factors are not supported for bool tensors")
    else:
        np.multiply(src, factor, out=dst, casting="unsafe")


def scale_inplace(buf: np.ndarray, factor: float) -> None:
    if factor != 1.0:
        scaled_copy(buf, buf, factor)
