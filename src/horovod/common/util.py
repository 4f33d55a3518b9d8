"""Small helpers that upstream's ``horovod.common.util`` offers and users' code imports."""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator, List, Optional, Sequence

from horovod.common.types import ReduceOp

log = logging.getLogger(__name__)


@contextlib.contextmanager
def env(**kwargs: str) -> Iterator[None]:
    """Set environment variables for the duration of a ``with`` block (tests use it)."""
    saved = {k: os.environ.get(k) for k in kwargs}
    os.environ.update({k: str(v) for k, v in kwargs.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def get_average_backwards_compatibility_fun(reduce_ops):
    """Resolve upstream's deprecated ``average=`` argument against ``op=``."""

    def impl(op: Optional[ReduceOp], average: Optional[bool]) -> ReduceOp:
        if op is not None:
            if average is not None:
                raise ValueError("The op parameter supersedes average. Please provide only one of them.")
            return op
        if average is not None:
            log.warning("Parameter `average` has been replaced with `op` and will be removed in v1.0")
            return reduce_ops.Average if average else reduce_ops.Sum
        return reduce_ops.Average

    return impl


def num_rank_is_power_2(num_rank: int) -> bool:
    """True when ``num_rank`` is a power of two (Adasum's requirement)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def split_list(items: Sequence, num_parts: int) -> List[List]:
    """Split ``items`` into ``num_parts`` contiguous parts whose sizes differ by at most one."""
    d, r = divmod(len(items), num_parts)
    return [list(items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)]) for i in range(num_parts)]


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """Compare two version strings with packaging's rules."""
    from packaging.version import Version

    return Version(ver) >= Version(target)
