"""horovod.torch collectives at any number of ranks: every collective x dtype x form, scaling, compression.

Each rank builds every rank's contribution deterministically from the rank number, so each rank can compute the
whole job's expected result locally. Values are small integers, exact in every dtype (bfloat16 included).
"""
import math
import time

import pytest
import torch

import horovod.torch as hvd

torch.set_num_threads(1)

REDUCE_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                 torch.float32, torch.float64]
MOVE_DTYPES = REDUCE_DTYPES + [torch.bool]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average}


def dt_id(dtype):
    return str(dtype).replace("torch.", "")


def is_float(dtype):
    return dtype.is_floating_point


def tol(dtype):
    if dtype == torch.float16:
        return dict(rtol=2e-3, atol=2e-3)
    if dtype == torch.bfloat16:
        return dict(rtol=1.6e-2, atol=1.6e-2)
    if dtype == torch.float32:
        return dict(rtol=1e-6, atol=1e-6)
    if dtype == torch.float64:
        return dict(rtol=1e-12, atol=1e-12)
    return dict(rtol=0, atol=0)


def contrib(rank, shape, dtype, salt=0):
    n = math.prod(shape)
    i = torch.arange(n, dtype=torch.int64) + salt
    if dtype == torch.bool:
        vals = (i + rank) % 3 == 0
    elif dtype == torch.uint8:
        vals = (3 * i + rank) % 11
    else:
        vals = (3 * i + rank) % 11 - 5
    return vals.to(dtype).reshape(shape)


def reduce_expected(shape, dtype, op, size, prescale=1.0, postscale=1.0, salt=0):
    parts = torch.stack([contrib(r, shape, dtype, salt).double() for r in range(size)])
    if prescale != 1.0:
        parts = parts * prescale
        if not is_float(dtype):
            parts = torch.trunc(parts)
    result = parts.sum(0)
    factor = postscale / size if op == hvd.Average else postscale
    if factor != 1.0:
        result = result * factor
        if not is_float(dtype):
            result = torch.trunc(result)
    return result


def assert_close(out, expected, dtype):
    assert isinstance(out, torch.Tensor)
    assert out.dtype == dtype, (out.dtype, dtype)
    assert tuple(out.shape) == tuple(expected.shape), (out.shape, expected.shape)
    if dtype == torch.bool:
        assert torch.equal(out, expected)
    else:
        torch.testing.assert_close(out.double(), expected.double(), **tol(dtype))


def wait_poll(handle):
    deadline = time.monotonic() + 30
    while not hvd.poll(handle):
        assert time.monotonic() < deadline, "poll() never became true"
        time.sleep(0.001)
    return hvd.synchronize(handle)


def test_init_again_is_harmless_and_sizes_agree():
    hvd.init()
    assert hvd.is_initialized()
    assert 0 <= hvd.rank() < hvd.size()
    assert 0 <= hvd.local_rank() < hvd.local_size()
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))


# ------------------------------------------------------------------------------------------------ allreduce
ALLREDUCE_FORMS = ["sync", "async", "async_poll", "inplace", "async_inplace", "grouped", "grouped_inplace",
                   "grouped_async", "grouped_async_inplace"]


