"""horovod.jax's ZeroRedundancyOptimizer (ZeRO-1 as an optax transformation) against hvd.DistributedOptimizer.

Every rank trains a small MLP on its own shard of a batch, with the optimizer state sharded by parameter leaf
(leaves of 40, 8, 24 and 3 elements: uneven, and at 3 ranks nothing divides evenly). The parameters must match
those hvd.DistributedOptimizer reaches, eagerly and inside a jitted train step (float32, rtol and atol 1e-6:
both sum the same gradients, in the same order, so the runs agree to rounding). Jit compilations are most of the
time here, so the reference run is made once and the programs are few.
"""
import jax
import numpy as np
import optax
import pytest

import horovod.jax as hvd
from tests.support.jax_mlp import batch, gradient, init_params
from tests.support.process_sets import temporary_sets  # (turns dynamic process sets on)

FORMS = ["eager", "jit"]
TOL = dict(rtol=1e-6, atol=1e-6)


def local_batch(step):
    return batch(step, hvd.rank())




def train(optimizer, params, steps, data, form, history=None):
    """``steps`` updates (eagerly, or as one jitted train step); ``history`` collects the params after each."""
    state = optimizer.init(params)

    def step(params, state, x, y):
        updates, state = optimizer.update(gradient(params, x, y), state, params)
        return optax.apply_updates(params, updates), state

    step = step if form == "eager" else jax.jit(step)
    for i in range(steps):
        params, state = step(params, state, *data(i))
        if history is not None:
            history.append(params)
    return params, state


REFERENCE = []      # DistributedOptimizer(adam)'s params after each step, made once (jit compiles are the cost)


def reference_params(steps):
    if not REFERENCE:
        train(hvd.DistributedOptimizer(optax.adam(0.01)), init_params(0), 8, local_batch, "jit", REFERENCE)
    return REFERENCE[steps - 1]


def assert_trees_close(a, b, **tol):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **(tol or TOL))


def state_bytes(state):
    return sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(state) if np.ndim(x))


@pytest.mark.parametrize("form", FORMS)
def test_adam_matches_distributed_optimizer(form):
    params = init_params(0)
    steps = 8 if form == "jit" else 2                   # (eager optax compiles every small op, twice)
    ours, state = train(hvd.ZeroRedundancyOptimizer(optax.adam(0.01)), params, steps, local_batch, form)
    assert_trees_close(ours, reference_params(steps))
    assert_trees_close(hvd.allgather_object(jax.device_get(ours))[0], ours, rtol=0, atol=0)
    # Sharded: the Adam moments of every leaf live on exactly one rank.
    total = 2 * sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
    per_rank = hvd.allgather_object(state_bytes(state.inner_state))
    assert sum(per_rank) == total
    if hvd.size() > 1:
        assert max(per_rank) < total


def test_backward_passes_per_step_and_sum():
    """Two passes per update, summed over the passes and (op=Sum) over the ranks, as DistributedOptimizer's."""
    params = init_params(2)
    ours, _ = train(hvd.ZeroRedundancyOptimizer(optax.sgd(0.1), backward_passes_per_step=2, op=hvd.Sum),
                    params, 4, local_batch, "jit")
    expected = params
    for i in (0, 2):
        grads = [gradient(expected, *batch(i + k, r)) for k in (0, 1) for r in range(hvd.size())]
        total = jax.tree_util.tree_map(lambda *g: sum(g), *grads)
        expected = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, expected, total)
    assert_trees_close(ours, expected, rtol=1e-5, atol=1e-5)


def test_process_set_and_a_rank_outside_it():
    size = hvd.size()
    if size < 2:
        pytest.skip("needs 2 ranks for a set that leaves one out")
    params = init_params(4)
    with temporary_sets(range(size - 1)) as (ps,):
        ours, _ = train(hvd.ZeroRedundancyOptimizer(optax.adam(0.01), process_set=ps, name="zero.ps"), params, 3,
                        local_batch, "jit")
        if ps.included():
            reference, _ = train(hvd.DistributedOptimizer(optax.adam(0.01), process_set=ps, name="dist.ps"), params,
                                 3, local_batch, "jit")
        else:                                           # outside the set: the wrapped transformation alone
            reference, _ = train(optax.adam(0.01), params, 3, local_batch, "jit")
        assert_trees_close(ours, reference)


def test_invalid_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="op=Average or op=Sum"):
        hvd.ZeroRedundancyOptimizer(optax.sgd(0.1), op=hvd.Adasum)
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        hvd.ZeroRedundancyOptimizer(optax.sgd(0.1), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported"):
        hvd.ZeroRedundancyOptimizer(optax.sgd(0.1), op=hvd.Sum, gradient_predivide_factor=2.0)
