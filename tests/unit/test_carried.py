"""Carried collectives (core/engine/carried.py) in one process: which requests carry their input, the numbers rank 0
computes (the tcp plane's direct exchange, bit for bit), the coordinator's CARRIED items for allreduce, broadcast
and allgather, and a worker engine's side of the wire. The multi-rank runs are
tests/parallel/test_carried_collectives.py."""
import socket
from types import SimpleNamespace

import numpy as np
import pytest

from horovod.backends.local import LocalBackend
from horovod.backends.tcp import TcpBackend
from horovod.common import wire
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import DataType, ReduceOp, RequestType, data_type_of
from horovod.core.controller import Coordinator
from horovod.core.controller.messages import Tag, TensorResponse, make_request
from horovod.core.controller.response_cache import ResponseCache
from horovod.core.engine import Engine, Entry, carried, loops, waits
from horovod.core.engine.handles import Handle
from horovod.core.engine.layouts import summed
from horovod.core.engine.settings import EngineSettings
from tests.unit import test_engine
from tests.unit.test_engine import SMALL, received
from tests.unit.test_tcp_algorithms import close_comms, make_comms, run_ranks


def _request(name="t", shape=(8,), rtype=RequestType.ALLREDUCE, op=ReduceOp.SUM, dtype=DataType.FLOAT32, **kw):
    return make_request(name, rtype, dtype, shape, op, **kw)


def test_which_requests_carry_their_input():
    small = _request(shape=(1024,))                               # 4 KB
    assert carried.carries(small, 4096, 2, 32768)
    assert carried.carries(small, 4096, 9, 32768)                 # 8 x 4 KB through rank 0: the budget exactly
    assert not carried.carries(small, 4096, 10, 32768)
    assert not carried.carries(small, 4096, 1, 32768)             # one rank: nothing to send
    assert not carried.carries(small, 4096, 2, 0)                 # turned off
    assert not carried.carries(_request(shape=(0,)), 0, 2, 0)     # ... even for an empty tensor
    for op in (ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
        assert carried.carries(_request(op=op), 32, 2, 32768)
    assert not carried.carries(_request(op=ReduceOp.ADASUM), 32, 2, 32768)
    assert not carried.carries(_request(group="g", group_size=2), 32, 2, 32768)
    assert not carried.carries(_request(device=1), 32, 2, 32768)
    for rtype in (RequestType.REDUCESCATTER, RequestType.ALLTOALL, RequestType.BARRIER):
        assert not carried.carries(_request(rtype=rtype), 32, 2, 32768)
    broadcast = _request(rtype=RequestType.BROADCAST, root=2)
    assert carried.carries(broadcast, 4096, 9, 32768) and not carried.carries(broadcast, 4097, 9, 32768)
    assert carried.sends_input(broadcast, 2) and not carried.sends_input(broadcast, 0)    # only the root's
    gather = _request(rtype=RequestType.ALLGATHER)            # the result: this rank's input times the ranks
    assert carried.carries(gather, 2048, 4, 24576) and not carried.carries(gather, 2049, 4, 24576)
    assert carried.sends_input(gather, 0) and carried.sends_input(small, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.float64])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT])
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.5, 3.0)])
def test_rank_0_computes_the_direct_exchanges_bits(dtype, op, scales):
    """Rank order, prescale then postscale, Average as a scaled Sum: what the tcp plane's direct exchange gives
    (the same kernels in the same order), checked against that algorithm run on 3 ranks."""
    size, count = 3, 1001
    rng = np.random.default_rng(7)
    inputs = [(rng.standard_normal(count) * 4).astype(dtype) for _ in range(size)]
    prescale, postscale = scales
    response = TensorResponse("t", int(RequestType.ALLREDUCE), int(data_type_of(np.dtype(dtype))), [count], int(op),
                              prescale, postscale, -1, None)
    wire_inputs = [inputs[0]] + [x.tobytes() for x in inputs[1:]]      # rank 0's own array, the workers' bytes
    got = carried.reduce_inputs(response, wire_inputs, [0, 1, 2])
    comms = make_comms(size)
    try:
        reduce_op, post = summed(op, postscale, size)

        def rank(r):
            backend = TcpBackend(comms[r])
            backend.allreduce_algorithm = "direct"
            out = np.empty(count, dtype)
            backend.allreduce([inputs[r]], [out], reduce_op, prescale, post)
            return out
        planes = run_ranks(size, rank)
    finally:
        close_comms(comms)
    assert got.dtype == np.dtype(dtype)
    for plane in planes:
        assert got.tobytes() == plane.tobytes()