@pytest.mark.parametrize("form", ALLREDUCE_FORMS)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=dt_id)
def test_allreduce(dtype, op_name, form):
    rank, size, op = hvd.rank(), hvd.size(), OPS[op_name]
    shape = (3, 5)
    name = f"ar.{dt_id(dtype)}.{op_name}.{form}"
    t = contrib(rank, shape, dtype)
    original = t.clone()
    exp = reduce_expected(shape, dtype, op, size)
    if form.startswith("grouped"):
        t2 = contrib(rank, (7,), dtype, salt=1)
        exp2 = reduce_expected((7,), dtype, op, size, salt=1)
        tensors = [t, t2]
        if form == "grouped":
            outs = hvd.grouped_allreduce(tensors, name=name, op=op)
        elif form == "grouped_inplace":
            outs = hvd.grouped_allreduce_(tensors, name=name, op=op)
            assert outs[0] is t and outs[1] is t2
        elif form == "grouped_async":
            outs = hvd.synchronize(hvd.grouped_allreduce_async(tensors, name=name, op=op))
        else:
            outs = wait_poll(hvd.grouped_allreduce_async_(tensors, name=name, op=op))
            assert outs[0] is t and outs[1] is t2
        assert isinstance(outs, list) and len(outs) == 2
        assert_close(outs[0], exp, dtype)
        assert_close(outs[1], exp2, dtype)
        if "inplace" not in form:
            assert torch.equal(t, original), "the out-of-place form modified its input"
        return
    if form == "sync":
        out = hvd.allreduce(t, name=name, op=op)
    elif form == "async":
        out = hvd.synchronize(hvd.allreduce_async(t, name=name, op=op))
    elif form == "async_poll":
        out = wait_poll(hvd.allreduce_async(t, name=name, op=op))
    elif form == "inplace":
        out = hvd.allreduce_(t, name=name, op=op)
        assert out is t
    else:
        out = hvd.synchronize(hvd.allreduce_async_(t, name=name, op=op))
        assert out is t
    assert_close(out, exp, dtype)
    if "inplace" not in form:
        assert torch.equal(t, original), "the out-of-place form modified its input"


def test_allreduce_default_op_is_average_and_name_is_optional():
    size = hvd.size()
    out = hvd.allreduce(torch.full((4,), 2.0 * size))
    torch.testing.assert_close(out, torch.full((4,), 2.0 * size))
    out = hvd.allreduce(torch.ones(3), average=False)
    torch.testing.assert_close(out, torch.full((3,), float(size)))


@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=dt_id)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("factors", [(2.0, 1.0), (1.0, 3.0), (2.0, 0.5)], ids=["pre", "post", "both"])
def test_allreduce_prescale_postscale(factors, op_name, dtype):
    rank, size, op = hvd.rank(), hvd.size(), OPS[op_name]
    pre, post = factors
    shape = (6,)
    t = contrib(rank, shape, dtype)
    exp = reduce_expected(shape, dtype, op, size, prescale=pre, postscale=post)
    out = hvd.allreduce(t, name=f"ar.scale.{dt_id(dtype)}.{op_name}.{pre}.{post}", op=op, prescale_factor=pre,
                        postscale_factor=post)
    assert_close(out, exp, dtype)
    grouped = hvd.grouped_allreduce([t], name=f"gar.scale.{dt_id(dtype)}.{op_name}.{pre}.{post}", op=op,
                                    prescale_factor=pre, postscale_factor=post)
    assert_close(grouped[0], exp, dtype)


