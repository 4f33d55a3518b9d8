"""horovod.jax collectives at any number of ranks: every collective, eagerly and under jax.jit, on int32,
float32 and bfloat16, with its options (op, prescale/postscale, compression, names).

Each rank builds every rank's contribution from the rank number, so it can compute the whole job's expected
result locally. Values are small integers, exact in every dtype.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import horovod.jax as hvd
from tests.support.blocking import count_blocking

DTYPES = [jnp.int32, jnp.float32, jnp.bfloat16]
FORMS = ["eager", "jit"]


def dt_id(dtype):
    return jnp.dtype(dtype).name


def contrib(rank, shape, dtype, salt=0):
    i = np.arange(int(np.prod(shape)), dtype=np.int64) + salt
    return jnp.asarray(((3 * i + rank) % 11 - 5).reshape(shape), dtype)


def run(form, fn, *args):
    """``fn(*args)`` as the form says: called now, or as a jitted program."""
    return fn(*args) if form == "eager" else jax.jit(fn)(*args)


def check(out, expected, dtype):
    assert isinstance(out, jax.Array), type(out)
    assert out.dtype == jnp.dtype(dtype), (out.dtype, dtype)
    assert out.shape == expected.shape, (out.shape, expected.shape)
    np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(expected, np.float64), rtol=1e-2 if
                               dtype == jnp.bfloat16 else 1e-6)


def reduced(shape, dtype, op, size, prescale=1.0, postscale=1.0, salt=0):
    parts = np.stack([np.asarray(contrib(r, shape, dtype, salt), np.float64) for r in range(size)])
    if op == hvd.Min:
        return parts.min(0)
    if op == hvd.Max:
        return parts.max(0)
    total = (parts * prescale).sum(0) * postscale
    total = total / size if op == hvd.Average else total
    return np.trunc(total) if jnp.issubdtype(dtype, jnp.integer) else total


def test_basics_match_the_op_layer():
    import horovod.numpy as hnp

    assert (hvd.rank(), hvd.size(), hvd.local_rank()) == (hnp.rank(), hnp.size(), hnp.local_rank())
    assert hvd.is_initialized() and hvd.global_process_set.size() == hvd.size()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_allreduce(dtype, form):
    """Sum, Average, Min and Max of one array (under jit: four collectives in one program)."""
    rank, size = hvd.rank(), hvd.size()
    ops = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max]
    outs = run(form, lambda x: [hvd.allreduce(x, op=op, name=f"ar.{dt_id(dtype)}.{op}.{form}") for op in ops],
               contrib(rank, (3, 5), dtype))
    for op, out in zip(ops, outs):
        check(out, reduced((3, 5), dtype, op, size), dtype)


@pytest.mark.parametrize("form", FORMS)
def test_allreduce_options(form):
    """average=, prescale/postscale, and fp16/bf16 compression (the result keeps the input dtype)."""
    rank, size = hvd.rank(), hvd.size()
    x = contrib(rank, (4, 3), jnp.float32)

    def fn(x):
        return (hvd.allreduce(x, average=False), hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                                                postscale_factor=3.0),
                hvd.allreduce(x, compression=hvd.Compression.fp16), hvd.allreduce(x, compression=hvd.Compression.bf16))

    summed, scaled, fp16, bf16 = run(form, fn, x)
    check(summed, reduced((4, 3), jnp.float32, hvd.Sum, size), jnp.float32)
    check(scaled, reduced((4, 3), jnp.float32, hvd.Sum, size, 0.5, 3.0), jnp.float32)
    for out, atol in ((fp16, 2e-3), (bf16, 0.05)):
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(out, reduced((4, 3), jnp.float32, hvd.Average, size), atol=atol)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_grouped_allreduce(dtype, form):
    rank, size = hvd.rank(), hvd.size()
    outs = run(form, lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum),
               contrib(rank, (2, 3), dtype), contrib(rank, (7,), dtype, salt=1))
    assert isinstance(outs, list) and len(outs) == 2
    check(outs[0], reduced((2, 3), dtype, hvd.Sum, size), dtype)
    check(outs[1], reduced((7,), dtype, hvd.Sum, size, salt=1), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_allgather_eager_with_a_different_first_dim_per_rank(dtype):
    rank, size = hvd.rank(), hvd.size()
    out = hvd.allgather(contrib(rank, (rank + 1, 2), dtype))
    check(out, np.concatenate([np.asarray(contrib(r, (r + 1, 2), dtype)) for r in range(size)]), dtype)
    a, b = hvd.grouped_allgather([contrib(rank, (rank + 1,), dtype), contrib(rank, (2, 2), dtype, salt=3)])
    check(a, np.concatenate([np.asarray(contrib(r, (r + 1,), dtype)) for r in range(size)]), dtype)
    check(b, np.concatenate([np.asarray(contrib(r, (2, 2), dtype, salt=3)) for r in range(size)]), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_allgather_under_jit(dtype):
    rank, size = hvd.rank(), hvd.size()
    out, (a, b) = jax.jit(lambda x, y: (hvd.allgather(x), hvd.grouped_allgather([y, x])))(
        contrib(rank, (2, 3), dtype), contrib(rank, (1,), dtype, salt=2))
    gathered = np.concatenate([np.asarray(contrib(r, (2, 3), dtype)) for r in range(size)])
    check(out, gathered, dtype)
    check(a, np.concatenate([np.asarray(contrib(r, (1,), dtype, salt=2)) for r in range(size)]), dtype)
    check(b, gathered, dtype)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_broadcast_from_every_root(dtype, form):
    rank, size = hvd.rank(), hvd.size()
    for root in range(size):
        out = run(form, lambda x, root=root: hvd.broadcast(x, root_rank=root, name=f"bc.{root}"),
                  contrib(rank, (3, 2), dtype))
        check(out, np.asarray(contrib(root, (3, 2), dtype)), dtype)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_alltoall_equal_splits(dtype, form):
    rank, size = hvd.rank(), hvd.size()
    rows = 2 * size
    out = run(form, hvd.alltoall, contrib(rank, (rows, 3), dtype))
    expected = np.concatenate([np.asarray(contrib(r, (rows, 3), dtype))[2 * rank:2 * rank + 2] for r in range(size)])
    check(out, expected, dtype)


def test_alltoall_with_splits_eagerly():
    rank, size = hvd.rank(), hvd.size()
    splits = [(rank + j) % 3 for j in range(size)]          # rows this rank sends to rank j
    x = contrib(rank, (sum(splits), 2), jnp.float32)
    out, received = hvd.alltoall(x, splits=splits)
    pieces = []
    for r in range(size):
        theirs = [(r + j) % 3 for j in range(size)]
        start = sum(theirs[:rank])
        pieces.append(np.asarray(contrib(r, (sum(theirs), 2), jnp.float32))[start:start + theirs[rank]])
    check(out, np.concatenate(pieces), jnp.float32)
    assert np.asarray(received).tolist() == [(r + rank) % 3 for r in range(size)]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_reducescatter_with_uneven_rows(op_name, form):
    rank, size, op = hvd.rank(), hvd.size(), getattr(hvd, op_name)
    rows = 2 * size + 1                     # rank 0 gets one row more than the others (for size > 1)
    x, y = contrib(rank, (rows, 2), jnp.float32), contrib(rank, (size,), jnp.float32, salt=5)
    out, (a, b) = run(form, lambda x, y: (hvd.reducescatter(x, op=op, prescale_factor=2.0),
                                          hvd.grouped_reducescatter([y, x], op=op)), x, y)
    mine = rows // size + (1 if rank < rows % size else 0)
    start = rank * (rows // size) + min(rank, rows % size)
    full = reduced((rows, 2), jnp.float32, op, size)
    check(out, 2.0 * full[start:start + mine], jnp.float32)
    check(a, reduced((size,), jnp.float32, op, size, salt=5)[rank:rank + 1], jnp.float32)
    check(b, full[start:start + mine], jnp.float32)


@pytest.mark.parametrize("form", FORMS)
def test_barrier_and_join(form):
    def fn():
        hvd.barrier()
        return hvd.join()

    last = run(form, fn)
    assert 0 <= int(last) < hvd.size()
    if form == "eager":
        assert isinstance(last, int)
    assert hvd.allgather_object(int(last)) == [int(last)] * hvd.size()


def test_object_helpers():
    rank, size = hvd.rank(), hvd.size()
    assert hvd.broadcast_object({"from": rank, "arr": jnp.arange(3)}, root_rank=size - 1)["from"] == size - 1
    assert hvd.allgather_object(("r", rank)) == [("r", r) for r in range(size)]


def test_unnamed_collectives_mix_eager_and_jit_in_one_order():
    """Unnamed collectives are numbered when they run, so an eager call between jitted ones pairs up."""
    rank, size = hvd.rank(), hvd.size()
    step = jax.jit(lambda x: hvd.allreduce(x, op=hvd.Sum) * 2)
    total = sum(range(size))
    for i in range(3):
        assert float(step(jnp.float32(rank + i))) == 2 * (total + size * i)
        assert float(hvd.allreduce(jnp.float32(rank), op=hvd.Max)) == size - 1


def test_numpy_inputs_are_accepted_and_the_input_is_untouched():
    x = np.full((3,), float(hvd.rank()), np.float32)
    out = hvd.allreduce(x, op=hvd.Sum)
    assert isinstance(out, jax.Array) and float(out[0]) == sum(range(hvd.size()))
    assert (x == hvd.rank()).all()


@pytest.mark.parametrize("form", FORMS)
def test_blocking_calls_say_they_wait_at_once(form, monkeypatch):
    """allreduce, broadcast, allgather and reducescatter submit and wait at once and say so (ops.blocking()), so
    that fast rounds (one host) and carried collectives (across hosts) may take them, as the other bindings'.
    Under jit an allgather sends every rank's first dim with its data, a grouped op, which never goes fast."""
    blocking = count_blocking(monkeypatch)
    rank, size = hvd.rank(), hvd.size()
    x = jnp.full((size * 2,), float(rank + 1), jnp.float32)

    def calls(t):
        return (hvd.allreduce(t, op=hvd.Sum, name="bl.ar"), hvd.broadcast(t, 0, name="bl.bc"),
                hvd.allgather(t, name="bl.ag"), hvd.reducescatter(t, op=hvd.Sum, name="bl.rs"),
                hvd.grouped_allreduce([t, t], op=hvd.Sum, name="bl.gar"))

    summed, sent, gathered, scattered, grouped = run(form, calls, x)
    expected = ["allreduce.bl.ar", "broadcast.bl.bc", "reducescatter.bl.rs", "grouped_allreduce.bl.gar"]
    if form == "eager":
        expected.append("allgather.bl.ag")
    assert sorted(blocking) == sorted(expected), blocking
    np.testing.assert_array_equal(np.asarray(summed), np.full(size * 2, size * (size + 1) / 2))
    np.testing.assert_array_equal(np.asarray(sent), np.ones(size * 2))
    np.testing.assert_array_equal(np.asarray(gathered), np.repeat(np.arange(1, size + 1, dtype=np.float32), size * 2))
    np.testing.assert_array_equal(np.asarray(scattered), np.full(2, size * (size + 1) / 2))
    np.testing.assert_array_equal(np.asarray(grouped[1]), np.full(size * 2, size * (size + 1) / 2))
