"""One training step of a small MLP with horovod.torch's DistributedOptimizer or torch's DDP, or with Keras 3 on
TensorFlow and horovod.keras's DistributedOptimizer; run under horovodrun (``hvd``, ``keras``) or torchrun
(``ddp``).

    python -m benchmarks.workers.small_model_step hvd|ddp|keras OUT.json MODELS [ROUNDS] [STEPS] [GROUPS]

GROUPS: the torch DistributedOptimizer's ``groups`` (an int; 0, the default: none).

Keras: the same layers (Dense, ReLU between), compiled with SGD and sparse categorical cross-entropy, one
``train_on_batch`` per step, TensorFlow on one intra-op and one inter-op thread.

MODELS is a ``;``-separated list of layer widths (``784,128,10;256,64,64,10``): Linear layers with ReLU between,
float32, a batch of 32 random rows and cross-entropy, SGD; one torch thread per rank. Per model, ``ROUNDS`` rounds
of ``STEPS`` timed steps alternate between the distributed step and the same step on a local copy of the model
with a plain optimizer (no collective: what sharing the cores costs), so that the machine's drift falls on both;
rank 0 writes each one's median step time (seconds) and the model's parameter count and tensors.
"""
from __future__ import annotations

import copy
import math
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch

from benchmarks.workers.timing import finish_job


def build(widths: List[int]) -> torch.nn.Module:
    layers: List[torch.nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _timed(step: Callable[[], None], barrier: Callable[[], None], steps: int) -> float:
    for _ in range(max(10, steps // 10)):
        step()
    barrier()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def steps(widths: List[int], mode: str, groups: int = 0) -> Tuple[Callable[[], None], Callable[[], None],
                                                                   torch.nn.Module]:
    """The distributed step (``mode``: DistributedOptimizer, with ``groups`` if not 0, or DDP) and the local one, on
    copies of one model."""
    torch.manual_seed(0)
    model = build(widths)
    local = copy.deepcopy(model)
    x, y = torch.randn(32, widths[0]), torch.randint(0, widths[-1], (32,))
    loss_fn = torch.nn.CrossEntropyLoss()
    if mode == "hvd":
        import horovod.torch as hvd
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters(), groups=groups or None)
        dist_model = model
    else:
        dist_model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(dist_model.parameters(), lr=0.01)
    plain = torch.optim.SGD(local.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        loss_fn(dist_model(x), y).backward()
        opt.step()

    def local_step() -> None:
        plain.zero_grad()
        loss_fn(local(x), y).backward()
        plain.step()

    return step, local_step, model


def keras_steps(widths: List[int]) -> Tuple[Callable[[], None], Callable[[], None], object]:
    """``steps`` for Keras 3 on TensorFlow: horovod.keras's DistributedOptimizer, and a plain copy."""
    import keras
    import numpy as np

    import horovod.keras as hvd_keras

    def build_keras() -> keras.Model:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((widths[0],))
        x = inputs
        for i, w in enumerate(widths[1:]):
            x = keras.layers.Dense(w, activation="relu" if i < len(widths) - 2 else None)(x)
        return keras.Model(inputs, x)

    model, local = build_keras(), build_keras()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss=loss)
    local.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, widths[0])).astype(np.float32)
    y = rng.integers(0, widths[-1], 32)
    return (lambda: model.train_on_batch(x, y)), (lambda: local.train_on_batch(x, y)), model


def main() -> None:
    mode, out, models = sys.argv[1], sys.argv[2], [[int(w) for w in m.split(",")] for m in sys.argv[3].split(";")]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    steps_per_round = int(sys.argv[5]) if len(sys.argv) > 5 else 300
    groups = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    torch.set_num_threads(1)
    if mode == "keras":
        os.environ.setdefault("KERAS_BACKEND", "tensorflow")
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        import horovod.keras as hvd
        import horovod.numpy as hvd_numpy  # (horovod.keras has no barrier, as upstream's)
        hvd.init()
        rank, barrier = hvd.rank(), hvd_numpy.barrier
    elif mode == "hvd":
        import horovod.torch as hvd
        hvd.init()
        rank, barrier = hvd.rank(), hvd.barrier
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, barrier = dist.get_rank(), dist.barrier
    results: Dict[str, dict] = {}
    for widths in models:
        step, local_step, model = keras_steps(widths) if mode == "keras" else steps(widths, mode, groups)
        samples: Dict[str, List[float]] = {"step": [], "local": []}
        for _ in range(rounds):
            samples["step"].append(_timed(step, barrier, steps_per_round))
            samples["local"].append(_timed(local_step, barrier, steps_per_round))
        label = ",".join(str(w) for w in widths)
        weights = ([tuple(w.shape) for w in model.trainable_weights] if mode == "keras"
                   else [tuple(p.shape) for p in model.parameters()])
        results[label] = {"parameters": sum(math.prod(s) for s in weights), "tensors": len(weights),
                          **{k: statistics.median(v) for k, v in samples.items()}}
        if rank == 0:
            print(f"{mode} {label}: step {results[label]['step'] * 1e6:.0f} us, local "
                  f"{results[label]['local'] * 1e6:.0f} us", flush=True)
    finish_job(out, {"mode": mode, "results": results}, rank, hvd.shutdown if mode != "ddp" else None)


if __name__ == "__main__":
    main()
