"""Many-small-tensors workload for the autotune benchmark; run under horovodrun.

Each step allreduces ``--tensors`` float32 tensors of ``--size`` elements asynchronously (as gradient hooks
do), then waits for all. The job first autotunes (HOROVOD_AUTOTUNE=1) from a deliberately mistuned start
(``--start-threshold``/``--start-cycle``, left tunable: the benchmark installs the autotuner with those starting
values, where an explicit HOROVOD_FUSION_THRESHOLD would fix them) until rank 0's autotuner is done. It then
times every configuration in the same processes, in alternating rounds so that the machine's drift hits all
alike: the mistuned start, each hand-tuned grid point, and the autotuned values. Rank 0 writes the median
steps/s of each to the JSON path.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Dict, List

import numpy as np

import horovod.numpy as hvd
from horovod.core import basics, ops
from horovod.core.observers.autotune import make_autotuner
from horovod.core.observers.tuning import AutotuneObserver, tuning

MIB = 1 << 20
GRID = [(4 * MIB, 1.0), (16 * MIB, 1.0), (64 * MIB, 1.0), (4 * MIB, 5.0), (16 * MIB, 5.0), (64 * MIB, 5.0),
        (16 * MIB, 25.0), (64 * MIB, 25.0)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--steps", type=int, default=150, help="timed steps per configuration per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--start-threshold", type=int, default=MIB)
    parser.add_argument("--start-cycle", type=float, default=20.0)
    parser.add_argument("--max-tuning-steps", type=int, default=5000)
    args = parser.parse_args()
    hvd.init()
    engine = basics.engine()
    xs = [np.ones(args.size, np.float32) for _ in range(args.tensors)]
    outs = [np.empty_like(x) for x in xs]

    def step() -> None:
        handles = [ops.allreduce_async(x, o, name=f"grad.{i}", op=hvd.Average) for i, (x, o) in
                   enumerate(zip(xs, outs))]
        for h in handles:
            h.wait()

    start = {"fusion_threshold": args.start_threshold, "cycle_time_ms": args.start_cycle, "cache_enabled": True}
    if hvd.rank() == 0:
        engine.set_params(start)                # only rank 0 plans fusion and holds tensors back
        old = tuning(engine)
        if old is not None:
            engine.remove_observer(old)
        tuner = make_autotuner(start)
        assert tuner is not None, "run with HOROVOD_AUTOTUNE=1"
        engine.add_observer(AutotuneObserver(tuner))
    flag = np.zeros(1, np.int32)
    tuning_steps = 0
    while tuning_steps < args.max_tuning_steps:
        for _ in range(25):
            step()
        tuning_steps += 25
        flag[0] = int(hvd.rank() == 0 and tuning(engine) is None)
        if hvd.broadcast(flag, 0, name="bench.tuned")[0]:
            break
    tuned = hvd.broadcast_object(
        {"fusion_threshold": engine.coordinator.fusion_threshold, "cycle_time_ms": engine.cycle_s * 1e3,
         "cache_enabled": engine.cache.enabled} if hvd.rank() == 0 else None, 0, name="tuned")

    configs: Dict[str, dict] = {"mistuned": start}
    for threshold, cycle in GRID:
        configs[f"hand {threshold // MIB} MB, {cycle:g} ms"] = {"fusion_threshold": threshold,
                                                                "cycle_time_ms": cycle, "cache_enabled": True}
    configs["autotuned"] = tuned
    times: Dict[str, List[float]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, params in configs.items():
            hvd.barrier()                       # nothing in flight: safe to switch the engine's knobs
            engine.set_params(params)
            for _ in range(5):
                step()
            hvd.barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            hvd.barrier()
            times[name].append(args.steps / (time.perf_counter() - t0))
    if hvd.rank() == 0:
        result = {name: {"params": configs[name], "steps_per_s": sorted(v)[len(v) // 2], "rounds": v}
                  for name, v in times.items()}
        with open(args.out, "w") as f:
            json.dump({"configs": result, "tuning_steps": tuning_steps, "tensors": args.tensors,
                       "size": args.size}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
