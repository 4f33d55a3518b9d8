"""What a fast round keeps from one round to the next (core/engine/fast_rounds.py): each tensor name's key, the key
already in the rank's header, and its views of the slots. Two ranks' sides on one shared area in one process, each
round posted by both sides before either resolves it (so no side waits). A kept key must never hide a change that
the peers have to see, and closing must let go of the shared area."""
import sys

import numpy as np
import pytest

from horovod.backends.shm import fast_area_bytes
from horovod.common.types import ReduceOp, RequestType, data_type_of
from horovod.core.controller.messages import make_request
from horovod.core.engine import fast_rounds
from horovod.core.engine.entry import Entry
from horovod.core.engine.handles import Handle
from tests.support.fast_rounds import RunningEngine

pytestmark = pytest.mark.skipif(not fast_rounds.supported(), reason="fast rounds need a futex and x86-64")


def _area(size: int = 2) -> np.ndarray:
    return np.zeros(fast_area_bytes(size), np.uint8)


def _sides(area: np.ndarray, size: int = 2):
    return [fast_rounds.FastRounds(area, r, size, list(range(size))) for r in range(size)]


def _entry(rtype: RequestType, tensor: np.ndarray, name: str = "t", **fields) -> Entry:
    output = np.empty_like(tensor) if rtype in (RequestType.ALLREDUCE, RequestType.BROADCAST) else None
    request = make_request(name, rtype, data_type_of(tensor.dtype), tensor.shape, **fields)
    return Entry(request, tensor, output, Handle(name))


def _round(sides, entries):
    """Both sides post, then both resolve: what each resolve returned."""
    keys = [side.key(entry.request, entry.tensor.nbytes) for side, entry in zip(sides, entries)]
    rounds = []
    for side, entry, key in zip(sides, entries, keys):
        assert side.can_post_fast()
        rounds.append(side.post_fast(entry, key))
        side.ring()
    return [side.resolve(k, key, entry, RunningEngine()) for side, entry, k, key in zip(sides, entries, rounds, keys)]


def test_a_repeated_request_reuses_its_key_and_a_changed_one_gets_its_own():
    side = _sides(_area())[0]
    first = _entry(RequestType.ALLREDUCE, np.ones(6, np.float32))
    again = _entry(RequestType.ALLREDUCE, np.ones(6, np.float32))
    key = side.key(first.request, first.tensor.nbytes)
    assert side.key(again.request, again.tensor.nbytes) is key
    for changed in (_entry(RequestType.ALLREDUCE, np.ones((2, 3), np.float32)),
                    _entry(RequestType.ALLREDUCE, np.ones(6, np.float64)),
                    _entry(RequestType.ALLREDUCE, np.ones(6, np.float32), reduce_op=ReduceOp.MAX),
                    _entry(RequestType.ALLREDUCE, np.ones(6, np.float32), postscale=0.5)):
        made = side.key(changed.request, changed.tensor.nbytes)
        direct = fast_rounds.goes_direct(changed.request.rtype, changed.tensor.nbytes, 2, False, side.roomy)
        assert made == fast_rounds.key_of(changed.request, changed.tensor.nbytes, [0, 1], direct) != key


def test_ranks_that_change_a_repeated_op_differently_do_not_match():
    sides = _sides(_area())
    for _ in range(3):          # the keys are kept, and the same key sits in each header's two buffers
        assert _round(sides, [_entry(RequestType.ALLREDUCE, np.ones(6, np.float32)) for _ in sides]) == [True, True]
    # Rank 1 now sends the same name with another shape: a kept key must not make the round match.
    assert _round(sides, [_entry(RequestType.ALLREDUCE, np.ones(6, np.float32)),
                          _entry(RequestType.ALLREDUCE, np.ones((2, 3), np.float32))]) == [False, False]


def test_alternating_ops_rewrite_the_header_keys_and_every_result_is_right():
    sides = _sides(_area())
    names = ["a", "a", "b", "a", "b", "b", "a"]
    for step, name in enumerate(names):
        tensors = [np.full(5, 10.0 * step + r, np.float32) for r in range(2)]
        entries = [_entry(RequestType.ALLREDUCE, t, name) for t in tensors]
        assert _round(sides, entries) == [True, True], (step, name)
        for entry in entries:
            np.testing.assert_array_equal(entry.output, np.full(5, 20.0 * step + 1, np.float32))
        gathered = [_entry(RequestType.ALLGATHER, np.full((1, 3), step + r, np.int32), "g" + name) for r in range(2)]
        assert _round(sides, gathered) == [True, True]
        for entry in gathered:
            np.testing.assert_array_equal(entry.output, np.array([[step] * 3, [step + 1] * 3], np.int32))


