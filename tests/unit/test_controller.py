"""The coordinator's negotiation, driven with fake requests (no sockets, no threads)."""
import re
import time

import pytest

from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.controller import Coordinator
from horovod.core.controller.messages import Tag, TensorResponse, make_request
from horovod.core.controller.response_cache import ResponseCache

BATCH, ERROR, JOIN = Tag.BATCH, Tag.ERROR, Tag.JOINED
AR, AG, BC, A2A, RS, BAR, JN = (RequestType.ALLREDUCE, RequestType.ALLGATHER, RequestType.BROADCAST,
                                RequestType.ALLTOALL, RequestType.REDUCESCATTER, RequestType.BARRIER,
                                RequestType.JOIN)
F32, F64 = DataType.FLOAT32, DataType.FLOAT64


def coordinator(size, capacity=1024, threshold=64 * 1024 * 1024, disable_group_fusion=False):
    return Coordinator(size, ResponseCache(capacity), threshold, disable_group_fusion)


def allreduce(name, shape=(4,), dtype=F32, op=ReduceOp.SUM, pre=1.0, post=1.0, group="", group_size=0):
    return make_request(name, AR, dtype, shape, op, pre, post, group=group, group_size=group_size)


def submit_all(coord, request_of_rank):
    for rank in range(coord.size):
        coord.add_request(rank, request_of_rank(rank))


def apply(coord, items):
    """What every rank's engine does with a response list: decode against the cache, then update it."""
    cache = coord.cache
    decoded = []
    for item in items:
        if item[0] == BATCH:
            batch = [cache.get(x) if isinstance(x, int) else TensorResponse.from_wire(x) for x in item[1]]
            decoded.append((batch, item[1]))
    for batch, raw in decoded:
        for response, ref in zip(batch, raw):
            if isinstance(ref, int):
                cache.touch(ref)
            else:
                cache.put(response)
    return [[r.name for r in batch] for batch, _ in decoded]


def batches(items):
    return [item for item in items if item[0] == BATCH]


def errors(items):
    return [item for item in items if item[0] == ERROR]


def names_rank(message, rank):
    return re.search(rf"\branks?(\(s\))? (\d+, )*{rank}\b", message, re.IGNORECASE) is not None


# ------------------------------------------------------------------------------------------------ readiness
def test_a_tensor_is_ready_only_when_every_rank_submitted_it():
    coord = coordinator(3)
    coord.add_request(0, allreduce("a"))
    coord.add_request(2, allreduce("a"))
    assert not coord.has_ready() and coord.has_partial()
    assert coord.take_ready() == []
    assert [n for n, _, ranks in coord.pending_names()] == ["a"]
    assert coord.pending_names()[0][2] == [0, 2]
    coord.add_request(1, allreduce("a"))
    assert coord.has_ready() and not coord.has_partial()
    items = coord.take_ready()
    assert len(items) == 1 and items[0][0] == BATCH
    response = TensorResponse.from_wire(items[0][1][0])
    assert (response.name, response.rtype, response.dtype, response.shape) == ("a", AR, F32, [4])
    assert not coord.has_ready() and coord.take_ready() == []


def test_ready_order_follows_readiness_not_submission():
    coord = coordinator(2)
    coord.add_request(0, allreduce("first", dtype=F64))
    coord.add_request(0, allreduce("second", dtype=F32))
    coord.add_request(1, allreduce("second", dtype=F32))
    coord.add_request(1, allreduce("first", dtype=F64))
    items = coord.take_ready()
    assert [[TensorResponse.from_wire(x).name for x in item[1]] for item in items] == [["second"], ["first"]]


def test_single_rank_job_is_ready_at_once():
    coord = coordinator(1)
    coord.add_request(0, allreduce("solo"))
    assert coord.has_ready()
    assert len(batches(coord.take_ready())) == 1


def test_allgather_and_alltoall_responses_carry_per_rank_facts():
    coord = coordinator(3)
    submit_all(coord, lambda r: make_request("g", AG, F32, [r, 2, 3]))
    response = TensorResponse.from_wire(coord.take_ready()[0][1][0])
    assert response.shape == [2, 3] and response.extra == [0, 1, 2]
    splits = {0: [1, 0, 2], 1: [0, 0, 0], 2: [3, 1, 0]}
    submit_all(coord, lambda r: make_request("x", A2A, F32, [sum(splits[r]), 5], splits=splits[r]))
    response = TensorResponse.from_wire(coord.take_ready()[0][1][0])
    assert response.shape == [5] and response.extra == [splits[0], splits[1], splits[2]]


