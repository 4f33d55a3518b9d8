"""``Compression.powersgd`` in horovod.jax's DistributedOptimizer, eagerly and jitted, against the single-process
reference of tests/support/powersgd_reference.py (every rank's gradient on its shard, reduced as PowerSGD would),
with horovod.jax's rule for the first Q. On a set of one rank nothing is exchanged or compressed."""
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import horovod.jax as hvd
from tests.support.powersgd_reference import PowerSGDReference

FORMS = ["eager", "jit"]
SHARD = 3


def init_params():
    """``hidden.w`` (12 x 16) is compressed at rank 2; ``out.w`` (16 x 3) and the biases are not."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {"hidden": {"b": jnp.zeros(16), "w": jax.random.normal(k1, (12, 16)) * 0.3},
            "out": {"b": jnp.zeros(3), "w": jax.random.normal(k2, (16, 3)) * 0.3}}


def loss(params, x, y):
    h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return jnp.mean((h @ params["out"]["w"] + params["out"]["b"] - y) ** 2)


gradient = jax.jit(jax.grad(loss))


def batch(step, rank):
    rng = np.random.default_rng(100 * step + rank)
    return (jnp.asarray(rng.normal(size=(SHARD, 12)), jnp.float32),
            jnp.asarray(rng.normal(size=(SHARD, 3)), jnp.float32))


def jax_first_q(name, step, m, r, seed=0):
    key = jax.random.fold_in(jax.random.PRNGKey(zlib.crc32(f"{seed}.{name}".encode()) & 0x7FFFFFFF), step)
    return np.asarray(jax.random.normal(key, (m, r), jnp.float32), np.float64)


def train_distributed(optimizer, steps, form):
    params, state = init_params(), None
    state = optimizer.init(params)

    def step(params, state, x, y):
        updates, state = optimizer.update(gradient(params, x, y), state, params)
        return optax.apply_updates(params, updates), state

    step = step if form == "eager" else jax.jit(step)
    for i in range(steps):
        params, state = step(params, state, *batch(i, hvd.rank()))
    return params, state


def train_reference(compression, steps, lr, average=True):
    params = init_params()
    paths = {jax.tree_util.keystr(p): p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    size = hvd.size()
    reference = PowerSGDReference(
        {name: leaf.shape for name, leaf in zip(paths, jax.tree_util.tree_leaves(params))}, size,
        rank=compression.matrix_approximation_rank,
        start=compression.start_powerSGD_iter if size > 1 else 10 ** 9, average=average,
        warm_start=compression.warm_start, first_q=jax_first_q)
    for i in range(steps):
        per_rank = [dict(zip(paths, [np.asarray(g, np.float64) for g in
                                     jax.tree_util.tree_leaves(gradient(params, *batch(i, r)))]))
                    for r in range(size)]
        reduced = reference.step(per_rank)
        grads = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params),
                                             [jnp.asarray(reduced[name], jnp.float32) for name in paths])
        params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
    return params


def assert_trees_close(a, b, **tol):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **(tol or dict(rtol=2e-4, atol=2e-5)))


@pytest.mark.parametrize("form", FORMS)
def test_matches_the_reference(form):
    compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=1)
    params, state = train_distributed(hvd.DistributedOptimizer(optax.sgd(0.1), compression=compression), 4, form)
    assert_trees_close(params, train_reference(compression, 4, 0.1))
    assert int(state.powersgd.step) == 4
    assert [q is not None for q in state.powersgd.q] == [False, True, False, False]
    everyone = hvd.allgather_object(jax.device_get(params))
    assert_trees_close(everyone[0], params, rtol=0, atol=0)


def test_cold_start_op_sum_and_backward_passes_jitted():
    """A new Q every update and the Sum of the ranks' approximations; then two passes per update (the update
    and PowerSGD's count every second call), all inside jit."""
    compression = hvd.Compression.powersgd(matrix_approximation_rank=2, start_powerSGD_iter=0, warm_start=False)
    size = hvd.size()
    params, state = train_distributed(hvd.DistributedOptimizer(optax.sgd(0.05 / size), compression=compression,
                                                               op=hvd.Sum), 3, "jit")
    assert_trees_close(params, train_reference(compression, 3, 0.05 / size, average=False))
    params, state = train_distributed(hvd.DistributedOptimizer(optax.sgd(0.1), compression=compression,
                                                               backward_passes_per_step=2), 3, "jit")
    assert int(state.powersgd.step) == 1 and int(state.count) == 1


def test_adasum_and_a_single_allreduce_are_refused():
    with pytest.raises(ValueError, match="cannot be combined with op=hvd.Adasum"):
        hvd.DistributedOptimizer(optax.sgd(0.1), compression=hvd.Compression.powersgd(), op=hvd.Adasum)
    with pytest.raises(ValueError, match="works in hvd.DistributedOptimizer only"):
        hvd.allreduce(jnp.ones(3), compression=hvd.Compression.powersgd())
