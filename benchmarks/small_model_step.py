"""A small model's training step: horovod.torch's DistributedOptimizer against torch DDP (Gloo), N ranks.

Runs ``benchmarks/workers/small_model_step.py`` under this project's ``horovodrun`` and under ``torchrun``,
alternately ``--repeats`` times, and prints per model (MLP layer widths) the median step time of each, the same
step with no collective (a local copy of the model: what the cores cost), what the exchange adds to a step
(step - local), and ours over DDP; with ``--keras``, the same models in Keras 3 on TensorFlow with
``horovod.keras.DistributedOptimizer`` (no peer: against its local step). Small models are where a step is mostly the gradients' hand-offs: on one host
their gradients go in one fast round at ``step()`` (docs/torch.md).

    python benchmarks/small_model_step.py [--np 2] [--models "784,128,10;256,64,64,10"] [--repeats 3] [--keras]
        [--groups N]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.alternated_jobs import add_options, alternate, finish  # noqa: E402
from benchmarks.torch_scaling import horovod_cmd, torchrun_cmd  # noqa: E402

MODELS = "784,128,10;256,64,64,10;784,256,128,10"
WORKER = "benchmarks.workers.small_model_step"


def report(runs: List[Dict[str, dict]], np: int) -> List[str]:
    """A markdown table of the medians over the runs (µs per step) and their ranges."""
    def cell(values: List[float]) -> str:
        return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"

    lines = [f"{np} ranks, {len(runs)} runs; µs per step (median of the runs; their range)", "",
             "| model (widths) | parameters / tensors | horovod step | its local step | DDP step | its local step "
             "| horovod − local | DDP − local | horovod ÷ DDP |", "|---|---|---|---|---|---|---|---|---|"]
    labels = dict.fromkeys(label for run in runs for got in run.values() for label in got["results"])
    for label in labels:
        got = {mode: [run[mode]["results"][label] for run in runs if mode in run] for mode in ("hvd", "ddp")}
        if not got["hvd"]:
            continue
        first = got["hvd"][0]
        us = {mode: {k: [r[k] * 1e6 for r in rows] for k in ("step", "local")} for mode, rows in got.items() if rows}
        hvd_extra = statistics.median(us["hvd"]["step"]) - statistics.median(us["hvd"]["local"])
        cells = [f"{label}", f"{first['parameters']} / {first['tensors']}", cell(us["hvd"]["step"]),
                 cell(us["hvd"]["local"])]
        if "ddp" in us:
            ddp_extra = statistics.median(us["ddp"]["step"]) - statistics.median(us["ddp"]["local"])
            ratio = statistics.median(us["hvd"]["step"]) / statistics.median(us["ddp"]["step"])
            cells += [cell(us["ddp"]["step"]), cell(us["ddp"]["local"]), f"{hvd_extra:.0f}", f"{ddp_extra:.0f}",
                      f"{ratio:.2f}"]
        else:
            cells += ["–", "–", f"{hvd_extra:.0f}", "–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    keras = [run["keras"]["results"] for run in runs if "keras" in run]
    if keras:
        lines += ["", "Keras 3 on TensorFlow, horovod.keras.DistributedOptimizer (µs per step)", "",
                  "| model (widths) | parameters / tensors | horovod step | its local step | horovod − local |",
                  "|---|---|---|---|---|"]
        for label in keras[0]:
            step = [r[label]["step"] * 1e6 for r in keras]
            local = [r[label]["local"] * 1e6 for r in keras]
            lines.append(f"| {label} | {keras[0][label]['parameters']} / {keras[0][label]['tensors']} | {cell(step)} "
                         f"| {cell(local)} | {statistics.median(step) - statistics.median(local):.0f} |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser)
    parser.add_argument("--models", default=MODELS, help="layer widths per model, models separated by ';'")
    parser.add_argument("--keras", action="store_true", help="also the same models in Keras 3 on TensorFlow")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per round")
    parser.add_argument("--groups", type=int, default=0,
                        help="horovod.torch's DistributedOptimizer(groups=N) (0: none); DDP has its own buckets")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = [str(opts.rounds), str(opts.steps)]
    jobs = {"hvd": lambda out: horovod_cmd(opts.np, ["-m", WORKER, "hvd", str(out), opts.models, *args,
                                                     str(opts.groups)]),
            "ddp": lambda out: torchrun_cmd(opts.np, ["-m", WORKER, "ddp", str(out), opts.models, *args])}
    if opts.keras:
        jobs["keras"] = lambda out: horovod_cmd(opts.np, ["-m", WORKER, "keras", str(out), opts.models, *args])
    runs = alternate(jobs, opts.repeats, opts.timeout)
    return finish(runs, lambda r: report(r, opts.np), vars(opts), opts.json)


if __name__ == "__main__":
    sys.exit(main())
