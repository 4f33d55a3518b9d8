"""Many-small-tensors workload for the autotune benchmark; run under horovodrun.

Each step allreduces ``--tensors`` float32 tensors of ``--size`` elements asynchronously (as gradient hooks
do), then waits for all. ``--mode fixed`` times ``--steps`` steps with the knobs from the environment.
``--mode autotune`` starts the engine at the mistuned ``--start-threshold``/``--start-cycle`` (tunable: the
benchmark installs the autotuner with those starting values, which an explicit HOROVOD_FUSION_THRESHOLD would
instead fix), trains until rank 0's autotuner is done, then times ``--steps`` steps with the tuned values.
Rank 0 writes {"steps_per_s", "bytes_per_s", "tuned", "tuning_steps"} to the JSON path.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

import horovod.numpy as hvd
from horovod.common import basics, ops
from horovod.common.autotune import make_autotuner


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--mode", choices=["fixed", "autotune"], default="fixed")
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--start-threshold", type=int, default=1 << 20)
    parser.add_argument("--start-cycle", type=float, default=20.0)
    parser.add_argument("--max-tuning-steps", type=int, default=5000)
    args = parser.parse_args()
    hvd.init()
    xs = [np.ones(args.size, np.float32) for _ in range(args.tensors)]
    outs = [np.empty_like(x) for x in xs]

    def step() -> None:
        handles = [ops.allreduce_async(x, o, name=f"grad.{i}", op=hvd.Average) for i, (x, o) in
                   enumerate(zip(xs, outs))]
        for h in handles:
            h.wait()

    tuned, tuning_steps = None, 0
    if args.mode == "autotune":
        engine = basics.engine()
        if hvd.rank() == 0:
            start = {"fusion_threshold": args.start_threshold, "cycle_time_ms": args.start_cycle,
                     "cache_enabled": True}
            engine._set_params(start)           # the mistuned start (only rank 0 plans fusion and holds)
            engine.autotuner = make_autotuner(start)
            assert engine.autotuner is not None, "run with HOROVOD_AUTOTUNE=1"
        flag = np.zeros(1, np.int32)
        while tuning_steps < args.max_tuning_steps:
            for _ in range(25):
                step()
            tuning_steps += 25
            flag[0] = int(hvd.rank() == 0 and engine.autotuner is None)
            if hvd.broadcast(flag, 0, name="bench.tuned")[0]:
                break
        if hvd.rank() == 0:
            tuned = {"fusion_threshold": engine.coordinator.fusion_threshold, "cycle_time_ms": engine.cycle_s * 1e3,
                     "cache_enabled": engine.cache.enabled}
    for _ in range(10):
        step()
    hvd.barrier()
    start_t = time.perf_counter()
    for _ in range(args.steps):
        step()
    hvd.barrier()
    elapsed = time.perf_counter() - start_t
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"steps_per_s": args.steps / elapsed,
                       "bytes_per_s": args.steps * args.tensors * args.size * 4 / elapsed,
                       "tuned": tuned, "tuning_steps": tuning_steps}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
