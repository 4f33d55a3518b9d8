"""MXNet Gluon synthetic benchmark and its scaling on 1 and N ranks, in one run (run it with .venv-mxnet's python).

Driver (the default): runs this same file with ``--worker`` under this project's ``horovodrun`` at ``-np 1`` and
``-np N``, alternated ``--repeats`` times (each pair measured close together, so the machine's load falls on both),
and prints each model's scaling efficiency, throughput(N) / (N x throughput(1)), per pair and as a median, with
the 1-minute load average before each run. MXNet's own data parallelism (``kvstore='dist_sync'``) needs a
parameter-server process per host and is not a fair peer on one 2-core host, so the reference is N x one rank.

Worker (``--worker``, under horovodrun): upstream's synthetic-benchmark loop and output ("Iter #k: X img/sec per
CPU", "Img/sec per CPU: mean +-1.96*std", "Total img/sec on N CPU(s): ...") for a Gluon model on random data:
``hvd.DistributedTrainer``, parameters broadcast from rank 0, ``mx.nd.waitall()`` closing each timed iteration
(MXNet runs operators asynchronously). Every rank runs one MXNet engine worker thread and one OpenMP thread, in
both runs, so that one rank is one core.

    .venv-mxnet/bin/python benchmarks/mxnet_synthetic.py [--np 2] [--models resnet,mlp] [--repeats 3] [--json out.json]
    horovodrun -np 2 .venv-mxnet/bin/python benchmarks/mxnet_synthetic.py --worker --model resnet
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.tensorflow_scaling import load_average  # noqa: E402
from benchmarks.tensorflow_scaling import report as tf_report  # noqa: E402
from benchmarks.torch_scaling import _run, add_scaling_options, horovod_cmd  # noqa: E402
from benchmarks.workers.synthetic_loop import run_synthetic  # noqa: E402

PINNED = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1", "MXNET_CPU_PRIORITY_NTHREADS": "1"}
log = logging.getLogger("benchmarks.mxnet_synthetic")


# ------------------------------------------------------------------ worker (one rank)
def build_model(name: str, image_size: int):
    """``resnet`` (Gluon's ResNet-18 v1 for small images, about 11.2 M parameters) or ``mlp``
    (3 x size x size -> 1024 -> 1024 -> 10)."""
    from mxnet import gluon

    if name == "resnet":
        return gluon.model_zoo.vision.resnet18_v1(classes=10, thumbnail=True)
    if name == "mlp":
        net = gluon.nn.HybridSequential()
        with net.name_scope():
            net.add(gluon.nn.Dense(1024, activation="relu", in_units=3 * image_size * image_size),
                    gluon.nn.Dense(1024, activation="relu", in_units=1024), gluon.nn.Dense(10, in_units=1024))
        return net
    raise ValueError(f"unknown model {name!r}")


def worker(args: argparse.Namespace) -> Dict[str, Any]:
    """One rank of the benchmark; rank 0 prints upstream's lines and writes the numbers to ``args.json``."""
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon

    import horovod.mxnet as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    mx.random.seed(args.seed)
    net = build_model(args.model, args.image_size)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    data = mx.nd.random.uniform(shape=(args.batch_size, 3, args.image_size, args.image_size))
    label = mx.nd.array(np.random.RandomState(rank).randint(0, 10, args.batch_size))
    net(data).wait_to_read()                                     # deferred parameters get their shapes
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.01 * size})   # upstream: lr x size
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def benchmark_step() -> None:
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(args.batch_size)

    def say(msg: str, *a: Any) -> None:
        if rank == 0:
            log.info(msg, *a)

    result = run_synthetic(benchmark_step, mx.nd.waitall, say, model=args.model,
                           n_params=sum(p.data().size for p in params.values()), n_tensors=len(list(params.keys())),
                           batch_size=args.batch_size, size=size, num_warmup_batches=args.num_warmup_batches,
                           num_batches_per_iter=args.num_batches_per_iter, num_iters=args.num_iters)
    if args.json and rank == 0:
        Path(args.json).write_text(json.dumps(result))
    hvd.shutdown()
    return result


# ------------------------------------------------------------------ driver (alternated 1-rank / N-rank jobs)
def pairs_of_runs(model: str, opts: argparse.Namespace, tmp: Path) -> List[Dict[int, Optional[dict]]]:
    """``opts.repeats`` alternated runs of ``model`` at 1 and ``opts.np`` ranks (rank 0's numbers and the load)."""
    batches = opts.mlp_num_batches_per_iter if model == "mlp" else opts.num_batches_per_iter
    common = [__file__, "--worker", "--model", model, "--batch-size", str(opts.batch_size), "--image-size",
              str(opts.image_size), "--num-warmup-batches", str(opts.num_warmup_batches), "--num-batches-per-iter",
              str(batches), "--num-iters", str(opts.num_iters)]
    pairs = []
    for rep in range(opts.repeats):
        results: Dict[int, Optional[dict]] = {}
        for n in (1, opts.np):
            out = tmp / f"{model}-{n}-{rep}.json"
            load = load_average()
            res = _run(horovod_cmd(n, [*common, "--json", str(out)]), out, opts.timeout)
            if res:
                res["load1"] = load
                log.info("  %s np=%d: %.1f img/sec total, load %.2f", model, n, res["total_img_sec"], load)
            results[n] = res
        pairs.append(results)
    return pairs


def report(synth: Dict[str, List[Dict[int, Optional[dict]]]], np: int) -> List[str]:
    """Every pair's figures, then each model's median efficiency and range (tensorflow_scaling's tables), and what
    was pinned here."""
    pinned = ", ".join(f"{k}={v}" for k, v in PINNED.items())
    return tf_report(synth, np)[:-1] + [f"Threads pinned: {pinned}. Scaling efficiency = {np}-rank total img/s / "
                                        f"({np} x 1-rank img/s), per pair of runs made one after the other."]


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scaling_options(parser, "resnet,mlp", warmup=3, batches=5, mlp_batches=20, iters=5)
    parser.add_argument("--repeats", type=int, default=3, help="alternated pairs of 1-rank and N-rank runs")
    parser.add_argument("--worker", action="store_true", help="run one rank of the benchmark (under horovodrun)")
    parser.add_argument("--model", default="resnet", help="the worker's model: resnet or mlp")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if opts.worker:
        worker(opts)
        return 0
    os.environ.update(PINNED)                   # _env() hands the driver's environment to every job
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        synth = {m: pairs_of_runs(m, opts, Path(tmp_name)) for m in opts.models.split(",")}
    print()
    print("\n".join(report(synth, opts.np)))
    print(f"\n(total benchmark wall time {time.perf_counter() - start:.0f} s)")
    if opts.json:
        Path(opts.json).write_text(json.dumps({"options": vars(opts), "pinned": PINNED, "synthetic": synth}, indent=1))
    return 0 if all(all(r.get(opts.np) for r in pairs) for pairs in synth.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
