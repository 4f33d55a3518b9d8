"""The even and odd process sets the bindings' process-set tests (tests/parallel/test_*_process_sets.py) run on.

``add_process_set`` and ``remove_process_set`` are the op layer's, the same in every binding. Importing this
module turns dynamic process sets on (HOROVOD_DYNAMIC_PROCESS_SETS is read when a set is added, as upstream's
test files set it).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Sequence, Tuple

import pytest

import horovod.numpy as hvd
from horovod.core.process_sets import ProcessSet

os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"


def even_odd_sets() -> Iterator[Tuple[ProcessSet, ProcessSet]]:
    """The body of a pytest fixture: yields (this rank's set, the other set), the even and the odd ranks (of
    unequal sizes at an odd number of ranks), and removes both afterwards. Skips at 1 rank."""
    size = hvd.size()
    if size < 2:
        pytest.skip("needs 2 ranks for two process sets")
    even = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    odd = hvd.add_process_set([r for r in range(size) if r % 2 == 1])
    yield (even, odd) if even.included() else (odd, even)
    assert hvd.remove_process_set(odd) and hvd.remove_process_set(even)


@contextlib.contextmanager
def temporary_sets(*ranks: Sequence[int]) -> Iterator[Tuple[ProcessSet, ...]]:
    """Add a process set for each list of ranks (every rank calls this), yield them, and remove them again, last
    added first, asserting that each removal succeeds."""
    sets = []
    try:
        for members in ranks:
            sets.append(hvd.add_process_set(list(members)))
        yield tuple(sets)
    finally:
        for ps in reversed(sets):
            assert hvd.remove_process_set(ps)