def test_closing_lets_go_of_every_view_of_the_shared_area():
    area = _area()
    before = sys.getrefcount(area)
    sides = _sides(area)
    for count in (4, 7):        # views of two sizes (and of both buffers) are kept
        _round(sides, [_entry(RequestType.ALLREDUCE, np.ones(count, np.float32)) for _ in sides])
        _round(sides, [_entry(RequestType.BROADCAST, np.ones(count, np.float32), root=0) for _ in sides])
        _round(sides, [_entry(RequestType.ALLGATHER, np.ones((count, 2), np.float32), "g") for _ in sides])
        _round(sides, [_entry(RequestType.REDUCESCATTER, np.ones((count, 2), np.float32), "r") for _ in sides])
    assert sys.getrefcount(area) > before
    for side in sides:
        side.close()
    assert sys.getrefcount(area) == before, "a closed side still holds views of the shared area: it cannot unmap"


def _scaled_entry(rtype, tensor, output, name="s", **fields):
    request = make_request(name, rtype, data_type_of(tensor.dtype), tensor.shape, **fields)
    return Entry(request, tensor, output, Handle(name))


def test_kept_reductions_and_input_views_give_every_round_its_own_result():
    """Three ranks, each op over consecutive rounds (so on both buffers): an Average with both scale factors, then a
    reducescatter, each result checked every round (a kept view of the other buffer, or a reduction that kept
    stale values, fails)."""
    sides = _sides(_area(3), 3)
    for step in range(4):
        tensors = [np.full((2, 3), step + 10.0 * r, np.float64) for r in range(3)]
        entries = [_scaled_entry(RequestType.ALLREDUCE, t, np.empty_like(t), reduce_op=ReduceOp.AVERAGE,
                                 prescale=2.0, postscale=0.5) for t in tensors]
        assert _round(sides, entries) == [True, True, True]
        for entry in entries:
            np.testing.assert_allclose(entry.output, np.full((2, 3), (3 * step + 30.0) * 2 * 0.5 / 3))
    for step in range(4):
        rows = [np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * r + step for r in range(3)]
        scattered = [_scaled_entry(RequestType.REDUCESCATTER, t, None, "rs", reduce_op=ReduceOp.SUM) for t in rows]
        assert _round(sides, scattered) == [True, True, True]
        total = sum(rows)
        for rank, (lo, hi) in enumerate([(0, 2), (2, 3), (3, 4)]):     # 4 rows: 2, 1, 1
            np.testing.assert_array_equal(scattered[rank].output, total[lo:hi])


def test_an_output_shaped_unlike_its_tensor_gets_the_reduction_in_its_own_shape():
    """Flat outputs on both buffers, then shaped ones on both, then flat again: each buffer's kept reduction
    meets both shapes."""
    sides = _sides(_area())
    for step, flat in enumerate([True, True, False, False, True, True]):
        tensors = [np.full((2, 3), step + 10.0 * r, np.float32) for r in range(2)]
        outputs = [np.empty(6, np.float32) if flat else np.empty((2, 3), np.float32) for _ in tensors]
        entries = [_scaled_entry(RequestType.ALLREDUCE, t, o, reduce_op=ReduceOp.SUM) for t, o in zip(tensors, outputs)]
        assert _round(sides, entries) == [True, True]
        for out in outputs:
            np.testing.assert_array_equal(out.reshape(-1), np.full(6, 2 * step + 10.0, np.float32))


def test_kept_gather_and_broadcast_views_follow_both_buffers():
    """Three ranks: allgathers over consecutive rounds, then broadcasts from rank 1 into outputs shaped as the
    tensor and flat, each result checked every round."""
    sides = _sides(_area(3), 3)
    for step in range(4):
        tensors = [np.full((2, 2), step + 10 * r, np.int32) for r in range(3)]
        entries = [_entry(RequestType.ALLGATHER, t, "g") for t in tensors]
        assert _round(sides, entries) == [True, True, True]
        for entry in entries:
            np.testing.assert_array_equal(entry.output, np.concatenate(tensors))
    for step, flat in enumerate([False, False, True, True, False]):
        tensors = [np.full((2, 3), step + 10.0 * r, np.float32) for r in range(3)]
        outputs = [np.empty(6, np.float32) if flat else np.empty((2, 3), np.float32) for _ in tensors]
        entries = [_scaled_entry(RequestType.BROADCAST, t, o, "b", root=1) for t, o in zip(tensors, outputs)]
        assert _round(sides, entries) == [True, True, True]
        for out in outputs:
            np.testing.assert_array_equal(out.reshape(-1), np.full(6, step + 10.0, np.float32))