def test_allreduce_in_place_is_zero_copy():
    rank, size = hvd.rank(), hvd.size()
    t = contrib(rank, (64, 8), torch.float32)
    ptr = t.data_ptr()
    storage_ptr = t.untyped_storage().data_ptr()
    out = hvd.allreduce_(t, op=hvd.Sum, name="ar.zero_copy")
    assert out is t
    assert t.data_ptr() == ptr and t.untyped_storage().data_ptr() == storage_ptr
    assert_close(t, reduce_expected((64, 8), torch.float32, hvd.Sum, size), torch.float32)
    # A view into a bigger tensor: the reduction lands in the base tensor's memory.
    base = torch.zeros(4, 6, dtype=torch.float64)
    row = base[1]
    row.copy_(contrib(rank, (6,), torch.float64))
    hvd.allreduce_(row, op=hvd.Sum, name="ar.zero_copy.view")
    assert_close(base[1], reduce_expected((6,), torch.float64, hvd.Sum, size), torch.float64)
    assert torch.count_nonzero(base[0]) == 0 and torch.count_nonzero(base[2:]) == 0


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dt_id)
def test_allreduce_compression_keeps_the_input_dtype(dtype, compression):
    rank, size = hvd.rank(), hvd.size()
    comp = getattr(hvd.Compression, compression)
    t = contrib(rank, (10,), dtype) * 0.5
    out = hvd.allreduce(t, op=hvd.Sum, name=f"ar.comp.{compression}.{dt_id(dtype)}", compression=comp)
    assert out.dtype == dtype
    exp = reduce_expected((10,), dtype, hvd.Sum, size) * 0.5
    torch.testing.assert_close(out.double(), exp, rtol=1e-2, atol=1e-2)
    avg = hvd.allreduce(t, op=hvd.Average, name=f"ar.comp.avg.{compression}.{dt_id(dtype)}", compression=comp)
    assert avg.dtype == dtype
    torch.testing.assert_close(avg.double(), exp / size, rtol=1e-2, atol=1e-2)
    grouped = hvd.grouped_allreduce([t], op=hvd.Sum, name=f"gar.comp.{compression}.{dt_id(dtype)}",
                                    compression=comp)
    assert grouped[0].dtype == dtype
    torch.testing.assert_close(grouped[0].double(), exp, rtol=1e-2, atol=1e-2)


def test_compressors_round_trip():
    t = torch.linspace(-2, 2, 9, dtype=torch.float64)
    for comp, wire in [(hvd.Compression.fp16, torch.float16), (hvd.Compression.bf16, torch.bfloat16)]:
        c, ctx = comp.compress(t)
        assert c.dtype == wire
        back = comp.decompress(c, ctx)
        assert back.dtype == torch.float64
        torch.testing.assert_close(back, t, rtol=1e-2, atol=1e-2)
        i = torch.arange(4)
        ci, ctx = comp.compress(i)
        assert ci.dtype == torch.int64 and comp.decompress(ci, ctx).dtype == torch.int64
    c, ctx = hvd.Compression.none.compress(t)
    assert c is t and hvd.Compression.none.decompress(c, ctx) is t


# ------------------------------------------------------------------------------------------------ allgather
def gather_input(rank, dtype, salt=0):
    return contrib(rank, (rank + 1, 3), dtype, salt=salt + 7 * rank)


@pytest.mark.parametrize("form", ["sync", "async", "async_poll", "grouped", "grouped_async"])
@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=dt_id)
def test_allgather(dtype, form):
    rank, size = hvd.rank(), hvd.size()
    name = f"ag.{dt_id(dtype)}.{form}"
    t = gather_input(rank, dtype)
    exp = torch.cat([gather_input(r, dtype) for r in range(size)])
    if form.startswith("grouped"):
        t2 = contrib(rank, (2, 2, 2), dtype, salt=rank)
        exp2 = torch.cat([contrib(r, (2, 2, 2), dtype, salt=r) for r in range(size)])
        if form == "grouped":
            outs = hvd.grouped_allgather([t, t2], name=name)
        else:
            outs = hvd.synchronize(hvd.grouped_allgather_async([t, t2], name=name))
        assert len(outs) == 2
        assert_close(outs[0], exp, dtype)
        assert_close(outs[1], exp2, dtype)
        return
    if form == "sync":
        out = hvd.allgather(t, name=name)
    elif form == "async":
        out = hvd.synchronize(hvd.allgather_async(t, name=name))
    else:
        out = wait_poll(hvd.allgather_async(t, name=name))
    assert_close(out, exp, dtype)
    assert tuple(out.shape) == (size * (size + 1) // 2, 3)


def test_allgather_zero_rows_on_some_ranks():
    rank, size = hvd.rank(), hvd.size()
    t = torch.full((rank % 2, 2), float(rank))
    out = hvd.allgather(t, name="ag.zero_rows")
    exp = torch.cat([torch.full((r % 2, 2), float(r)) for r in range(size)])
    assert torch.equal(out, exp)


# ------------------------------------------------------------------------------------------------ broadcast
@pytest.mark.parametrize("form", ["sync", "async", "inplace", "async_inplace"])
@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=dt_id)
def test_broadcast(dtype, form):
    rank, size = hvd.rank(), hvd.size()
    for root in sorted({0, size - 1}):
        name = f"bc.{dt_id(dtype)}.{form}.{root}"
        t = contrib(rank, (4, 3), dtype, salt=5 * rank)
        original = t.clone()
        exp = contrib(root, (4, 3), dtype, salt=5 * root)
        if form == "sync":
            out = hvd.broadcast(t, root, name=name)
        elif form == "async":
            out = hvd.synchronize(hvd.broadcast_async(t, root, name=name))
        elif form == "inplace":
            out = hvd.broadcast_(t, root, name=name)
            assert out is t
        else:
            out = wait_poll(hvd.broadcast_async_(t, root, name=name))
            assert out is t
        assert_close(out, exp, dtype)
        if "inplace" not in form:
            assert torch.equal(t, original), "the out-of-place broadcast modified its input"