def test_barrier_and_broadcast_responses():
    coord = coordinator(2)
    submit_all(coord, lambda r: make_request("barrier.noname", BAR, DataType.UINT8, []))
    submit_all(coord, lambda r: make_request("b", BC, F64, [3], root=1))
    items = coord.take_ready()
    responses = [TensorResponse.from_wire(item[1][0]) for item in items]
    assert [(r.name, r.rtype) for r in responses] == [("barrier.noname", BAR), ("b", BC)]
    assert responses[1].root == 1


# ------------------------------------------------------------------------------------------------ mismatches
def negotiate_error(size, request_of_rank, name):
    coord = coordinator(size)
    submit_all(coord, request_of_rank)
    items = coord.take_ready()
    errs = errors(items)
    assert len(errs) == 1 and not batches(items), items
    assert errs[0][1] == [name]
    return errs[0][2]


def assert_names(message, name, values_by_rank):
    assert f"'{name}'" in message, message
    for value in set(values_by_rank.values()):
        assert str(value) in message, (value, message)
    for rank in values_by_rank:
        assert names_rank(message, rank), (rank, message)


def test_mismatched_dtype_message():
    msg = negotiate_error(3, lambda r: allreduce("t", dtype=F32 if r != 1 else F64), "t")
    assert "data type" in msg.lower()
    assert_names(msg, "t", {0: "float32", 1: "float64", 2: "float32"})


def test_mismatched_shape_message():
    msg = negotiate_error(3, lambda r: allreduce("t", shape=(2, r + 1)), "t")
    assert "shape" in msg.lower() and "ALLREDUCE" in msg
    assert_names(msg, "t", {0: "[2, 1]", 1: "[2, 2]", 2: "[2, 3]"})


def test_mismatched_reduce_op_message():
    msg = negotiate_error(2, lambda r: allreduce("t", op=ReduceOp.SUM if r == 0 else ReduceOp.MAX), "t")
    assert_names(msg, "t", {0: "Sum", 1: "Max"})


@pytest.mark.parametrize("field", ["pre", "post"])
def test_mismatched_scale_factor_message(field):
    msg = negotiate_error(2, lambda r: allreduce("t", **{field: 1.0 + r}), "t")
    assert f"{field}scale" in msg.lower()
    assert_names(msg, "t", {0: "1.0", 1: "2.0"})


def test_mismatched_root_message():
    msg = negotiate_error(3, lambda r: make_request("b", BC, F32, [2], root=r % 2), "b")
    assert "root" in msg.lower()
    assert_names(msg, "b", {0: "root 0", 1: "root 1", 2: "root 0"})


def test_out_of_range_root_message():
    msg = negotiate_error(2, lambda r: make_request("b", BC, F32, [2], root=5), "b")
    assert "'b'" in msg and "5" in msg and "root" in msg.lower()


def test_mismatched_operation_message():
    msg = negotiate_error(2, lambda r: allreduce("t") if r == 0 else make_request("t", AG, F32, [4]), "t")
    assert_names(msg, "t", {0: "ALLREDUCE", 1: "ALLGATHER"})


def test_allgather_rows_must_match_and_scalars_are_refused():
    msg = negotiate_error(2, lambda r: make_request("g", AG, F32, [1, 2 + r]), "g")
    assert_names(msg, "g", {0: "[2]", 1: "[3]"})
    msg = negotiate_error(2, lambda r: make_request("g", AG, F32, [] if r else [1]), "g")
    assert "'g'" in msg and names_rank(msg, 1)


def test_mismatch_does_not_block_other_tensors_and_the_name_is_free_again():
    coord = coordinator(2)
    coord.add_request(0, allreduce("bad", shape=(1,)))
    coord.add_request(1, allreduce("bad", shape=(2,)))
    submit_all(coord, lambda r: allreduce("good"))
    items = coord.take_ready()
    assert len(errors(items)) == 1 and len(batches(items)) == 1
    submit_all(coord, lambda r: allreduce("bad", shape=(3,)))
    items = coord.take_ready()
    assert not errors(items) and TensorResponse.from_wire(items[0][1][0]).shape == [3]


