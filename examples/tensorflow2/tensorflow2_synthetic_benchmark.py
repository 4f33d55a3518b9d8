"""Upstream's TensorFlow 2 synthetic benchmark: training throughput on random data, in images per second.

    horovodrun -np 2 python examples/tensorflow2/tensorflow2_synthetic_benchmark.py --model cnn

Upstream's program shape: a ``@tf.function`` training step whose ``tf.GradientTape`` is wrapped in
``hvd.DistributedGradientTape``, the model and optimizer variables broadcast from rank 0 after the first batch,
SGD with lr 0.01 x size, and random images. Each iteration times ``--num-batches-per-iter`` steps; rank 0 prints
upstream's lines ("Iter #k: X img/sec per CPU", "Img/sec per CPU: mean +-1.96*std", "Total img/sec on N
CPU(s): ...") and, with ``--json``, the same numbers as ``examples/pytorch/pytorch_synthetic_benchmark.py``.

Models (``--model``), built from ``keras.layers`` (nothing is downloaded):

- ``cnn`` (default): four 3x3 convolutions (32-64-128-256 channels, 2x2 max-pooling after the last three) and
  a 1024-unit dense layer on 32x32 images: about 4.6 M parameters in 12 tensors, most of them (4.2 M) in the
  first dense layer, as in VGG-style networks.
- ``mlp``: 3 x 32 x 32 -> 1024 -> 1024 -> classes (the torch example's MLP, 4.2 M parameters).
- any ``keras.applications`` model by its name (e.g. ``ResNet50``, ``MobileNetV2``), with ``weights=None`` and
  ``--image-size`` inputs (upstream uses 224; ResNet50 takes seconds per batch on a CPU core).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import timeit
from typing import Any, Dict, List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported: no C++ info banners

import keras
import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

log = logging.getLogger("tensorflow2_synthetic_benchmark")
BUILT_IN = ("cnn", "mlp")


def build_model(name: str, image_size: int, num_classes: int = 10) -> keras.Model:
    """``cnn``, ``mlp`` or a ``keras.applications`` model by name (``weights=None``); every one returns logits."""
    inputs = keras.Input((image_size, image_size, 3))
    if name == "cnn":
        x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
        for filters in (64, 128, 256):
            x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
            x = keras.layers.MaxPooling2D(2)(x)
        x = keras.layers.Dense(1024, activation="relu")(keras.layers.Flatten()(x))
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="cnn")
    if name == "mlp":
        x = keras.layers.Flatten()(inputs)
        for _ in range(2):
            x = keras.layers.Dense(1024, activation="relu")(x)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="mlp")
    application = getattr(keras.applications, name, None)
    if application is None or not callable(application):
        raise ValueError(f"unknown model {name!r}: use one of {', '.join(BUILT_IN)} or a keras.applications "
                         f"model such as ResNet50")
    return application(weights=None, input_tensor=inputs, classes=num_classes, classifier_activation=None)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Run the benchmark; returns the numbers (rank 0's are the ones reported)."""
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.config.threading.set_intra_op_parallelism_threads(args.num_threads)
    if args.num_interop_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.num_interop_threads)
    cuda = not args.no_cuda and bool(tf.config.list_physical_devices("GPU"))
    keras.utils.set_random_seed(args.seed)

    model = build_model(args.model, args.image_size)
    n_params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    opt = keras.optimizers.SGD(learning_rate=0.01 * size)  # upstream: lr scaled by size
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    op = hvd.Adasum if args.use_adasum else hvd.Average

    data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    target = tf.random.uniform([args.batch_size], minval=0, maxval=10, dtype=tf.int64)

    @tf.function
    def benchmark_step(first_batch: bool) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression, op=op)
        gradients = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(gradients, model.trainable_variables))
        # Horovod: broadcast rank 0's initial variables once the first step has created the optimizer's.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

    def say(msg: str, *a: Any) -> None:
        if rank == 0:
            log.info(msg, *a)

    device = "GPU" if cuda else "CPU"
    say("Model: %s (%.2f M parameters, %d tensors)", args.model, n_params / 1e6, len(model.trainable_variables))
    say("Batch size: %d", args.batch_size)
    say("Number of %ss: %d", device, size)

    with tf.device(device):
        say("Running warmup...")
        benchmark_step(first_batch=True)
        timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)
        say("Running benchmark...")
        img_secs: List[float] = []
        for x in range(args.num_iters):
            elapsed = timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter)
            img_sec = args.batch_size * args.num_batches_per_iter / elapsed
            say("Iter #%d: %.1f img/sec per %s", x, img_sec, device)
            img_secs.append(img_sec)

    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    say("Img/sec per %s: %.1f +-%.1f", device, mean, conf)
    say("Total img/sec on %d %s(s): %.1f +-%.1f", size, device, size * mean, size * conf)
    result = {"backend": "horovod", "model": args.model, "parameters": n_params, "batch_size": args.batch_size,
              "image_size": args.image_size, "size": size, "num_threads": args.num_threads,
              "img_sec_per_iter": img_secs, "img_sec_mean": mean, "img_sec_conf": conf, "total_img_sec": size * mean}
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(result, f)
    hvd.shutdown()
    return result


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cnn",
                        help="cnn, mlp, or a keras.applications model name such as ResNet50 (weights=None)")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression during allreduce")
    parser.add_argument("--no-cuda", action="store_true", help="disable the GPU even if one is available")
    parser.add_argument("--use-adasum", action="store_true", help="combine gradients with the Adasum reduction")
    parser.add_argument("--num-threads", type=int, default=1, help="TensorFlow intra-op threads per rank")
    parser.add_argument("--num-interop-threads", type=int, default=1,
                        help="TensorFlow inter-op threads per rank (0: TensorFlow's default, one per core)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="rank 0 writes the numbers here")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run(parse_args(argv))


if __name__ == "__main__":
    main()