# ------------------------------------------------------------------------------------------------ alltoall
def a2a_splits(src, size):
    return [(src + d) % 3 for d in range(size)]


def a2a_input(src, size, dtype):
    rows = sum(a2a_splits(src, size))
    return contrib(src, (rows, 2), dtype, salt=11 * src)


def a2a_expected(rank, size, dtype):
    parts = []
    for src in range(size):
        splits = a2a_splits(src, size)
        offset = sum(splits[:rank])
        parts.append(a2a_input(src, size, dtype)[offset:offset + splits[rank]])
    return torch.cat(parts), [a2a_splits(src, size)[rank] for src in range(size)]


@pytest.mark.parametrize("form", ["equal", "equal_async", "splits_list", "splits_tensor", "splits_async"])
@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=dt_id)
def test_alltoall(dtype, form):
    rank, size = hvd.rank(), hvd.size()
    name = f"a2a.{dt_id(dtype)}.{form}"
    if form.startswith("equal"):
        t = contrib(rank, (2 * size, 3), dtype, salt=13 * rank)
        exp = torch.cat([contrib(src, (2 * size, 3), dtype, salt=13 * src)[2 * rank:2 * rank + 2]
                         for src in range(size)])
        if form == "equal":
            out = hvd.alltoall(t, name=name)
            assert isinstance(out, torch.Tensor), "alltoall without splits returns the output only"
        else:
            # Upstream: synchronize() of any alltoall handle gives (output, received_splits), splits or not.
            result = hvd.synchronize(hvd.alltoall_async(t, name=name))
            assert isinstance(result, tuple) and len(result) == 2, "synchronize gives (output, received)"
            out, received = result
            assert received.dtype == torch.int32 and received.tolist() == [2] * size
        assert_close(out, exp, dtype)
        return
    t = a2a_input(rank, size, dtype)
    splits = a2a_splits(rank, size)
    exp, exp_received = a2a_expected(rank, size, dtype)
    if form == "splits_list":
        result = hvd.alltoall(t, splits=splits, name=name)
    elif form == "splits_tensor":
        result = hvd.alltoall(t, splits=torch.tensor(splits, dtype=torch.int32), name=name)
    else:
        result = hvd.synchronize(hvd.alltoall_async(t, splits=splits, name=name))
    assert isinstance(result, tuple) and len(result) == 2, "alltoall with splits returns (output, received)"
    out, received = result
    assert_close(out, exp, dtype)
    assert isinstance(received, torch.Tensor)
    assert received.tolist() == exp_received


def test_alltoall_indivisible_without_splits_raises():
    size = hvd.size()
    if size == 1:
        pytest.skip("every dim 0 divides by 1")
    with pytest.raises(ValueError):
        hvd.alltoall(torch.ones(size + 1, 2), name="a2a.indivisible")
    assert torch.equal(hvd.alltoall(torch.ones(size, 2), name="a2a.after"), torch.ones(size, 2))


