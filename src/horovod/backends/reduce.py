"""Reduction and scaling kernels on numpy buffers (each call releases the GIL inside numpy)."""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

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


def reduce_in_order(out: np.ndarray, parts: Sequence[np.ndarray], op: ReduceOp, postscale: float = 1.0) -> None:
    """``out`` = every rank's ``parts`` (in rank order; already prescaled) combined with ``op``, first two
    combined then each next reduced in, and scaled by ``postscale``: the data plane's order and kernels, so its
    bits. ``op`` is the backend op (Average arrives as SUM, its division in ``postscale``)."""
    in_order(parts, op, postscale)(out)


def in_order(parts: Sequence[np.ndarray], op: ReduceOp, postscale: float = 1.0) -> Callable[[np.ndarray], None]:
    """:func:`reduce_in_order` with everything but the output fixed: a function that reduces ``parts`` into the
    output it is given. A fast round reduces the same slots every other round, and inside a round the steps of
    the general call (the op's kernel looked up, the scale checked) cost more than the reduction of a small
    tensor (docs/benchmarks.md, issue 31)."""
    kernel = _UFUNCS[op]
    first, rest = parts[0], list(parts[1:])
    if not rest:
        def run(out: np.ndarray) -> None:
            np.copyto(out, first)
            scale_inplace(out, postscale)
    elif len(rest) == 1 and postscale == 1.0:
        second = rest[0]

        def run(out: np.ndarray) -> None:
            kernel(first, second, out=out)
    else:
        second, others = rest[0], rest[1:]

        def run(out: np.ndarray) -> None:
            kernel(first, second, out=out)
            for part in others:
                kernel(out, part, out=out)
            scale_inplace(out, postscale)
    return run


def reduce_pieces(rank: int, size: int, own: np.ndarray, out: np.ndarray, op: ReduceOp, prescale: float,
                  postscale: float, piece: int, scratch: Callable[[int, int], np.ndarray],
                  read: Callable[[int, int, np.ndarray], None],
                  write: Optional[Callable[[int, int, np.ndarray], None]] = None) -> None:
    """Reduce this rank's segment of a collective (``own``, its part of its own input) with every peer's
    matching segment into ``out``, ``piece`` elements at a time: each piece is read from every peer, reduced
    and (``write``) sent to every peer while it is in the cache. Parts are reduced in rank order with the data
    plane's kernels (``combine`` of the first two, then ``reduce_into``), each scaled by ``prescale`` and the
    result by ``postscale``, so the bits are the data plane's. ``size`` is at least 2.

    ``read(peer, start, part)`` fills ``part`` with the peer's elements from ``start`` of the segment;
    ``write(peer, start, reduced)`` puts a reduced piece into the peer's output; ``scratch(index, count)``
    gives the ``index``-th of ``size`` reusable arrays of ``count`` elements (the last holds this rank's own
    piece when it must be kept aside: scaled, or reduced into ``out`` before its turn, as an allreduce in
    place on a rank from 2 on is, since the first combine writes before it reads ranks 2 and up)."""
    own_aside = prescale != 1.0 or (rank >= 2 and np.may_share_memory(own, out))
    for a in range(0, own.size, piece):
        z = min(own.size, a + piece)
        parts = []
        for r in range(size):
            if r == rank:
                part = own[a:z]
                if own_aside:
                    part = scratch(size - 1, z - a)
                    scaled_copy(part, own[a:z], prescale)
            else:
                part = scratch(r - (r > rank), z - a)
                read(r, a, part)
                scale_inplace(part, prescale)
            parts.append(part)
        reduced = out[a:z]
        reduce_in_order(reduced, parts, op, postscale)
        if write is not None:
            for step in range(1, size):
                write((rank + step) % size, a, reduced)