def test_an_input_of_the_wrong_size_names_its_rank():
    response = TensorResponse("w", int(RequestType.ALLREDUCE), int(DataType.FLOAT32), [4], int(ReduceOp.SUM),
                              1.0, 1.0, -1, None)
    with pytest.raises(HorovodInternalError, match=r"ALLREDUCE of tensor 'w': rank 5 sent 3 elements with its "
                                                   r"request, 4 expected by the negotiated shape"):
        carried.reduce_inputs(response, [np.ones(4, np.float32), np.ones(3, np.float32).tobytes()], [2, 5])


def _coordinator(size=3):
    return Coordinator(size, ResponseCache(16), 1 << 20)


def test_the_coordinator_emits_a_reduced_item_when_every_rank_carried_its_input():
    coord = _coordinator()
    inputs = [np.full(8, r + 1.0, np.float32) for r in range(3)]
    coord.add_request(1, _request("c"), inputs[1].tobytes())
    coord.add_request(0, _request("c"), inputs[0])
    assert not coord.has_ready()
    coord.add_request(2, _request("c"), inputs[2].tobytes())
    items = coord.take_ready()
    assert [item[0] for item in items] == [Tag.CARRIED]
    assert TensorResponse.from_wire(items[0][1]).name == "c"
    assert items[0][2][0] is inputs[0] and items[0][2][1:] == [inputs[1].tobytes(), inputs[2].tobytes()]
    carried.finish_items(items, [0, 1, 2])
    np.testing.assert_array_equal(np.frombuffer(items[0][2], np.float32), np.full(8, 6.0, np.float32))
    assert coord.take_ready() == []


def test_a_broadcast_is_carried_with_its_roots_input_alone():
    coord = _coordinator()
    root = np.arange(6, dtype=np.int32)
    for rank in (0, 2):
        coord.add_request(rank, _request("b", shape=(6,), rtype=RequestType.BROADCAST, dtype=DataType.INT32, root=1))
    coord.add_request(1, _request("b", shape=(6,), rtype=RequestType.BROADCAST, dtype=DataType.INT32, root=1),
                      root.tobytes())
    items = carried.finish_items(coord.take_ready(), [0, 1, 2])
    assert items[0][0] == Tag.CARRIED and items[0][2] == root.tobytes()
    coord.add_request(0, _request("n", rtype=RequestType.BROADCAST, root=1), np.ones(8, np.float32))
    for rank in (1, 2):                                         # the root sent nothing: the data plane
        coord.add_request(rank, _request("n", rtype=RequestType.BROADCAST, root=1))
    assert [item[0] for item in coord.take_ready()] == [Tag.BATCH]


def test_an_allgather_is_carried_as_the_inputs_in_rank_order():
    coord = _coordinator()
    rows = [np.full((r + 1, 2), r, np.float32) for r in range(3)]
    for rank in (2, 0, 1):
        coord.add_request(rank, _request("g", shape=rows[rank].shape, rtype=RequestType.ALLGATHER),
                          rows[rank] if rank == 0 else rows[rank].tobytes())
    items = carried.finish_items(coord.take_ready(), [0, 1, 2])
    assert items[0][0] == Tag.CARRIED and TensorResponse.from_wire(items[0][1]).extra == [1, 2, 3]
    np.testing.assert_array_equal(np.frombuffer(items[0][2], np.float32).reshape(6, 2), np.concatenate(rows))
    coord.add_request(0, _request("s", shape=(2, 2), rtype=RequestType.ALLGATHER), np.ones((2, 2), np.float32))
    coord.add_request(1, _request("s", shape=(1, 2), rtype=RequestType.ALLGATHER), np.ones(1, np.float32).tobytes())
    coord.add_request(2, _request("s", shape=(1, 2), rtype=RequestType.ALLGATHER), np.ones(2, np.float32).tobytes())
    with pytest.raises(HorovodInternalError, match=r"ALLGATHER of tensor 's': rank 1 sent 1 elements with its "
                                                   r"request, 2 expected"):
        carried.finish_items(coord.take_ready(), [0, 1, 2])


def test_without_every_ranks_input_the_tensor_goes_to_the_data_plane():
    coord = _coordinator()
    coord.add_request(0, _request("d"), np.ones(8, np.float32))
    coord.add_request(1, _request("d"), np.ones(8, np.float32).tobytes())
    coord.add_request(2, _request("d"))                     # HOROVOD_COORDINATOR_CARRY_BYTES=0 there, say
    assert [item[0] for item in coord.take_ready()] == [Tag.BATCH]
    joined = _coordinator(2)
    joined.add_request(1, make_request("join", RequestType.JOIN, DataType.FLOAT32, []))
    joined.add_request(0, _request("j"), np.ones(8, np.float32))
    assert [item[0] for item in joined.take_ready()] == [Tag.BATCH]     # rank 1 contributes zeros there


