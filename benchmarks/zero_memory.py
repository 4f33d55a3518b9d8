"""ZeRO-1 benchmark: ``hvd.ZeroRedundancyOptimizer`` against ``hvd.DistributedOptimizer`` with Adam, on an MLP of
tens of millions of parameters (``torch.nn.Linear`` layers, synthetic data, nothing downloaded).

For each rank count of ``--np`` (default 2,4), under this project's horovodrun, one thread per rank:

- optimizer-state bytes per rank (the tensors in ``ZeroRedundancyOptimizer.optim.state`` against those in the
  plain Adam's ``state``), their ratio to the unsharded state and the goal (at most 1/n + 5 %);
- peak RSS per rank (``ru_maxrss``) of each optimizer, each in a fresh job of its own;
- the median time of a training iteration (zero_grad, forward, backward, step) and of ``step()`` alone, with
  both optimizers in one job, timed in alternating windows (goal: ZeRO at most 1.1 x DistributedOptimizer);
- with ``--jax``, the optax state bytes per rank of ``horovod.jax.ZeroRedundancyOptimizer(optax.adam)``;
- with ``--keras``, the Adam variables' bytes per rank of ``horovod.tensorflow.keras.ZeroRedundancyOptimizer``
  (Keras 3 on TensorFlow, the same shapes as ``keras.layers.Dense``).

    python benchmarks/zero_memory.py [--np 2,4] [--width 2048 --depth 6] [--jax] [--keras] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.jobs import TIMED_OUT, Deadline, run_job  # noqa: E402
from benchmarks.torch_scaling import _env  # noqa: E402

log = logging.getLogger("benchmarks.zero_memory")
MIB = 1 << 20


def job(np: int, mode: str, model_args: List[str], tmp: Path, limit: Optional[float]) -> Optional[dict]:
    """One horovodrun job of ``benchmarks.workers.zero_step``; the JSON its rank 0 wrote, or None."""
    if limit is None:
        log.warning("np=%d %s: skipped, the deadline is near", np, mode)
        return None
    out = tmp / f"{mode}-{np}.json"
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np), sys.executable, "-m",
           "benchmarks.workers.zero_step", mode, str(out), *model_args]
    log.info("running: %s", " ".join(cmd))
    returncode, output = run_job(cmd, _env(), str(ROOT), limit)
    if returncode != 0 or not out.exists():
        log.error("failed (exit %d%s):\n%s", returncode, ", timed out" if returncode == TIMED_OUT else "",
                  output[-5000:])
        return None
    return json.loads(out.read_text())


def report(results: Dict[int, Dict[str, Optional[dict]]]) -> List[str]:
    lines = ["| ranks | optimizer | state MiB per rank (max; min) | max / unsharded | goal 1/n + 5 % | "
             "peak RSS MiB per rank (max; min) |", "|---|---|---|---|---|---|"]
    for np, res in results.items():
        dist, zero = res.get("memory-dist"), res.get("memory-zero")
        full = max(r["state_bytes"] for r in dist["ranks"]) if dist else None
        for label, mem in (("DistributedOptimizer", dist), ("ZeroRedundancyOptimizer", zero)):
            if not mem:
                lines.append(f"| {np} | {label} | failed | | | |")
                continue
            state = [r["state_bytes"] for r in mem["ranks"]]
            rss = [r["peak_rss"] for r in mem["ranks"]]
            ratio = max(state) / full if full else None
            goal = ""
            if label.startswith("Zero") and ratio is not None:
                bound = 1 / np + 0.05
                goal = f"{bound:.3f}: {'MET' if ratio <= bound else 'NOT MET'}"
            lines.append(f"| {np} | {label} | {max(state) / MIB:.1f}; {min(state) / MIB:.1f} | "
                         f"{'' if ratio is None else f'{ratio:.3f}'} | {goal} | "
                         f"{max(rss) / MIB:.0f}; {min(rss) / MIB:.0f} |")
    lines += ["", "| ranks | iteration DistributedOptimizer (median) | iteration ZeRO | ZeRO / Distributed | "
              "goal <= 1.1 | step() alone Distributed; ZeRO | max parameter difference |", "|---|---|---|---|---|---|---|"]
    for np, res in results.items():
        t = res.get("time")
        if not t:
            lines.append(f"| {np} | failed | | | | | |")
            continue
        d, z = t["iteration_s"]["dist"], t["iteration_s"]["zero"]
        lines.append(f"| {np} | {d * 1e3:.0f} ms | {z * 1e3:.0f} ms | {z / d:.2f} | "
                     f"{'MET' if z <= 1.1 * d else 'NOT MET'} | {t['step_s']['dist'] * 1e3:.0f} ms; "
                     f"{t['step_s']['zero'] * 1e3:.0f} ms | {t['max_param_difference']:.1e} |")
    for key, title in (("jax", "JAX: optax.adam"), ("keras", "Keras: keras.optimizers.Adam")):
        rows = [(np, res[key]) for np, res in results.items() if res.get(key)]
        if not rows:
            continue
        lines += ["", f"| ranks | {title} state MiB | ZeroRedundancyOptimizer state MiB per rank (max; min) | "
                  "max / unsharded |", "|---|---|---|---|"]
        for np, j in rows:
            zero = [r["zero"] for r in j["ranks"]]
            plain = j["ranks"][0]["plain"]
            lines.append(f"| {np} | {plain / MIB:.1f} | {max(zero) / MIB:.1f}; {min(zero) / MIB:.1f} | "
                         f"{max(zero) / plain:.3f} |")
    return lines


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="2,4", help="rank counts, comma-separated")
    parser.add_argument("--width", type=int, default=1536)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--windows", type=int, default=6, help="timed windows per optimizer")
    parser.add_argument("--steps", type=int, default=3, help="iterations per window")
    parser.add_argument("--jax", action="store_true", help="also the JAX state bytes")
    parser.add_argument("--keras", action="store_true", help="also the Keras (TensorFlow) state bytes")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per job")
    parser.add_argument("--deadline", type=float, default=3600, help="seconds for the whole run")
    opts = parser.parse_args()
    counts = [int(c) for c in opts.np.split(",") if c.strip()]
    model_args = ["--width", str(opts.width), "--depth", str(opts.depth), "--batch", str(opts.batch),
                  "--windows", str(opts.windows), "--steps", str(opts.steps)]
    deadline = Deadline(opts.deadline)
    modes = ["memory-dist", "memory-zero", "time"] + (["jax"] if opts.jax else []) + (["keras"] if opts.keras else [])
    results: Dict[int, Dict[str, Optional[dict]]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for np in counts:
            results[np] = {mode: job(np, mode, model_args, Path(tmp), deadline.limit(opts.timeout))
                           for mode in modes}
    params = next((r["params"] for res in results.values() for r in res.values() if r and "params" in r), None)
    print(f"\nZeRO-1 against DistributedOptimizer: MLP {opts.depth} x {opts.width} wide ({params} parameters), Adam, "
          f"batch {opts.batch} per rank, one thread per rank; {time.perf_counter() - start:.0f} s\n")
    print("\n".join(report(results)))
    if opts.json:
        Path(opts.json).write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