# ------------------------------------------------------------------------------------------------ reducescatter
def rs_rows(n, size, r):
    return n // size + (1 if r < n % size else 0)


@pytest.mark.parametrize("form", ["sync", "async", "grouped", "grouped_async"])
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=dt_id)
def test_reducescatter(dtype, op_name, form):
    rank, size, op = hvd.rank(), hvd.size(), OPS[op_name]
    for n in sorted({2 * size, 2 * size + 1, 3 * size - 1}):
        name = f"rs.{dt_id(dtype)}.{op_name}.{form}.{n}"
        shape = (n, 3)
        t = contrib(rank, shape, dtype)
        full = reduce_expected(shape, dtype, op, size)
        offset = sum(rs_rows(n, size, r) for r in range(rank))
        exp = full[offset:offset + rs_rows(n, size, rank)]
        if form == "sync":
            out = hvd.reducescatter(t, name=name, op=op)
        elif form == "async":
            out = hvd.synchronize(hvd.reducescatter_async(t, name=name, op=op))
        else:
            t2 = contrib(rank, (n,), dtype, salt=3)
            full2 = reduce_expected((n,), dtype, op, size, salt=3)
            if form == "grouped":
                outs = hvd.grouped_reducescatter([t, t2], name=name, op=op)
            else:
                outs = hvd.synchronize(hvd.grouped_reducescatter_async([t, t2], name=name, op=op))
            out = outs[0]
            assert_close(outs[1], full2[offset:offset + rs_rows(n, size, rank)], dtype)
        assert_close(out, exp, dtype)


