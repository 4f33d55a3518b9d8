"""Tensor Fusion planning: which ready responses share one buffer."""
from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.controller.fusion import FUSIBLE, aligned_threshold, nbytes, plan
from horovod.core.controller.messages import TensorResponse

F16, F32, F64 = DataType.FLOAT16, DataType.FLOAT32, DataType.FLOAT64


def resp(name, numel, dtype=F32, rtype=RequestType.ALLREDUCE, op=ReduceOp.SUM, pre=1.0, post=1.0):
    return TensorResponse(name, int(rtype), int(dtype), [numel], int(op), pre, post, -1, None)


def names(batches):
    return [[r.name for r in batch] for batch in batches]


def test_nbytes():
    assert nbytes(resp("a", 10, F32)) == 40
    assert nbytes(resp("a", 10, F16)) == 20
    assert nbytes(TensorResponse("s", 0, int(F64), [], 1, 1.0, 1.0, -1, None)) == 8     # a scalar


def test_greedy_packing_under_the_threshold():
    rs = [resp(f"t{i}", 10) for i in range(5)]                 # 40 bytes each
    assert names(plan(rs, 120)) == [["t0", "t1", "t2"], ["t3", "t4"]]
    assert names(plan(rs, 119)) == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    assert names(plan(rs, 200)) == [["t0", "t1", "t2", "t3", "t4"]]


def test_exactly_at_the_threshold_fits():
    assert names(plan([resp("a", 10), resp("b", 15)], 100)) == [["a", "b"]]


def test_look_ahead_across_mismatched_dtypes():
    rs = [resp("a", 10, F32), resp("b", 10, F16), resp("c", 10, F32), resp("d", 10, F16), resp("e", 10, F64)]
    assert names(plan(rs, 1 << 20)) == [["a", "c"], ["b", "d"], ["e"]]


def test_look_ahead_across_different_ops_and_scale_factors():
    rs = [resp("a", 4), resp("b", 4, op=ReduceOp.MAX), resp("c", 4), resp("d", 4, pre=2.0), resp("e", 4, post=0.5),
          resp("f", 4, op=ReduceOp.MAX)]
    assert names(plan(rs, 1 << 20)) == [["a", "c"], ["b", "f"], ["d"], ["e"]]


def test_threshold_zero_disables_fusion():
    rs = [resp(f"t{i}", 1) for i in range(4)]
    assert names(plan(rs, 0)) == [["t0"], ["t1"], ["t2"], ["t3"]]


def test_oversize_tensor_runs_alone():
    rs = [resp("small1", 10), resp("huge", 1000), resp("small2", 10), resp("small3", 10)]
    batches = names(plan(rs, 100))
    assert ["huge"] in batches
    assert sorted(sum(batches, [])) == ["huge", "small1", "small2", "small3"]
    for batch in batches:
        if "huge" not in batch:
            assert sum(nbytes(resp(n, 10)) for n in batch) <= 100


def gather(name, rows_per_rank, row=1, dtype=F32):
    return TensorResponse(name, int(RequestType.ALLGATHER), int(dtype), [row], int(ReduceOp.SUM), 1.0, 1.0, -1,
                          list(rows_per_rank))


def test_only_allreduce_allgather_and_reducescatter_are_fused():
    assert FUSIBLE == frozenset({RequestType.ALLREDUCE, RequestType.ALLGATHER, RequestType.REDUCESCATTER})
    others = [RequestType.BROADCAST, RequestType.ALLTOALL, RequestType.BARRIER]
    rs = [resp(f"x{i}", 1, rtype=t) for i, t in enumerate(others)] + [resp("a", 1), resp("b", 1)]
    assert names(plan(rs, 1 << 20)) == [["x0"], ["x1"], ["x2"], ["a", "b"]]
    # reducescatters fuse among themselves, by dtype, op and scale factors, never with allreduces
    rs = [resp("r1", 4, rtype=RequestType.REDUCESCATTER), resp("a", 4), resp("r2", 4, rtype=RequestType.REDUCESCATTER),
          resp("r3", 4, rtype=RequestType.REDUCESCATTER, pre=2.0)]
    assert names(plan(rs, 1 << 20)) == [["r1", "r2"], ["a"], ["r3"]]
    # The same kind twice is still not fused.
    assert names(plan([resp("s1", 1, rtype=RequestType.BROADCAST), resp("s2", 1, rtype=RequestType.BROADCAST)],
                      1 << 20)) == [["s1"], ["s2"]]


def test_allgathers_fuse_by_dtype_and_count_their_whole_output():
    assert nbytes(gather("g", [2, 3], row=4)) == (2 + 3) * 4 * 4
    rs = [gather("g1", [1, 1], row=5), resp("a", 10), gather("g2", [2, 0], row=5), gather("g3", [1, 1], dtype=F64),
          gather("g4", [3, 3], row=5)]
    # g1 + g2 = 80 bytes and g4 has 120: together just over a 199-byte threshold, exactly at a 200-byte one
    assert names(plan(rs, 199)) == [["g1", "g2"], ["a"], ["g3"], ["g4"]]
    assert names(plan(rs, 200)) == [["g1", "g2", "g4"], ["a"], ["g3"]]      # allreduces never join allgathers


def test_order_within_a_batch_and_of_batches_is_deterministic():
    rs = [resp(f"t{i}", 1 + i % 3, F32 if i % 2 else F64) for i in range(20)]
    assert names(plan(rs, 64)) == names(plan(list(rs), 64))
    flat = sum(names(plan(rs, 64)), [])
    assert sorted(flat) == sorted(r.name for r in rs) and len(flat) == 20


def test_empty_plan():
    assert plan([], 100) == []


def test_aligned_threshold():
    unit = 8 * 64
    assert aligned_threshold(0, 4) == 0
    assert aligned_threshold(1, 1) == unit
    assert aligned_threshold(unit, 1) == unit
    assert aligned_threshold(unit + 1, 1) == 2 * unit
    assert aligned_threshold(1000, 2) == 1024
    assert aligned_threshold(128 * 1024 * 1024, 2) == 128 * 1024 * 1024
    t = aligned_threshold(128 * 1024 * 1024, 3)
    assert t % (3 * unit) == 0 and 128 * 1024 * 1024 <= t < 128 * 1024 * 1024 + 3 * unit
    assert aligned_threshold(100, 0) == unit                   # local size 0 treated as 1
