"""One rank of ``benchmarks/zero_memory.py``, run under horovodrun: an MLP of tens of millions of parameters trained
with Adam, through ``hvd.ZeroRedundancyOptimizer`` or ``hvd.DistributedOptimizer``.

Modes (rank 0 writes the JSON):

- ``memory-zero`` / ``memory-dist``: one optimizer in a fresh process; a few steps, then every rank's
  optimizer-state bytes (the tensors in ``.optim.state``, or in the plain optimizer's ``state``) and peak RSS
  (``ru_maxrss``), with the RSS before the first step for reference.
- ``time``: both optimizers in one process, on two copies of the model, timed in alternating windows (so that
  the noise of a shared machine hits both alike): the median over windows of the mean time per training
  iteration (zero_grad, forward, backward, step), and of ``step()`` alone.
- ``jax``: the optax state bytes per rank of ``horovod.jax.ZeroRedundancyOptimizer(optax.adam)`` against
  ``optax.adam`` on the same shapes, and one jitted update of each (that it runs; not timed).
- ``keras``: the same for Keras 3 on TensorFlow: the bytes of the Adam variables (``optimizer.variables`` with a
  shape) of ``horovod.tensorflow.keras.ZeroRedundancyOptimizer(keras.optimizers.Adam)`` against a plain Adam's,
  each after one applied step (not timed).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from typing import Any, Dict, List, Tuple


def layer_dims(width: int, depth: int, inputs: int, outputs: int) -> List[Tuple[int, int]]:
    dims = [inputs] + [width] * depth + [outputs]
    return list(zip(dims[:-1], dims[1:]))


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024          # Linux: KiB


def torch_state_bytes(state: Dict[Any, Dict[str, Any]]) -> int:
    import torch

    return sum(v.numel() * v.element_size() for s in state.values() for v in s.values() if torch.is_tensor(v))


def build(kind: str, args: argparse.Namespace, seed: int = 0):
    import torch
    from torch import nn

    import horovod.torch as hvd

    torch.manual_seed(seed)
    layers: List[nn.Module] = []
    for i, (a, b) in enumerate(layer_dims(args.width, args.depth, args.inputs, args.outputs)):
        layers.append(nn.Linear(a, b))
        if i < args.depth:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    if kind == "zero":
        opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-4)
    else:
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                       named_parameters=[(f"{kind}.{n}", p) for n, p in model.named_parameters()])
    return model, opt


def optimizer_state(kind: str, opt) -> int:
    return torch_state_bytes(opt.optim.state if kind == "zero" else opt.state)


def iteration(model, opt, x, y) -> float:
    """One training iteration; returns the seconds ``step()`` took."""
    import torch.nn.functional as F

    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    start = time.perf_counter()
    opt.step()
    return time.perf_counter() - start


def memory(kind: str, args: argparse.Namespace) -> Dict[str, Any]:
    import torch

    import horovod.torch as hvd

    model, opt = build(kind, args)
    x, y = torch.randn(args.batch, args.inputs), torch.randint(0, args.outputs, (args.batch,))
    before = peak_rss_bytes()
    for _ in range(args.memory_steps):
        iteration(model, opt, x, y)
    mine = {"state_bytes": optimizer_state(kind, opt), "peak_rss": peak_rss_bytes(), "rss_before_steps": before}
    return {"kind": kind, "params": sum(p.numel() for p in model.parameters()),
            "ranks": hvd.allgather_object(mine, name="zero_step.memory")}


def timing(args: argparse.Namespace) -> Dict[str, Any]:
    import torch

    import horovod.torch as hvd

    runs = {kind: build(kind, args) for kind in ("dist", "zero")}
    x, y = torch.randn(args.batch, args.inputs), torch.randint(0, args.outputs, (args.batch,))
    for model, opt in runs.values():
        for _ in range(args.warmup):
            iteration(model, opt, x, y)
    per_iter: Dict[str, List[float]] = {kind: [] for kind in runs}
    per_step: Dict[str, List[float]] = {kind: [] for kind in runs}
    for window in range(args.windows):
        order = list(runs) if window % 2 == 0 else list(reversed(list(runs)))     # ABBA: no kind always first
        for kind in order:
            model, opt = runs[kind]
            hvd.barrier()
            start, stepping = time.perf_counter(), 0.0
            for _ in range(args.steps):
                stepping += iteration(model, opt, x, y)
            per_iter[kind].append((time.perf_counter() - start) / args.steps)
            per_step[kind].append(stepping / args.steps)
    diff = max((p - q).abs().max().item() for p, q in zip(runs["dist"][0].parameters(), runs["zero"][0].parameters()))
    return {"iteration_s": {k: statistics.median(v) for k, v in per_iter.items()},
            "step_s": {k: statistics.median(v) for k, v in per_step.items()},
            "windows": per_iter, "max_param_difference": diff}


def jax_state(args: argparse.Namespace) -> Dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import horovod.jax as hvd

    keys = jax.random.split(jax.random.PRNGKey(0), args.depth + 1)
    params = {f"layer{i}": {"w": jax.random.normal(k, (a, b)) * 0.01, "b": jnp.zeros(b)}
              for i, (k, (a, b)) in enumerate(zip(keys, layer_dims(args.width, args.depth, args.inputs,
                                                                  args.outputs)))}

    def nbytes(tree) -> int:
        return sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree) if np.ndim(x))

    out = {}
    for kind, opt in (("zero", hvd.ZeroRedundancyOptimizer(optax.adam(1e-4))), ("plain", optax.adam(1e-4))):
        state = opt.init(params)
        grads = jax.tree_util.tree_map(jnp.ones_like, params)
        updates, state = jax.jit(opt.update)(grads, state, params)
        jax.block_until_ready(updates)
        out[kind] = nbytes(state)
    return {"params": sum(x.size for x in jax.tree_util.tree_leaves(params)),
            "ranks": hvd.allgather_object(out, name="zero_step.jax")}


def keras_state(args: argparse.Namespace) -> Dict[str, Any]:
    import keras
    import numpy as np
    import tensorflow as tf

    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    layers = [keras.Input((args.inputs,))] + [keras.layers.Dense(b) for _, b in
                                                 layer_dims(args.width, args.depth, args.inputs, args.outputs)]
    model = keras.Sequential(layers)
    variables = model.trainable_variables

    def nbytes(opt) -> int:
        return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in opt.variables if len(v.shape))

    out = {}
    for kind, opt in (("zero", hvd.ZeroRedundancyOptimizer(keras.optimizers.Adam(1e-4))),
                      ("plain", keras.optimizers.Adam(1e-4))):
        opt.apply([tf.ones_like(v) for v in variables], variables)
        out[kind] = nbytes(opt)
        del opt
    return {"params": sum(int(np.prod(v.shape)) for v in variables),
            "ranks": hvd_tf.allgather_object(out, name="zero_step.keras")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["memory-zero", "memory-dist", "time", "jax", "keras"])
    parser.add_argument("out")
    parser.add_argument("--width", type=int, default=1536)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--inputs", type=int, default=1024)
    parser.add_argument("--outputs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3, help="iterations per timed window")
    args = parser.parse_args()
    if args.mode == "jax":
        import horovod.jax as hvd_jax

        hvd_jax.init()
        result, rank = jax_state(args), hvd_jax.rank()
    elif args.mode == "keras":
        import horovod.tensorflow.keras as hvd_keras

        hvd_keras.init()
        result, rank = keras_state(args), hvd_keras.rank()
    else:
        import torch

        import horovod.torch as hvd

        torch.set_num_threads(1)
        hvd.init()
        result = timing(args) if args.mode == "time" else memory(args.mode.split("-")[1], args)
        rank = hvd.rank()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
