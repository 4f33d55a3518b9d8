"""The small two-layer model the horovod.jax optimizer bodies train (tests/parallel/test_jax_optimizer.py and
test_jax_zero.py): its parameters, its loss, and each rank's deterministic shard of a step's batch."""
import jax
import jax.numpy as jnp
import numpy as np

SHARD = 4       # rows per rank and step


def init_params(seed):
    """A 5 -> 8 -> 3 tanh MLP's parameters as a nested dict, from ``seed``."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"hidden": {"w": jax.random.normal(k1, (5, 8)) * 0.3, "b": jnp.zeros(8)},
            "out": {"w": jax.random.normal(k2, (8, 3)) * 0.3, "b": jnp.zeros(3)}}


def loss(params, x, y):
    """Mean squared error of the model on (x, y)."""
    h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return jnp.mean((h @ params["out"]["w"] + params["out"]["b"] - y) ** 2)


def batch(step, rank):
    """Rank ``rank``'s shard of step ``step``'s batch."""
    rng = np.random.default_rng(1000 * step + rank)
    return jnp.asarray(rng.normal(size=(SHARD, 5)), jnp.float32), jnp.asarray(rng.normal(size=(SHARD, 3)),
                                                                              jnp.float32)


gradient = jax.jit(jax.grad(loss))