# ------------------------------------------------------------------------------------------------ join
def test_join_makes_the_rest_ready_and_reports_the_last_rank():
    coord = coordinator(3)
    coord.add_request(2, allreduce("a"))
    coord.add_request(0, make_request("join.noname", JN, DataType.UINT8, []))
    assert not coord.has_ready()
    coord.add_request(1, make_request("join.noname", JN, DataType.UINT8, []))   # joining refreshes readiness
    assert coord.has_ready() and coord.joined == {0, 1}
    items = coord.take_ready()
    assert len(batches(items)) == 1 and not [i for i in items if i[0] == JOIN]
    coord.add_request(2, make_request("join.noname", JN, DataType.UINT8, []))
    assert coord.has_ready()
    items = coord.take_ready()
    assert items == [[JOIN, 2]]
    assert coord.joined == set()                                               # a fresh round afterwards
    coord.add_request(0, allreduce("b"))
    assert not coord.has_ready()


@pytest.mark.parametrize("rtype,what", [(AG, "Allgather"), (BC, "Broadcast"), (A2A, "Alltoall"),
                                        (RS, "Reducescatter")])
def test_collectives_other_than_allreduce_fail_with_a_joined_rank(rtype, what):
    coord = coordinator(3)
    coord.add_request(0, make_request("join.noname", JN, DataType.UINT8, []))
    for r in (1, 2):
        coord.add_request(r, make_request("t", rtype, F32, [3], root=1, splits=[1, 1, 1]))
    items = coord.take_ready()
    errs = errors(items)
    assert len(errs) == 1 and errs[0][1] == ["t"]
    assert what in errs[0][2] and "Join" in errs[0][2] and names_rank(errs[0][2], 0)


def test_join_of_every_rank_with_nothing_pending():
    coord = coordinator(2)
    for r in (1, 0):
        coord.add_request(r, make_request("join.noname", JN, DataType.UINT8, []))
    assert coord.take_ready() == [[JOIN, 0]]


# ------------------------------------------------------------------------------------------------ groups
def group_member(base, i, n, dtype=F32):
    return allreduce(f"{base}_{i}of{n}", dtype=dtype, group=base, group_size=n)


def test_group_is_held_until_complete():
    coord = coordinator(2)
    submit_all(coord, lambda r: group_member("g", 0, 3))
    submit_all(coord, lambda r: group_member("g", 1, 3))
    submit_all(coord, lambda r: allreduce("single"))
    items = coord.take_ready()
    assert [[TensorResponse.from_wire(x).name for x in i[1]] for i in batches(items)] == [["single"]]
    assert coord.take_ready() == []
    coord.add_request(0, group_member("g", 2, 3))
    assert coord.take_ready() == []
    coord.add_request(1, group_member("g", 2, 3))
    items = coord.take_ready()
    assert [[TensorResponse.from_wire(x).name for x in i[1]] for i in batches(items)] == \
        [["g_0of3", "g_1of3", "g_2of3"]]


def plan_names(disable_group_fusion):
    coord = coordinator(2, disable_group_fusion=disable_group_fusion)
    for rank in range(2):
        coord.add_request(rank, allreduce("s1"))
        for i in range(2):
            coord.add_request(rank, group_member("ga", i, 2))
        coord.add_request(rank, allreduce("s2"))
        for i in range(2):
            coord.add_request(rank, group_member("gb", i, 2))
    return [[TensorResponse.from_wire(x).name for x in i[1]] for i in batches(coord.take_ready())]


def test_groups_fuse_with_everything_by_default():
    assert plan_names(False) == [["s1", "s2", "ga_0of2", "ga_1of2", "gb_0of2", "gb_1of2"]]


def test_disable_group_fusion_fuses_each_group_separately():
    assert plan_names(True) == [["s1", "s2"], ["ga_0of2", "ga_1of2"], ["gb_0of2", "gb_1of2"]]


# ------------------------------------------------------------------------------------------------ cache
def round_trip(coord, request_of_rank):
    submit_all(coord, request_of_rank)
    items = coord.take_ready()
    apply(coord, items)
    return items


def test_cache_fast_path_sends_ids_for_repeated_identical_requests():
    coord = coordinator(3)
    items = round_trip(coord, lambda r: allreduce("w"))
    assert isinstance(items[0][1][0], list)                    # first time: the full response
    cache_id = coord.cache.lookup("w")
    assert cache_id is not None
    for _ in range(3):
        items = round_trip(coord, lambda r: allreduce("w"))
        assert items == [[BATCH, [cache_id]]]                  # then: just the cache id
    # A changed request gets a full response again, and the cache keeps the new one under the same id.
    items = round_trip(coord, lambda r: allreduce("w", shape=(5,)))
    assert isinstance(items[0][1][0], list) and TensorResponse.from_wire(items[0][1][0]).shape == [5]
    assert coord.cache.lookup("w") == cache_id and coord.cache.get(cache_id).shape == [5]
    assert round_trip(coord, lambda r: allreduce("w", shape=(5,))) == [[BATCH, [cache_id]]]
    # Any differing field bypasses the cache: dtype, op, scale factors.
    for change in (dict(dtype=F64), dict(op=ReduceOp.MAX), dict(pre=2.0), dict(post=0.5)):
        items = round_trip(coord, lambda r, change=change: allreduce("w", shape=(5,), **change))
        assert isinstance(items[0][1][0], list), change


