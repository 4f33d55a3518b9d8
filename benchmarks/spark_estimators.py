"""TorchEstimator.fit's training throughput in Spark tasks against the same training under horovodrun's launcher.

Both sides run the same ``TorchEstimator.fit`` on the same DataFrame (scikit-learn's digits, repeated
``--copies`` times), the digits CNN of ``examples/spark/pytorch_spark_digits.py``, 2 ranks, batch 32 per rank,
one torch thread per rank; only the backend differs: ``SparkBackend`` (the ranks in Spark barrier tasks through
``horovod.spark.run``, on ``local-cluster[2,1,1024]``) or ``HorovodRunBackend`` (the ranks started by
``horovod.run``, which is horovodrun's launcher, on this machine). Throughput is samples/s summed over the ranks,
timed inside the training loop (from the first epoch's start to the last epoch's end, on the slower rank); the
whole ``fit`` (Parquet writing, start-up, training, the model's return) is reported beside it. The two sides
alternate, ``--repeats`` times each.

    python benchmarks/spark_estimators.py [--repeats 3] [--epochs 10] [--copies 4]

Run it under the shared CPU lock (it starts Spark and ranks): ``flock /tmp/cpu.lock python ...``.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import cloudpickle
from pyspark import cloudpickle as spark_cloudpickle

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from horovod.spark.common.backend import Backend, HorovodRunBackend, SparkBackend  # noqa: E402
from horovod.spark.common.store import Store  # noqa: E402
from tests.support.spark import spark_session  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])
spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _example():
    spec = importlib.util.spec_from_file_location("pytorch_spark_digits",
                                                  ROOT / "examples" / "spark" / "pytorch_spark_digits.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    spark_cloudpickle.register_pickle_by_value(module)
    return module


class TrainingClock:
    """A TorchEstimator callback: the seconds from the start of the first epoch to the end of the last."""

    def __init__(self) -> None:
        self.started = self.seconds = 0.0

    def on_train_begin(self) -> None:
        self.started = time.perf_counter()

    def on_train_end(self) -> None:
        self.seconds = time.perf_counter() - self.started


class TimedBackend(Backend):
    """Runs the training on ``inner`` with one torch thread per rank; keeps each rank's training seconds."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.seconds: List[float] = []

    def run(self, fn, args=(), kwargs=None, env=None):
        def timed(*fn_args, **fn_kwargs):
            import torch

            torch.set_num_threads(1)
            result = fn(*fn_args, **fn_kwargs)
            return result, fn_args[0].callbacks[0].seconds

        raw = self.inner.run(timed, args=args, kwargs=kwargs, env=env)
        self.seconds = [seconds for _, seconds in raw]
        return [result for result, _ in raw]

    def num_processes(self) -> int:
        return self.inner.num_processes()


def fit_once(example, train_df, rows: int, backend: Backend, args: argparse.Namespace, work: str) -> Dict[str, Any]:
    """One fit: samples/s in the training loop (all ranks) and the fit's wall time."""
    timed = TimedBackend(backend)
    ex_args = example.parse_args(["--epochs", str(args.epochs), "--num-proc", "2"])
    assembler, estimator = example.build_pipeline(ex_args, Store.create(work)).getStages()
    estimator.setValidation(None).setBackend(timed).setCallbacks([TrainingClock()])
    train_df = assembler.transform(train_df)
    started = time.perf_counter()
    estimator.fit(train_df)
    wall = time.perf_counter() - started
    steps = max(1, rows // ex_args.batch_size // 2)
    samples = steps * ex_args.batch_size * 2 * args.epochs
    return {"samples_per_s": samples / max(timed.seconds), "fit_s": wall, "train_s": max(timed.seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--copies", type=int, default=4, help="the digits repeated this many times")
    args = parser.parse_args()
    example = _example()
    results: Dict[str, List[Dict[str, Any]]] = {"spark": [], "horovodrun": []}
    with spark_session(executors=2) as spark, tempfile.TemporaryDirectory() as tmp:
        train, _ = example.digits_frames(spark, 42)
        df = train
        for _ in range(args.copies - 1):
            df = df.unionByName(train)
        df = df.cache()
        rows = df.count()
        for repeat in range(args.repeats):
            order = ["spark", "horovodrun"] if repeat % 2 == 0 else ["horovodrun", "spark"]
            for kind in order:
                backend = SparkBackend(num_proc=2) if kind == "spark" else HorovodRunBackend(2)
                load = os.getloadavg()[0]
                result = fit_once(example, df, rows, backend, args, os.path.join(tmp, f"{kind}{repeat}"))
                result["load"] = load
                results[kind].append(result)
                print(f"{kind:>10} #{repeat + 1}: {result['samples_per_s']:8.0f} samples/s in training "
                      f"({result['train_s']:.2f} s), fit {result['fit_s']:.1f} s, load {load:.2f}", flush=True)
    print(f"\n{rows} rows, {args.epochs} epochs, 2 ranks, batch 32 per rank, 1 torch thread per rank")
    for kind, runs in results.items():
        rates = [r["samples_per_s"] for r in runs]
        fits = [r["fit_s"] for r in runs]
        print(f"{kind:>10}: median {statistics.median(rates):.0f} samples/s (range {min(rates):.0f}-"
              f"{max(rates):.0f}); fit median {statistics.median(fits):.1f} s")
    ratios = [s["samples_per_s"] / h["samples_per_s"] for s, h in zip(results["spark"], results["horovodrun"])]
    print(f"Spark / horovodrun throughput: median {statistics.median(ratios):.3f} "
          f"(pairs: {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