def test_reducescatter_default_op_is_average_and_scaling():
    rank, size = hvd.rank(), hvd.size()
    n = 2 * size + 1
    t = contrib(rank, (n, 2), torch.float64)
    offset = sum(rs_rows(n, size, r) for r in range(rank))
    rows = rs_rows(n, size, rank)
    out = hvd.reducescatter(t, name="rs.default")
    exp = reduce_expected((n, 2), torch.float64, hvd.Average, size)[offset:offset + rows]
    assert_close(out, exp, torch.float64)
    out = hvd.reducescatter(t, name="rs.scaled", op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    exp = reduce_expected((n, 2), torch.float64, hvd.Sum, size, 2.0, 0.25)[offset:offset + rows]
    assert_close(out, exp, torch.float64)
    out = hvd.reducescatter(t, name="rs.comp", op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float64
    exp = reduce_expected((n, 2), torch.float64, hvd.Sum, size)[offset:offset + rows]
    torch.testing.assert_close(out, exp, rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------------------------------------ control + objects
def test_barrier():
    for _ in range(3):
        hvd.barrier()
    out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.barrier")
    assert torch.equal(out, torch.full((2,), float(hvd.size())))


def test_join_returns_the_last_joined_rank():
    rank, size = hvd.rank(), hvd.size()
    last = size - 1
    if rank == last:
        # Completes only once every other rank has joined (joined ranks contribute zeros).
        out = hvd.allreduce(torch.full((3,), 4.0), op=hvd.Average, name="join.last.avg")
        torch.testing.assert_close(out, torch.full((3,), 4.0 / size))
    result = hvd.join()
    assert result == last
    assert hvd.allgather(torch.tensor([result])).tolist() == [last] * size
    assert hvd.join(device=-1) in range(size)          # joining with no work at all
    out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.join")
    assert torch.equal(out, torch.full((2,), float(size)))


def test_broadcast_object_and_allgather_object():
    rank, size = hvd.rank(), hvd.size()
    obj = {"rank": rank, "payload": list(range(rank + 2)), "t": torch.arange(rank + 1)}
    for root in sorted({0, size - 1}):
        got = hvd.broadcast_object(obj, root_rank=root)
        assert got["rank"] == root and got["payload"] == list(range(root + 2))
        assert torch.equal(got["t"], torch.arange(root + 1))
    got = hvd.broadcast_object(("x", rank), root_rank=0, name="named.object")
    assert got == ("x", 0)
    gathered = hvd.allgather_object({"r": rank, "s": "x" * rank})
    assert gathered == [{"r": r, "s": "x" * r} for r in range(size)]
    assert hvd.allgather_object(None, name="nones") == [None] * size


# ------------------------------------------------------------------------------------------------ sparse
def sparse_input(rank):
    indices = torch.tensor([[rank % 5, (rank + 2) % 5, 4], [0, rank % 3, 2]])
    values = torch.tensor([1.0 + rank, -2.0, 0.5 * rank])
    return torch.sparse_coo_tensor(indices, values, size=(5, 3))


@pytest.mark.parametrize("op_name", list(OPS))
def test_sparse_allreduce_async(op_name):
    rank, size, op = hvd.rank(), hvd.size(), OPS[op_name]
    result = hvd.sparse_allreduce_async(sparse_input(rank), name=f"sparse.{op_name}", op=op)
    assert callable(result)
    out = result()
    assert out.is_sparse and tuple(out.shape) == (5, 3)
    exp = sum(sparse_input(r).to_dense() for r in range(size))
    if op == hvd.Average:
        exp = exp / size
    torch.testing.assert_close(out.to_dense(), exp)


def test_unknown_handle_synchronize_returns_none():
    assert hvd.synchronize(10 ** 9) is None


def test_blocking_calls_register_no_handle():
    """A blocking call takes its result straight from the submission: it registers no integer handle (so the
    next async call's handle follows the last one's), and its result is what the async form gives."""
    size = hvd.size()
    t = torch.ones(2 * size, 3)
    first = hvd.allreduce_async_(t.clone(), op=hvd.Sum, name="handles.first")
    assert hvd.synchronize(first).tolist() == [[float(size)] * 3] * (2 * size)
    results = [hvd.allreduce_(t.clone(), op=hvd.Sum, name="handles.ar_"),
               hvd.allreduce(t, op=hvd.Sum, name="handles.ar"),
               hvd.grouped_allreduce_([t.clone()], op=hvd.Sum, name="handles.gar_")[0],
               hvd.broadcast_(t.clone(), 0, name="handles.bc_"),
               hvd.allgather(t, name="handles.ag"),
               hvd.reducescatter(t, op=hvd.Sum, name="handles.rs"),
               hvd.alltoall(t, name="handles.a2a")]
    second = hvd.allreduce_async_(t.clone(), op=hvd.Sum, name="handles.second")
    hvd.synchronize(second)
    assert second == first + 1
    assert [r.shape[0] for r in results] == [2 * size, 2 * size, 2 * size, 2 * size, 2 * size * size, 2, 2 * size]
    assert results[0].tolist() == results[1].tolist() == results[2].tolist() == [[float(size)] * 3] * (2 * size)
    assert results[5].tolist() == [[float(size)] * 3] * 2


def test_blocking_calls_say_they_wait_at_once(monkeypatch):
    """The blocking calls (in place or not, differentiable or not) submit and wait at once and say so
    (ops.blocking()), so that fast rounds (one host) and carried collectives (across hosts) may take them."""
    from tests.support.blocking import count_blocking, every_blocking_call

    blocking = count_blocking(monkeypatch)
    rank, size = hvd.rank(), hvd.size()
    expected = every_blocking_call(hvd, torch.full((size * 2,), float(rank + 1)), torch.clone)
    grad = torch.full((size * 2,), float(rank + 1), requires_grad=True)
    hvd.allreduce(grad, op=hvd.Sum, name="bl.ar_grad")          # autograd records this one
    assert sorted(blocking) == sorted(expected + ["allreduce.bl.ar_grad"]), blocking
