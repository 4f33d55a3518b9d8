"""How the executors lay a response's tensors out: rows, reducescatter splits, and the Average rewrite (shared by
the host and device executors)."""
from __future__ import annotations

import math
from typing import List, Tuple

from horovod.common.types import ReduceOp


def row(shape) -> int:
    """Elements per first-dimension row of a tensor of ``shape``."""
    return int(math.prod(shape))


_OPS = {int(op): op for op in ReduceOp}      # a request's int to its op, without the enum's slower call


def summed(op: int, postscale: float, size: int) -> Tuple[ReduceOp, float]:
    """Average is a Sum whose postscale is divided by the number of ranks (upstream's rewrite, in one place)."""
    if op == ReduceOp.AVERAGE:
        return ReduceOp.SUM, postscale / size
    return _OPS.get(op) or ReduceOp(op), postscale


def split_rows(shape, size: int) -> List[int]:
    """Upstream's reducescatter split: ``shape[0] // size`` rows each, one more for the first remainder ranks."""
    return [shape[0] // size + (1 if r < shape[0] % size else 0) for r in range(size)]
