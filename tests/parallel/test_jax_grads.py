"""jax.grad through horovod.jax's collectives, eagerly and under jit, against single-process JAX.

Each rank r computes loss_r = sum(w_r * collective(x_r)). A single-process JAX program that holds every rank's
x and w computes the reference: the gradient, for x_r, of the ranks' losses combined as horovod.torch's rules
define (allreduce, alltoall: their sum; allgather, broadcast: their mean; reducescatter: size x their sum, as
upstream).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import horovod.jax as hvd

FORMS = ["eager", "jit"]


def values(rank, shape, salt):
    i = np.arange(int(np.prod(shape)), dtype=np.float32)
    return jnp.asarray(((7 * i + 3 * rank + salt) % 13 - 6).reshape(shape) / 4, jnp.float32)


def distributed_grad(form, collective, x, w):
    grad = jax.grad(lambda x: jnp.sum(w * collective(x)))
    return grad(x) if form == "eager" else jax.jit(grad)(x)


def reference_grad(combined, xs):
    """d combined(xs) / d xs[rank], in one process (jitted: one compilation instead of one per eager op)."""
    return jax.jit(jax.grad(combined))(xs)[hvd.rank()]


def assert_grad(got, expected):
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("op_name,pre,post", [("Sum", 1.0, 1.0), ("Average", 1.0, 1.0), ("Sum", 0.5, 3.0)])
def test_allreduce_grad(op_name, pre, post, form):
    rank, size, op = hvd.rank(), hvd.size(), getattr(hvd, op_name)
    xs = [values(r, (3, 2), 0) for r in range(size)]
    ws = [values(r, (3, 2), 5) for r in range(size)]

    def combined(xs):
        reduced = sum(xs) * pre * post / (size if op == hvd.Average else 1)
        return sum(jnp.sum(w * reduced) for w in ws)

    got = distributed_grad(form, lambda x: hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post),
                           xs[rank], ws[rank])
    assert_grad(got, reference_grad(combined, xs))


@pytest.mark.parametrize("form", FORMS)
def test_grouped_allreduce_grad(form):
    rank, size = hvd.rank(), hvd.size()
    xs = [values(r, (4,), 1) for r in range(size)]
    ws = [(values(r, (4,), 2), values(r, (4,), 3)) for r in range(size)]

    def combined(xs):
        return sum(jnp.sum(a * sum(xs)) + jnp.sum(b * 2 * sum(xs)) for a, b in ws)

    def collective(x):
        a, b = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)
        return jnp.stack([a, b])

    got = distributed_grad(form, collective, xs[rank], jnp.stack(ws[rank]))
    assert_grad(got, reference_grad(combined, xs))


@pytest.mark.parametrize("form", FORMS)
def test_allgather_grad(form):
    rank, size = hvd.rank(), hvd.size()
    rows = [r + 1 for r in range(size)] if form == "eager" else [2] * size     # unequal dims only eagerly
    xs = [values(r, (rows[r], 2), 0) for r in range(size)]
    ws = [values(r, (sum(rows), 2), 4) for r in range(size)]

    def combined(xs):
        return sum(jnp.sum(w * jnp.concatenate(xs)) for w in ws) / size

    assert_grad(distributed_grad(form, hvd.allgather, xs[rank], ws[rank]), reference_grad(combined, xs))
    got = distributed_grad(form, lambda x: jnp.concatenate(hvd.grouped_allgather([x, 3 * x])), xs[rank],
                           jnp.concatenate([ws[rank], ws[rank]]))
    assert_grad(got, 4 * reference_grad(combined, xs))


@pytest.mark.parametrize("form", FORMS)
def test_broadcast_grad(form):
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    xs = [values(r, (5,), 0) for r in range(size)]
    ws = [values(r, (5,), 6) for r in range(size)]

    def combined(xs):
        return sum(jnp.sum(w * xs[root]) for w in ws) / size

    got = distributed_grad(form, lambda x: hvd.broadcast(x, root_rank=root), xs[rank], ws[rank])
    assert_grad(got, reference_grad(combined, xs))


@pytest.mark.parametrize("form", FORMS)
def test_alltoall_grad(form):
    rank, size = hvd.rank(), hvd.size()
    xs = [values(r, (2 * size, 3), 0) for r in range(size)]
    ws = [values(r, (2 * size, 3), 8) for r in range(size)]

    def combined(xs):
        return sum(jnp.sum(ws[j] * jnp.concatenate([x[2 * j:2 * j + 2] for x in xs])) for j in range(size))

    assert_grad(distributed_grad(form, hvd.alltoall, xs[rank], ws[rank]), reference_grad(combined, xs))


def test_alltoall_grad_with_splits_eagerly():
    rank, size = hvd.rank(), hvd.size()
    split_of = [[(r + j) % 2 + 1 for j in range(size)] for r in range(size)]     # rank r sends split_of[r][j] to j
    xs = [values(r, (sum(split_of[r]), 2), 0) for r in range(size)]
    received = [sum(split_of[r][j] for r in range(size)) for j in range(size)]
    ws = [values(j, (received[j], 2), 9) for j in range(size)]

    def block(r, j):
        start = sum(split_of[r][:j])
        return slice(start, start + split_of[r][j])

    def combined(xs):
        return sum(jnp.sum(ws[j] * jnp.concatenate([xs[r][block(r, j)] for r in range(size)])) for j in range(size))

    got = jax.grad(lambda x: jnp.sum(ws[rank] * hvd.alltoall(x, splits=split_of[rank])[0]))(xs[rank])
    assert_grad(got, reference_grad(combined, xs))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_reducescatter_grad(op_name, form):
    rank, size, op = hvd.rank(), hvd.size(), getattr(hvd, op_name)
    n = 2 * size + 1
    counts = [n // size + (1 if r < n % size else 0) for r in range(size)]
    starts = [sum(counts[:r]) for r in range(size)]
    xs = [values(r, (n, 2), 0) for r in range(size)]
    ws = [values(r, (counts[r], 2), 2) for r in range(size)]

    def combined(xs):
        reduced = 2.0 * sum(xs) / (size if op == hvd.Average else 1)
        return size * sum(jnp.sum(ws[r] * reduced[starts[r]:starts[r] + counts[r]]) for r in range(size))

    got = distributed_grad(form, lambda x: hvd.reducescatter(x, op=op, prescale_factor=2.0), xs[rank], ws[rank])
    assert_grad(got, reference_grad(combined, xs))
    got = distributed_grad(form, lambda x: hvd.grouped_reducescatter([x], op=op, prescale_factor=2.0)[0],
                           xs[rank], ws[rank])
    assert_grad(got, reference_grad(combined, xs))


def test_value_and_grad_under_jit_gives_the_forward_too():
    rank, size = hvd.rank(), hvd.size()
    value, grad = jax.jit(jax.value_and_grad(lambda x: jnp.sum(hvd.allreduce(x, op=hvd.Sum) ** 2)))(
        jnp.full((2,), float(rank)))
    total = sum(range(size))
    assert float(value) == pytest.approx(2 * total ** 2)
    np.testing.assert_allclose(grad, np.full((2,), 2.0 * total * size))