def test_cache_mismatch_on_one_rank_is_still_validated():
    coord = coordinator(2)
    round_trip(coord, lambda r: allreduce("w"))
    items = round_trip(coord, lambda r: allreduce("w", shape=(4,) if r == 0 else (8,)))
    assert len(errors(items)) == 1 and "[8]" in errors(items)[0][2]


def test_cache_for_allgather_records_every_ranks_rows():
    coord = coordinator(2)
    round_trip(coord, lambda r: make_request("g", AG, F32, [r + 1, 2]))
    cache_id = coord.cache.lookup("g")
    assert round_trip(coord, lambda r: make_request("g", AG, F32, [r + 1, 2])) == [[BATCH, [cache_id]]]
    items = round_trip(coord, lambda r: make_request("g", AG, F32, [2 - r, 2]))
    assert TensorResponse.from_wire(items[0][1][0]).extra == [2, 1]


def test_broadcast_and_reducescatter_are_not_cached():
    coord = coordinator(2)
    for _ in range(2):
        items = round_trip(coord, lambda r: make_request("b", BC, F32, [2], root=0))
        assert isinstance(items[0][1][0], list)
        items = round_trip(coord, lambda r: make_request("rs", RS, F32, [4], ReduceOp.SUM))
        assert isinstance(items[0][1][0], list)
    assert coord.cache.lookup("b") is None and coord.cache.lookup("rs") is None


def test_cache_capacity_zero_disables_the_fast_path():
    coord = coordinator(2, capacity=0)
    for _ in range(3):
        items = round_trip(coord, lambda r: allreduce("w"))
        assert isinstance(items[0][1][0], list)
    assert len(coord.cache) == 0


def test_cache_is_bypassed_while_a_rank_has_joined():
    coord = coordinator(2)
    round_trip(coord, lambda r: allreduce("w"))
    coord.add_request(1, make_request("join.noname", JN, DataType.UINT8, []))
    coord.add_request(0, allreduce("w"))
    items = coord.take_ready()
    assert isinstance(items[0][1][0], list)                    # validated again: only rank 0 submitted


def test_mixed_cached_and_new_responses_in_one_fused_batch():
    coord = coordinator(2)
    round_trip(coord, lambda r: allreduce("old"))
    old_id = coord.cache.lookup("old")
    submit_all(coord, lambda r: allreduce("old"))
    submit_all(coord, lambda r: allreduce("new"))
    items = coord.take_ready()
    assert len(items) == 1
    refs = items[0][1]
    assert refs[0] == old_id and isinstance(refs[1], list)
    assert apply(coord, items) == [["old", "new"]]


# ------------------------------------------------------------------ emission: urgency and fusion buckets
def test_ready_tensor_nobody_waits_for_is_held_until_the_window_passes():
    coord = coordinator(2)
    coord.add_request(0, allreduce("g"))
    coord.add_request(1, allreduce("g"))
    now = time.monotonic()
    due = coord.emit_due(now, bucket_bytes=1 << 20, hold_s=0.025)
    assert 0.0 < due <= 0.025
    assert coord.emit_due(now + 0.03, bucket_bytes=1 << 20, hold_s=0.025) == 0.0


def test_a_waiting_rank_makes_ready_work_go_at_once():
    coord = coordinator(2)
    coord.add_request(0, allreduce("g"))
    coord.add_request(1, allreduce("g"))
    coord.mark_urgent(["g"])
    assert coord.emit_due(time.monotonic(), bucket_bytes=1 << 20, hold_s=10.0) == 0.0


def test_urgency_for_a_not_yet_ready_tensor_applies_once_it_is_ready():
    coord = coordinator(2)
    coord.add_request(0, allreduce("g"))
    coord.mark_urgent(["g"])
    assert coord.emit_due(time.monotonic(), 1 << 20, 10.0) is None
    coord.add_request(1, allreduce("g"))
    assert coord.emit_due(time.monotonic(), 1 << 20, 10.0) == 0.0


def test_a_stale_wait_notice_does_not_speed_up_a_later_tensor_of_the_same_name():
    coord = coordinator(2)
    coord.mark_urgent(["g"])                  # arrives after "g" already completed: ignored
    coord.add_request(0, allreduce("g"))
    coord.add_request(1, allreduce("g"))
    assert coord.emit_due(time.monotonic(), 1 << 20, 10.0) > 0.0


