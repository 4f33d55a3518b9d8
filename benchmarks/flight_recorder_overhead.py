"""Flight recorder overhead: what keeping every rank's last collectives costs.

1. The ResNet-18-sized step (53 torch gradients, 46 MB, ``allreduce_async_`` each then ``synchronize``:
   ``benchmarks/workers/torch_hvd_step.py``) at N ranks under this project's ``horovodrun``, alternating the
   recorder on (``HOROVOD_FLIGHT_RECORDER_SIZE=2000``, the default) and off (``0``) run by run (off, on, off,
   on, ... so that drift in the machine hits both alike). Each run reports the median over 5 repeats of 10 steps;
   the overhead is median(on) / median(off) - 1 over the runs.
2. The same step inside one job, the recorder dropped and taken back between blocks of steps on every rank
   (``benchmarks/workers/flight_ab_step.py``, blocks in ABBA order): both sides share the process and the
   machine's drift, so on a busy machine this is the sharper figure. The overhead is the median over the pairs
   of on/off - 1, in wall time and in rank 0's CPU time (every thread), which other jobs on the machine hardly
   move.
3. The same 53 submissions in one process, on an engine with a local data plane (no peer, tiny tensors), so
   that the engine's own work per collective, recording included, is all that is timed; on and off alternate
   within the process. And the recorder's bookkeeping alone, per collective.

    python benchmarks/flight_recorder_overhead.py [--np 2] [--rounds 6] [--pairs 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
from benchmarks.jobs import run_job  # noqa: E402
from benchmarks.torch_scaling import _env, horovod_cmd  # noqa: E402

log = logging.getLogger("benchmarks.flight_recorder_overhead")
SIDES = {"off": "0", "on": "2000"}


def step_runs(np_: int, rounds: int, timeout: float) -> Optional[Dict[str, List[float]]]:
    """Seconds per step of each run, per side, alternating off and on."""
    runs: Dict[str, List[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            for side, size in SIDES.items():
                out = Path(tmp) / f"{side}{i}.json"
                env = {**_env(), "HOROVOD_FLIGHT_RECORDER_SIZE": size, "HOROVOD_FLIGHT_RECORDER_DIR": tmp}
                cmd = horovod_cmd(np_, ["-m", "benchmarks.workers.torch_hvd_step", str(out)])
                returncode, output = run_job(cmd, env, str(ROOT), timeout)
                if returncode != 0 or not out.exists():
                    log.error("%s run %d failed (exit %d):\n%s", side, i + 1, returncode, output[-3000:])
                    return None
                runs[side].append(json.loads(out.read_text())["step_53"])
                log.info("%-3s run %d: %.2f ms per step", side, i + 1, runs[side][-1] * 1e3)
    return runs


def in_job_pairs(np_: int, pairs: int, steps: int, timeout: float) -> Optional[Dict[str, List[float]]]:
    """Seconds per step of each block, off and on, from one job that toggles the recorder between blocks."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ab.json"
        env = {**_env(), "HOROVOD_FLIGHT_RECORDER_SIZE": "2000", "HOROVOD_FLIGHT_RECORDER_DIR": tmp}
        cmd = horovod_cmd(np_, ["-m", "benchmarks.workers.flight_ab_step", str(out), str(pairs), str(steps)])
        returncode, output = run_job(cmd, env, str(ROOT), timeout)
        if returncode != 0 or not out.exists():
            log.error("the in-job A/B failed (exit %d):\n%s", returncode, output[-3000:])
            return None
        return json.loads(out.read_text())


def engine_cost(steps: int = 200, rounds: int = 10) -> Dict[str, float]:
    """Microseconds per collective on a one-rank engine (53 tiny async allreduces per step), recorder on and off,
    alternating in this process; the median over ``rounds`` of each side, in wall time and in CPU time (both
    threads)."""
    import numpy as np

    from horovod.backends.local import LocalBackend
    from horovod.common.types import DataType, ReduceOp, RequestType
    from horovod.core.controller.messages import make_request
    from horovod.core.engine import Engine, Entry
    from horovod.core.engine.handles import Handle
    from horovod.core.engine.settings import EngineSettings

    tensors = [np.ones(4, np.float32) for _ in range(53)]

    def one_side(size: int) -> Tuple[float, float]:
        engine = Engine(0, 1, LocalBackend(), {}, EngineSettings(flight_recorder_size=size),
                        process_set_id=1000 + size).start()
        try:
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                handles = []
                for i, t in enumerate(tensors):
                    handle = Handle(f"g{i}")
                    request = make_request(f"g{i}", RequestType.ALLREDUCE, DataType.FLOAT32, t.shape, ReduceOp.SUM)
                    engine.enqueue([Entry(request, t, np.empty_like(t), handle)])
                    handles.append(handle)
                for handle in handles:
                    handle.wait()
            n = steps * len(tensors)
            return (time.perf_counter() - start) / n * 1e6, (time.process_time() - cpu) / n * 1e6
        finally:
            engine.shutdown()

    samples: Dict[str, List[float]] = {"off": [], "on": [], "cpu_off": [], "cpu_on": []}
    for _ in range(rounds):
        for side, size in SIDES.items():
            wall, used = one_side(int(size))
            samples[side].append(wall)
            samples["cpu_" + side].append(used)
    return {**{side: statistics.median(values) for side, values in samples.items()},
            **{"min_" + side: min(values) for side, values in samples.items()}}


