"""``single_request`` (core/controller/messages.py): the request of a single-tensor collective, the same object
again for the same arguments (a training loop's repeated calls), a new one for anything that differs, and
nothing kept for what cannot be a key."""
import numpy as np

from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.controller import messages
from horovod.core.controller.messages import make_request, single_request

ARGS = ("allreduce.w", RequestType.ALLREDUCE, DataType.FLOAT32, (2, 3), ReduceOp.SUM, 1.0, 0.5)


def test_the_same_call_gets_the_same_request_with_make_requests_fields():
    first = single_request(*ARGS)
    assert single_request(*ARGS) is first
    assert first == make_request(*ARGS)
    assert type(first.shape) is list and all(type(d) is int for d in first.shape)


def test_any_difference_gets_another_request():
    first = single_request(*ARGS)
    changed = [("allreduce.v",) + ARGS[1:], ARGS[:1] + (RequestType.REDUCESCATTER,) + ARGS[2:],
               ARGS[:2] + (DataType.FLOAT64,) + ARGS[3:], ARGS[:3] + ((3, 2),) + ARGS[4:],
               ARGS[:4] + (ReduceOp.MAX,) + ARGS[5:], ARGS[:5] + (2.0,) + ARGS[6:], ARGS[:6] + (1.0,)]
    for args in changed:
        other = single_request(*args)
        assert other is not first and other == make_request(*args)
    root = single_request("broadcast.w", RequestType.BROADCAST, DataType.FLOAT32, (4,), root=1)
    assert root.root == 1 and single_request("broadcast.w", RequestType.BROADCAST, DataType.FLOAT32, (4,),
                                             root=0).root == 0


def test_a_shape_of_numpy_ints_or_a_list():
    shape = np.ones((2, 3)).shape                                   # a tuple of Python ints already
    assert single_request("a", RequestType.ALLGATHER, DataType.INT32, shape).shape == [2, 3]
    listed = single_request("a", RequestType.ALLGATHER, DataType.INT32, [np.int64(2), 3])   # not hashable
    assert listed.shape == [2, 3] and type(listed.shape[0]) is int


def test_the_memo_starts_over_when_full(monkeypatch):
    monkeypatch.setattr(messages, "REQUESTS_KEPT", 3)
    monkeypatch.setattr(messages, "_requests", {})
    for i in range(7):
        single_request(f"allreduce.noname.{i}", RequestType.ALLREDUCE, DataType.FLOAT32, (1,))
        assert len(messages._requests) <= 3