def test_carried_requests_that_disagree_fail_as_any_other():
    coord = _coordinator(2)
    coord.add_request(0, _request("m", shape=(3,)), np.ones(3, np.float32))
    coord.add_request(1, _request("m", shape=(4,)), np.ones(4, np.float32).tobytes())
    items = coord.take_ready()
    assert items[0][0] == Tag.ERROR and "Mismatched ALLREDUCE tensor shapes for tensor 'm'" in items[0][2]


def test_a_workers_carried_input_reaches_the_coordinator():
    coordinator = _coordinator(2)
    engine = SimpleNamespace(coordinator=coordinator, active=lambda: None)
    loops._from_worker(engine, 1, [Tag.REQUESTS, [list(_request("w"))], waits.WAITED,
                                   [np.full(8, 2.0, np.float32).tobytes()]])
    coordinator.add_request(0, _request("w"), np.ones(8, np.float32))
    items = carried.finish_items(coordinator.take_ready(), [0, 1])
    np.testing.assert_array_equal(np.frombuffer(items[0][2], np.float32), np.full(8, 3.0, np.float32))


worker = test_engine.worker      # the fixture: rank 1 of 2, the other end of its control socket playing rank 0


def _entry(name, tensor):
    request = make_request(name, RequestType.ALLREDUCE, DataType.FLOAT32, tensor.shape, ReduceOp.SUM)
    return Entry(request, tensor, np.empty_like(tensor), Handle(name))


def test_a_worker_sends_a_blocking_calls_input_and_completes_it_with_rank_0s_result(worker):
    engine, coord = worker
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    entry = _entry("b", x)
    engine.submit_blocking(entry)
    [message] = received(coord, 0.2)
    assert message[0] == "R" and message[2] == waits.WAITED and message[3] == [x.tobytes()]
    engine.enqueue([_entry("a", x)])                                    # an async call: no input
    [message] = received(coord, 0.2)
    assert len(message) == 2
    response = TensorResponse("b", int(RequestType.ALLREDUCE), int(DataType.FLOAT32), [2, 3], int(ReduceOp.SUM),
                              1.0, 1.0, -1, None)
    wire.send_msg(coord, [Tag.RESPONSES, [[Tag.CARRIED, response.to_wire(), (x * 2).tobytes()]]])
    np.testing.assert_array_equal(entry.handle.wait(timeout=10), x * 2)
    assert engine.carried_ops == 1 and entry.output.shape == (2, 3)


def test_a_worker_with_the_budget_at_0_sends_no_input():
    ours, coordinator_end = socket.socketpair()
    engine = Engine(1, 2, LocalBackend(), {0: ours}, EngineSettings(**SMALL, coordinator_carry_bytes=0)).start()
    try:
        engine.submit_blocking(_entry("z", np.ones(3, np.float32)))
        [message] = received(coordinator_end, 0.2)
        assert len(message) == 3
    finally:
        coordinator_end.close()
        engine.shutdown()


def test_a_worker_completes_a_carried_allgather_in_an_output_of_its_own(worker):
    engine, coord = worker
    x = np.ones((1, 2), np.float32)
    request = make_request("ag", RequestType.ALLGATHER, DataType.FLOAT32, x.shape)
    entry = Entry(request, x, None, Handle("ag"))
    engine.submit_blocking(entry)
    [message] = received(coord, 0.2)
    assert message[3] == [x.tobytes()]
    response = TensorResponse("ag", int(RequestType.ALLGATHER), int(DataType.FLOAT32), [2], int(ReduceOp.SUM),
                              1.0, 1.0, -1, [2, 1])
    gathered = np.arange(6, dtype=np.float32)
    wire.send_msg(coord, [Tag.RESPONSES, [[Tag.CARRIED, response.to_wire(), gathered.tobytes()]]])
    np.testing.assert_array_equal(entry.handle.wait(timeout=10), gathered.reshape(3, 2))


def test_a_non_root_worker_sends_no_input_with_a_carried_broadcast(worker):
    engine, coord = worker
    x = np.zeros(4, np.float32)
    request = make_request("bc", RequestType.BROADCAST, DataType.FLOAT32, x.shape, root=0)
    engine.submit_blocking(Entry(request, x, x, Handle("bc")))
    [message] = received(coord, 0.2)
    assert len(message) == 3, message
