"""Data-parallel JAX training of a small MLP on scikit-learn's bundled digits data (plain JAX + optax).

Launch with ``horovodrun -np 2 python examples/jax/jax_digits.py``. It is upstream's program shape, in JAX:
``hvd.init()``, the training set sharded by rank, the learning rate scaled by ``hvd.size()``,
``hvd.DistributedOptimizer`` around an optax optimizer (one fused allreduce of the gradients per step, inside
the jitted train step), parameters and optimizer state broadcast from rank 0, metrics averaged with
``hvd.allreduce``, and progress output from rank 0 only. Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import logging
from typing import Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovod.jax as hvd

log = logging.getLogger("jax_digits")
Params = Dict[str, Dict[str, jax.Array]]


def load_data() -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as (N, 64) float32 rows in [0, 1], split 75/25 with a fixed seed."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    return train_test_split(x, digits.target.astype(np.int32), test_size=0.25, random_state=0,
                            stratify=digits.target)


def init_params(key: jax.Array, sizes=(64, 128, 10)) -> Params:
    """A two-layer MLP's weights (He-initialised) and zero biases."""
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, sub = jax.random.split(key)
        params[f"dense{i}"] = {"w": jax.random.normal(sub, (n_in, n_out)) * jnp.sqrt(2.0 / n_in),
                               "b": jnp.zeros(n_out)}
    return params


def predict(params: Params, x: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["dense0"]["w"] + params["dense0"]["b"])
    return h @ params["dense1"]["w"] + params["dense1"]["b"]


def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(predict(params, x), y).mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one rank (scaled by size)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 on the wire")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x_train, x_test, y_train, y_test = load_data()
    # Each rank trains on its own 1/size of the training set and scores its own shard of the test set.
    x_train, y_train = x_train[rank::size], y_train[rank::size]
    x_test, y_test = x_test[rank::size], y_test[rank::size]

    # Deliberately different per rank until rank 0's values are broadcast.
    params = init_params(jax.random.PRNGKey(args.seed + rank))
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # Horovod: scale the learning rate by the number of ranks (the global batch is size times larger).
    optimizer = hvd.DistributedOptimizer(optax.sgd(args.lr * size, momentum=0.9), compression=compression)
    opt_state = optimizer.init(params)
    params = hvd.broadcast_parameters(params, root_rank=0)
    opt_state = hvd.broadcast_parameters(opt_state, root_rank=0)

    @jax.jit
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)   # the gradients are averaged here
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(args.seed + rank)
    # Every rank runs the same number of steps per epoch (the shards differ in length by at most one row).
    steps = min(hvd.allgather_object(len(x_train))) // args.batch_size
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        total = 0.0
        for step in range(steps):
            idx = order[step * args.batch_size:(step + 1) * args.batch_size]
            params, opt_state, loss = train_step(params, opt_state, x_train[idx], y_train[idx])
            total += float(loss)
        mean_loss = float(hvd.allreduce(jnp.float32(total / steps), name="avg_loss"))
        if rank == 0:
            log.info("epoch %d: loss %.4f", epoch + 1, mean_loss)

    correct = int((predict(params, x_test).argmax(1) == y_test).sum())
    totals = hvd.allreduce(jnp.asarray([correct, len(y_test)], jnp.int32), op=hvd.Sum, name="accuracy")
    accuracy = float(totals[0]) / float(totals[1])
    if rank == 0:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", int(totals[1]), 100 * accuracy, size)
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
