"""horovod.jax's DistributedOptimizer and broadcast_parameters against single-process optax training.

Every rank trains a small MLP on its own shard of a batch; a single-process optax run on the concatenated batch
(mean loss) must reach the same parameters, eagerly and inside a jitted train step.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import horovod.core.ops as core_ops
import horovod.jax as hvd
from tests.support.jax_mlp import batch, gradient, init_params

FORMS = ["eager", "jit"]


def local_batch(step):
    return batch(step, hvd.rank())


def full_batch(step):
    parts = [batch(step, r) for r in range(hvd.size())]
    return jnp.concatenate([p[0] for p in parts]), jnp.concatenate([p[1] for p in parts])




def train(optimizer, params, steps, data, form):
    """``steps`` updates; "eager" runs the optimizer's update eagerly (the loss gradient is jitted either way),
    "jit" runs the whole train step as one jitted program."""
    state = optimizer.init(params)

    def step(params, state, x, y):
        grads = gradient(params, x, y)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = step if form == "eager" else jax.jit(step)
    for i in range(steps):
        params, state = step(params, state, *data(i))
    return params


def assert_trees_close(a, b, atol=1e-5):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        if isinstance(x, (int, str)):
            assert x == y
            continue
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=atol)


@pytest.mark.parametrize("form", FORMS)
def test_matches_single_process_training_on_the_concatenated_batch(form):
    params = init_params(0)
    ours = train(hvd.DistributedOptimizer(optax.sgd(0.05, momentum=0.9)), params, 4, local_batch, form)
    reference = train(optax.sgd(0.05, momentum=0.9), params, 4, full_batch, "jit")
    assert_trees_close(ours, reference)
    assert_trees_close(hvd.allgather_object(jax.device_get(ours))[0], ours, atol=0)   # every rank the same


@pytest.mark.parametrize("form", FORMS)
def test_one_grouped_allreduce_per_step(form, monkeypatch):
    calls = []
    original = core_ops.grouped_allreduce_async
    monkeypatch.setattr(core_ops, "grouped_allreduce_async",
                        lambda tensors, *a, **k: calls.append(len(tensors)) or original(tensors, *a, **k))
    train(hvd.DistributedOptimizer(optax.sgd(0.1)), init_params(1), 3, local_batch, form)
    assert calls == ([4] * 3 if hvd.size() > 1 else []), calls     # 4 leaves, one fused unit per step


@pytest.mark.parametrize("form", FORMS)
def test_backward_passes_per_step_accumulates_then_applies(form):
    """Two passes per step: updates every second call, with the gradients of both passes summed (as torch)."""
    params = init_params(2)
    ours = train(hvd.DistributedOptimizer(optax.sgd(0.1), backward_passes_per_step=2), params, 4,
                 local_batch, form)
    expected = params
    for i in (0, 2):
        g = jax.tree_util.tree_map(jnp.add, gradient(expected, *full_batch(i)),
                                   gradient(expected, *full_batch(i + 1)))
        expected = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, expected, g)
    assert_trees_close(ours, expected)
    odd = train(hvd.DistributedOptimizer(optax.sgd(0.1), backward_passes_per_step=2), params, 1,
                local_batch, form)
    assert_trees_close(odd, params, atol=0)                                  # the first pass only accumulates


@pytest.mark.parametrize("form", FORMS)
def test_op_predivide_and_compression(form):
    params, size = init_params(3), hvd.size()
    data = local_batch
    reference = train(optax.sgd(0.1), params, 2, full_batch, "jit")
    assert_trees_close(train(hvd.DistributedOptimizer(optax.sgd(0.1), gradient_predivide_factor=2.0), params, 2,
                             data, form), reference)
    assert_trees_close(train(hvd.DistributedOptimizer(optax.sgd(0.1 / size), op=hvd.Sum), params, 2, data, form),
                       reference)
    assert_trees_close(train(hvd.DistributedOptimizer(optax.sgd(0.1), compression=hvd.Compression.fp16), params, 2,
                             data, form), reference, atol=2e-3)


def test_invalid_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with op != Average"):
        hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        hvd.DistributedOptimizer(optax.sgd(0.1), backward_passes_per_step=0)


@pytest.mark.parametrize("form", FORMS)
def test_broadcast_parameters_and_optimizer_state(form):
    """Every rank starts from different parameters and optax state (and, eagerly, Python leaves); afterwards
    every rank holds the root's."""
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    params = init_params(10 + rank)
    inner = optax.sgd(0.1, momentum=0.9)
    _, state = inner.update(gradient(params, *batch(0, rank)), inner.init(params), params)
    tree = {"params": params, "opt_state": state}
    if form == "eager":
        tree.update(epoch=7 + rank, tag=f"rank{rank}")
        out = hvd.broadcast_parameters(tree, root_rank=root)
    else:
        out = jax.jit(lambda t: hvd.broadcast_variables(t, root_rank=root))(tree)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(tree)
    before = hvd.allgather_object(jax.device_get(tree))
    assert_trees_close(out, before[root], atol=0)
    assert_trees_close(out["params"], init_params(10 + root), atol=0)