def test_a_full_bucket_goes_at_once():
    coord = coordinator(2)
    for name in ("a", "b"):          # 4 float32 elements = 16 bytes each
        coord.add_request(0, allreduce(name))
        coord.add_request(1, allreduce(name))
    now = time.monotonic()
    assert coord.emit_due(now, bucket_bytes=48, hold_s=10.0) > 0.0
    assert coord.emit_due(now, bucket_bytes=32, hold_s=10.0) == 0.0
    items = coord.take_ready()
    assert [len(item[1]) for item in items] == [2]          # one fused batch
    assert coord.emit_due(now, bucket_bytes=32, hold_s=10.0) is None


# ------------------------------------------------------------------ who waits (for the deadlock detector)
def test_waits_lists_the_ranks_blocked_on_each_pending_tensor():
    coord = coordinator(3)
    coord.add_request(0, make_request("barrier.noname", BAR, DataType.UINT8, []))
    coord.add_request(1, allreduce("grad"))
    coord.add_request(2, allreduce("grad"))
    assert coord.waits() == []
    coord.mark_waiting(0, ["barrier.noname"])
    coord.mark_waiting(1, ["grad"])
    coord.mark_waiting(2, ["grad"])
    assert coord.waits() == [("barrier.noname", "BARRIER", [0], [0]), ("grad", "ALLREDUCE", [1, 2], [1, 2])]
    coord.unmark_waiting(2, ["grad"])                 # its timed wait ran out
    assert coord.waits()[1] == ("grad", "ALLREDUCE", [1, 2], [1])


def test_a_wait_ends_with_its_tensor_and_never_carries_over_to_a_later_one_of_the_same_name():
    coord = coordinator(2)
    coord.add_request(0, allreduce("g"))
    coord.mark_waiting(0, ["g"])
    coord.add_request(1, allreduce("g"))
    assert coord.take_ready()
    assert coord.waits() == []
    coord.add_request(1, allreduce("g"))              # the next step's "g", from rank 1 only so far
    coord.mark_waiting(0, ["g"])                      # rank 0's late notice about the completed "g"
    assert coord.waits() == []
    coord.mark_waiting(1, ["g", "unknown"])
    assert coord.waits() == [("g", "ALLREDUCE", [1], [1])]


def test_progress_counts_requests_and_emissions():
    coord = coordinator(2)
    before = coord.progress
    coord.add_request(0, allreduce("g"))
    assert coord.progress == before + 1
    coord.take_ready()                                # nothing ready: no emission
    assert coord.progress == before + 1
    coord.add_request(1, allreduce("g"))
    coord.take_ready()
    assert coord.progress == before + 3


# ------------------------------------------------------------------------------------------------ device buffers
def test_a_tensor_in_host_memory_on_one_rank_and_device_memory_on_another_is_refused_naming_both():
    coord = coordinator(3)
    coord.add_request(0, make_request("t", AR, F32, [4]))
    for rank in (1, 2):
        coord.add_request(rank, make_request("t", AR, F32, [4], device=1))
    [error] = errors(coord.take_ready())
    message = error[2]
    assert "Mismatched devices for ALLREDUCE of tensor 't'" in message, message
    assert "rank 0 sent a tensor in host memory" in message and "ranks 1, 2 sent a tensor in device memory" in message
    assert "HOROVOD_CUDA_IPC" in message


def test_device_requests_carry_their_device_and_are_never_fused_with_host_ones():
    coord = coordinator(2)
    for rank in range(2):
        coord.add_request(rank, make_request("host", AR, F32, [4]))
        coord.add_request(rank, make_request("dev1", AR, F32, [4], device=1))
        coord.add_request(rank, make_request("dev2", AR, F32, [4], device=1))
    items = coord.take_ready()
    batch_lists = [[TensorResponse.from_wire(x) for x in item[1]] for item in batches(items)]
    assert sorted([[r.name for r in b] for b in batch_lists]) == [["dev1", "dev2"], ["host"]]
    assert {r.name: r.device for b in batch_lists for r in b} == {"host": 0, "dev1": 1, "dev2": 1}
    cached = TensorResponse.from_wire(batch_lists[0][0].to_wire())
    assert cached.request_matches(0, make_request(cached.name, AR, F32, [4], device=cached.device))
    assert not cached.request_matches(0, make_request(cached.name, AR, F32, [4], device=1 - cached.device))
