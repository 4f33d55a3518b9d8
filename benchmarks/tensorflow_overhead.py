"""What ``tf.function`` costs a horovod.tensorflow collective: per-call latency eagerly vs in a graph, N ranks.

Runs ``benchmarks/workers/tf_overhead.py`` under this project's ``horovodrun`` and prints, for one float32
tensor per size (4 KB, 256 KB, 4 MB, 64 MB by default), the time of one ``hvd.allreduce`` through
``horovod.numpy`` (the op layer alone, for reference), eagerly in TensorFlow, and as the only op of a
``tf.function`` (a ``HorovodCollective`` kernel), with the ratio tf.function / eager, and fetched by
``session.run`` from a TF1 graph. Then 20 tensors of
256 KB: one ``grouped_allreduce`` eagerly and in a ``tf.function``, and 20 separate allreduces in one
``tf.function`` (which run one after another). Each figure is the median of 3 repetitions of the mean over n
calls (``benchmarks/workers/timing.py::measure``); every rank runs TensorFlow with one intra-op and one
inter-op thread.

    python benchmarks/tensorflow_overhead.py [--np 2] [--sizes 4096,262144] [--scale 0.25] [--json out.json]
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.binding_overhead import overhead_main, size_label  # noqa: E402

SIZES = [4 << 10, 256 << 10, 4 << 20, 64 << 20]


def report(res: dict) -> List[str]:
    """The markdown tables: single tensors by size, then the group of tensors."""
    us = "{:.1f}".format
    lines = ["| tensor | horovod.numpy (µs) | TF eager (µs) | TF tf.function (µs) | tf.function / eager | "
             "TF1 session.run (µs) |", "|---|---|---|---|---|---|"]
    for nbytes, row in res["single"].items():
        lines.append(f"| {size_label(int(nbytes))} | {us(row['numpy'] * 1e6)} | {us(row['eager'] * 1e6)} | "
                     f"{us(row['function'] * 1e6)} | {row['function'] / row['eager']:.2f} | "
                     f"{us(row['graph'] * 1e6)} |")
    group, row = res["group"], res["grouped"]
    what = f"{group['tensors']} x {size_label(group['bytes_each'])}"
    lines += ["", f"| {what} | grouped_allreduce eager (µs) | grouped_allreduce in tf.function (µs) | "
              "tf.function / eager | separate allreduces in one tf.function (µs) |", "|---|---|---|---|---|",
              f"| {res['size']} ranks | {us(row['grouped eager'] * 1e6)} | {us(row['grouped function'] * 1e6)} | "
              f"{row['grouped function'] / row['grouped eager']:.2f} | {us(row['separate function'] * 1e6)} |",
              "", f"Threads per rank: {res['threads']} (TensorFlow); OMP_NUM_THREADS=1."]
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    return overhead_main(argv, __doc__, "benchmarks.workers.tf_overhead", ",".join(str(s) for s in SIZES), 0.25,
                         report)


if __name__ == "__main__":
    sys.exit(main())