def record_cost(n: int = 200_000) -> float:
    """Microseconds the recorder's own bookkeeping takes per collective: submit, negotiated/started, done."""
    import numpy as np

    from horovod.common.types import DataType, RequestType
    from horovod.core.controller.messages import make_request
    from horovod.core.engine import Entry, flight
    from horovod.core.engine.handles import Handle

    ring = flight.FlightRing(2000, 999, [0, 1], 0, lambda rtype, nbytes: "shm")
    tensor = np.ones(4, np.float32)
    entries = [Entry(make_request("g", RequestType.ALLREDUCE, DataType.FLOAT32, [4]), tensor, tensor, Handle("g"))
               for _ in range(53)]
    start = time.perf_counter()
    for _ in range(n // len(entries)):
        now = time.time()
        ring.submit(entries, now)
        flight.started(entries, now, time.time())
        flight.done(entries, time.time())
    return (time.perf_counter() - start) / (n // len(entries) * len(entries)) * 1e6


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6, help="pairs of (off, on) runs of the step")
    parser.add_argument("--pairs", type=int, default=20, help="pairs of (off, on) blocks in the in-job A/B")
    parser.add_argument("--block-steps", type=int, default=5, help="steps per block in the in-job A/B")
    parser.add_argument("--json", help="write the numbers here")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    per_record = record_cost()
    engine = engine_cost()
    runs = step_runs(args.np, args.rounds, args.timeout)
    blocks = in_job_pairs(args.np, args.pairs, args.block_steps, args.timeout)
    if runs is None or blocks is None:
        return 1
    ratios = [b / a for a, b in zip(blocks["off"], blocks["on"])]
    cpu_ratios = [b / a for a, b in zip(blocks["cpu_off"], blocks["cpu_on"])]
    off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
    overhead = on / off - 1
    print(f"\nResNet-18-sized step (53 tensors, 46 MB) at {args.np} ranks, {args.rounds} runs per side, "
          "alternating (each run: median of 5 x 10 steps):")
    for side in ("off", "on"):
        print(f"  recorder {side:<3}: median {statistics.median(runs[side]) * 1e3:.2f} ms per step  (runs: "
              + ", ".join(f"{x * 1e3:.2f}" for x in runs[side]) + ")")
    print(f"  overhead: {overhead * 100:+.2f}% of step time (target <= 1%); run-to-run spread of the off side "
          f"{(max(runs['off']) - min(runs['off'])) / off * 100:.1f}%")
    print(f"\nThe same step in one job, the recorder toggled between blocks of {args.block_steps} steps "
          f"({args.pairs} pairs, ABBA):")
    print(f"  recorder off: median {statistics.median(blocks['off']) * 1e3:.2f} ms per step, on: "
          f"{statistics.median(blocks['on']) * 1e3:.2f} ms")
    print(f"  overhead (median of the pairs' on/off - 1): {(statistics.median(ratios) - 1) * 100:+.2f}%; "
          f"pairs' quartiles {(statistics.quantiles(ratios, n=4)[0] - 1) * 100:+.1f}% / "
          f"{(statistics.quantiles(ratios, n=4)[2] - 1) * 100:+.1f}%")
    print(f"  CPU time of rank 0 (all threads): off {statistics.median(blocks['cpu_off']) * 1e3:.2f} ms per step, on "
          f"{statistics.median(blocks['cpu_on']) * 1e3:.2f} ms; overhead {(statistics.median(cpu_ratios) - 1) * 100:+.2f}%"
          f" (quartiles {(statistics.quantiles(cpu_ratios, n=4)[0] - 1) * 100:+.1f}% / "
          f"{(statistics.quantiles(cpu_ratios, n=4)[2] - 1) * 100:+.1f}%)")
    print(f"  best block: off {min(blocks['off']) * 1e3:.2f} ms, on {min(blocks['on']) * 1e3:.2f} ms per step "
          f"({(min(blocks['on']) / min(blocks['off']) - 1) * 100:+.2f}%); CPU {min(blocks['cpu_off']) * 1e3:.2f} / "
          f"{min(blocks['cpu_on']) * 1e3:.2f} ms ({(min(blocks['cpu_on']) / min(blocks['cpu_off']) - 1) * 100:+.2f}%)")
    print(f"\nOne-rank engine, 53 tiny async allreduces per step: {engine['off']:.2f} us per collective off, "
          f"{engine['on']:.2f} us on ({engine['on'] - engine['off']:+.2f} us); CPU time {engine['cpu_off']:.2f} us "
          f"off, {engine['cpu_on']:.2f} us on ({engine['cpu_on'] - engine['cpu_off']:+.2f} us); best rounds "
          f"{engine['min_off']:.2f} / {engine['min_on']:.2f} us wall, {engine['min_cpu_off']:.2f} / "
          f"{engine['min_cpu_on']:.2f} us CPU (off / on)")
    print(f"The recorder's bookkeeping alone: {per_record:.2f} us per collective, {per_record * 53:.0f} us per "
          f"53-tensor step = {per_record * 53e-6 / off * 100:.3f}% of the step above")
    if args.json:
        Path(args.json).write_text(json.dumps({"np": args.np, "runs": runs, "off": off, "on": on,
                                               "overhead": overhead, "engine_us": engine, "blocks": blocks,
                                               "in_job_overhead": statistics.median(ratios) - 1,
                                               "in_job_cpu_overhead": statistics.median(cpu_ratios) - 1,
                                               "record_us": per_record}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
