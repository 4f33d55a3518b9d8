"""Grouped fast rounds (core/engine/fast_rounds.py) in one process: the ranks' sides on one shared area, each in
a thread, posting a grouped allreduce as one record."""
from typing import List

import numpy as np
import pytest

from horovod.backends.reduce import reduce_in_order, scaled_copy
from horovod.backends.shm import FAST_SLOT_BYTES, fast_area_bytes
from horovod.common.types import ReduceOp, RequestType, data_type_of
from horovod.core.controller.messages import group_requests, make_request
from horovod.core.engine import fast_rounds
from horovod.core.engine.entry import Entry
from horovod.core.engine.handles import Handle
from horovod.core.engine.layouts import summed
from tests.support.fast_rounds import RunningEngine, each_rank_in_a_thread

pytestmark = pytest.mark.skipif(not fast_rounds.supported(), reason="fast rounds need a futex and x86-64")


def _sides(size: int) -> List[fast_rounds.FastRounds]:
    area = np.zeros(fast_area_bytes(size), np.uint8)
    return [fast_rounds.FastRounds(area, r, size, list(range(size))) for r in range(size)]


def _group(tensors, outputs=None, op=ReduceOp.SUM, name="g", **scales) -> List[Entry]:
    requests = group_requests(name, RequestType.ALLREDUCE, [data_type_of(t.dtype) for t in tensors],
                              [t.shape for t in tensors], op, **scales)
    handle = Handle(name, parts=len(tensors), finish=list)
    outputs = outputs if outputs is not None else [np.empty_like(t) for t in tensors]
    return [Entry(r, t, o, handle, index=i) for i, (r, t, o) in enumerate(zip(requests, tensors, outputs))]


def _round(sides, groups) -> List[object]:
    """Every rank posts its group (one record) and resolves the round, each in a thread."""
    results: List[object] = [None] * len(sides)

    def run(r: int) -> None:
        side, entries = sides[r], groups[r]
        key = side.group_key(entries)
        assert key is not None
        k = side.post_fast_group(entries, key)
        side.ring()
        results[r] = side.resolve(k, key, entries[0], RunningEngine(), entries)

    each_rank_in_a_thread(len(sides), run, "a grouped round")
    return results


def test_members_start_on_aligned_boundaries():
    assert fast_rounds.group_offsets([4, 64, 65, 1]) == [0, 64, 128, 256, 320]
    assert fast_rounds.group_offsets([]) == [0]


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT])
def test_every_member_gets_the_rank_order_reduction(size, op):
    """Members of several dtypes and sizes that do not fill their last cache line, reduced in rank order as the
    data plane does (the same bits), on both buffers (two rounds in a row, the second scaled)."""
    sides = _sides(size)
    counts, dtypes = [3, 16, 41, 1000], [np.float32, np.float64, np.int32, np.float16]
    for rnd, (pre, post) in enumerate([(1.0, 1.0), (0.5, 3.0)]):
        inputs = [[((np.arange(c) * (r + 2) + i + rnd) % 7 + 1).astype(d)
                   for i, (c, d) in enumerate(zip(counts, dtypes))] for r in range(size)]
        groups = [_group(inputs[r], op=op, prescale=pre, postscale=post) for r in range(size)]
        assert _round(sides, groups) == [True] * size
        for i in range(len(dtypes)):
            parts = []
            for r in range(size):                   # what the data plane sends: each rank's input, prescaled
                part = np.empty_like(inputs[r][i])
                scaled_copy(part, inputs[r][i], pre)
                parts.append(part)
            expected = np.empty_like(parts[0])
            reduce_in_order(expected, parts, *summed(op, post, size))
            for r in range(size):
                np.testing.assert_array_equal(groups[r][i].output, expected, err_msg=f"member {i}, rank {r}")
    assert [s.matched for s in sides] == [2] * size


def test_groups_that_differ_in_any_member_or_order_do_not_match():
    """The key covers every member's name, dtype, shape and the op: a member of another shape, or the same
    members in another order (other names), give other keys, and no rank reduces anything."""
    a, b = np.ones(4, np.float32), np.ones(8, np.float32)
    for other in ([a, np.ones(9, np.float32)], [b, a]):
        sides = _sides(2)
        groups = [_group([a, b]), _group(other)]
        assert _round(sides, groups) == [False, False]
        assert [s.matched for s in sides] == [0, 0]


def test_only_allreduces_that_fit_the_slots_together_have_a_key():
    one = make_request("x", RequestType.ALLREDUCE, data_type_of(np.float32), [4])
    gather = make_request("y", RequestType.ALLGATHER, data_type_of(np.float32), [4])
    adasum = make_request("z", RequestType.ALLREDUCE, data_type_of(np.float32), [4], ReduceOp.ADASUM)
    assert fast_rounds.group_key_of([one, one], [16, 16]).startswith(fast_rounds.GROUP_MARK)
    assert fast_rounds.group_key_of([one, gather], [16, 16]) is None
    assert fast_rounds.group_key_of([one, adasum], [16, 16]) is None
    half = FAST_SLOT_BYTES // 2
    assert fast_rounds.group_key_of([one, one], [half, half]) is not None
    assert fast_rounds.group_key_of([one, one], [half, half + 1]) is None                  # past a slot
    quarter = fast_rounds.REDUCE_TOTAL_BYTES // 4
    assert fast_rounds.group_key_of([one], [quarter], ranks=range(4)) is not None
    assert fast_rounds.group_key_of([one], [quarter + 64], ranks=range(4)) is None       # read past the limit
    assert len(fast_rounds.group_key_of([one] * 1000, [4] * 1000)) <= fast_rounds.KEY_ROOM
