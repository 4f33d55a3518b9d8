"""One rank of the JAX synthetic benchmark: a plain-JAX model trained on one synthetic batch with a jitted step,
timed as upstream's synthetic benchmarks do (warm-up, then iterations of N steps), printing upstream's lines
on rank 0.

``--backend horovod`` (under horovodrun): ``hvd.DistributedOptimizer`` around optax SGD inside the jitted step
(one grouped allreduce of the gradients per step, as an ordered host callback). ``--backend jax``: JAX's own
multi-process data parallelism: ``jax.distributed.initialize`` (coordinator on loopback) with Gloo CPU
collectives, the step a ``shard_map`` over a mesh of every process's CPU device with ``jax.lax.pmean`` of the
gradients. Both use the same model, batch per rank, optimizer and one XLA thread per rank.

    horovodrun -np 2 python -m benchmarks.workers.jax_synthetic_step --backend horovod
    python -m benchmarks.workers.jax_synthetic_step --backend jax --process-id I --num-processes N --port P
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any, Callable, Dict, Tuple

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.workers.synthetic_loop import run_synthetic

log = logging.getLogger("jax_synthetic_benchmark")


def init_model(name: str, image_size: int, key: jax.Array) -> Tuple[Dict[str, Any], Callable]:
    """(params, apply) of ``mlp`` (3 dense layers of 1024) or ``cnn`` (two 3x3 convolutions, a dense head)."""
    k = jax.random.split(key, 4)
    if name == "mlp":
        sizes = [3 * image_size * image_size, 1024, 1024, 10]
        params = {f"dense{i}": {"w": jax.random.normal(k[i], (a, b)) * (2.0 / a) ** 0.5, "b": jnp.zeros(b)}
                  for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))}

        def apply(p, x):
            x = x.reshape(x.shape[0], -1)
            for i in range(len(sizes) - 1):
                x = x @ p[f"dense{i}"]["w"] + p[f"dense{i}"]["b"]
                x = jax.nn.relu(x) if i < len(sizes) - 2 else x
            return x
        return params, apply
    if name == "cnn":
        flat = 64 * (image_size // 4) ** 2
        params = {"conv1": jax.random.normal(k[0], (32, 3, 3, 3)) * 0.2,
                  "conv2": jax.random.normal(k[1], (64, 32, 3, 3)) * 0.06,
                  "dense": {"w": jax.random.normal(k[2], (flat, 256)) * (2.0 / flat) ** 0.5, "b": jnp.zeros(256)},
                  "out": {"w": jax.random.normal(k[3], (256, 10)) * 0.06, "b": jnp.zeros(10)}}

        def conv_pool(x, w):
            x = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
            return jax.lax.reduce_window(jax.nn.relu(x), -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

        def apply(p, x):
            x = conv_pool(conv_pool(x, p["conv1"]), p["conv2"]).reshape(x.shape[0], -1)
            x = jax.nn.relu(x @ p["dense"]["w"] + p["dense"]["b"])
            return x @ p["out"]["w"] + p["out"]["b"]
        return params, apply
    raise ValueError(f"unknown model {name!r}: use mlp or cnn")


def horovod_step(apply: Callable, params, x, y, lr: float):
    """(step, state, size, rank, backend name) with horovod.jax's DistributedOptimizer inside the jitted step."""
    import horovod.jax as hvd

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optax.sgd(lr * hvd.size(), momentum=0.9))
    params = hvd.broadcast_parameters(params, root_rank=0)
    state = (params, optimizer.init(params))

    @jax.jit
    def step(state):
        params, opt_state = state
        grads = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(apply(p, x), y).mean())(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step, state, hvd.size(), hvd.rank(), "horovod.jax (DistributedOptimizer, one grouped allreduce)"


def jax_step(apply: Callable, params, x, y, lr: float, opts: argparse.Namespace):
    """The same training with JAX's own multi-process data parallelism (Gloo CPU collectives, pmean)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("d",))
    optimizer = optax.sgd(lr * opts.num_processes, momentum=0.9)

    def replicated(tree):
        return jax.tree_util.tree_map(lambda a: jax.make_array_from_process_local_data(
            NamedSharding(mesh, P()), np.asarray(a), a.shape), tree)

    def sharded(a):
        return jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), np.asarray(a),
                                                      (a.shape[0] * opts.num_processes, *a.shape[1:]))

    gx, gy = sharded(x), sharded(y)
    state = replicated((params, optimizer.init(params)))

    def local_step(state, x, y):
        params, opt_state = state
        grads = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(apply(p, x), y).mean())(params)
        grads = jax.lax.pmean(grads, "d")
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    sharded_step = jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=P()))
    return (lambda state: sharded_step(state, gx, gy), state, opts.num_processes, opts.process_id,
            "JAX multi-process (jax.distributed, Gloo CPU collectives, shard_map + pmean)")


def start_jax_distributed(opts: argparse.Namespace) -> None:
    """``jax.distributed.initialize`` with Gloo CPU collectives (before anything else touches a JAX backend)."""
    if opts.backend == "jax" and opts.num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{opts.port}", num_processes=opts.num_processes,
                                   process_id=opts.process_id)


def run(opts: argparse.Namespace) -> Dict[str, Any]:
    """Train and time; returns rank 0's figures (also written to ``--json``)."""
    start_jax_distributed(opts)
    params, apply = init_model(opts.model, opts.image_size, jax.random.PRNGKey(0))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((opts.batch_size, 3, opts.image_size, opts.image_size)).astype(np.float32)
    y = rng.integers(0, 10, opts.batch_size).astype(np.int32)
    if opts.backend == "horovod":
        step, state, size, rank, backend = horovod_step(apply, params, jnp.asarray(x), jnp.asarray(y), 0.01)
    else:
        step, state, size, rank, backend = jax_step(apply, params, x, y, 0.01, opts)
    holder = [state]

    def benchmark_step() -> None:
        holder[0] = step(holder[0])

    def say(msg: str, *a: Any) -> None:
        if rank == 0:
            print(msg % a, flush=True)

    leaves = jax.tree_util.tree_leaves(params)
    result = run_synthetic(benchmark_step, lambda: jax.block_until_ready(holder[0]), say, model=opts.model,
                           n_params=sum(int(np.prod(p.shape)) for p in leaves), n_tensors=len(leaves),
                           batch_size=opts.batch_size, size=size, num_warmup_batches=opts.num_warmup_batches,
                           num_batches_per_iter=opts.num_batches_per_iter, num_iters=opts.num_iters,
                           extra_lines=[f"Backend: {backend}"])
    result["backend"] = opts.backend
    if opts.json and rank == 0:
        with open(opts.json, "w") as f:
            json.dump(result, f)
    if opts.backend == "jax" and opts.num_processes > 1:
        jax.distributed.shutdown()
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["horovod", "jax"], default="horovod")
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=5)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--process-id", type=int, default=0, help="--backend jax: this process's id")
    parser.add_argument("--num-processes", type=int, default=1, help="--backend jax: how many processes")
    parser.add_argument("--port", type=int, default=0, help="--backend jax: the coordinator's loopback port")
    parser.add_argument("--json", help="rank 0 writes the figures here")
    logging.basicConfig(level=logging.WARNING)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
