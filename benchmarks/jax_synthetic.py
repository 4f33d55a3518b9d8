"""JAX scaling benchmark: horovod.jax against JAX's own multi-process CPU data parallelism, in one run.

Runs ``benchmarks/workers/jax_synthetic_step.py`` (a plain-JAX MLP or small CNN, one synthetic batch, a jitted
train step with optax SGD; upstream's synthetic-benchmark output) at 1 and N ranks for two backends with the same
model, per-rank batch and iteration counts, and one XLA thread per rank (``--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1``, ``OMP_NUM_THREADS=1``):

- ``horovod``: this project's ``horovodrun``; ``hvd.DistributedOptimizer`` averages the gradients with one grouped
  allreduce per step, an ordered host callback inside the jitted step.
- ``jax``: N processes started here, ``jax.distributed.initialize`` with a coordinator on loopback and
  ``jax_cpu_collectives_implementation="gloo"``; the step is a ``shard_map`` with ``jax.lax.pmean`` of the
  gradients. Its 1-rank run is the same program on one process.

The runs alternate ``--repeats`` times (1 rank and N ranks of each backend close together, so that the machine's
load falls on all of them); each repeat gives each backend a scaling efficiency, throughput(N) / (N x
throughput(1)), and the table reports their median and range, and the 1-minute load before each run.

    python benchmarks/jax_synthetic.py [--np 2] [--models mlp,cnn] [--repeats 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.tensorflow_scaling import load_average  # noqa: E402
from benchmarks.torch_scaling import _env, _run, horovod_cmd  # noqa: E402

WORKER = ["-m", "benchmarks.workers.jax_synthetic_step"]
BACKENDS = ("horovod", "jax")
PINNED = "1 XLA thread per rank (xla_cpu_multi_thread_eigen=false, intra_op_parallelism_threads=1), OMP_NUM_THREADS=1"
log = logging.getLogger("benchmarks.jax_synthetic")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_jax(n: int, args: List[str], out: Path, timeout: float) -> Optional[dict]:
    """JAX's own data parallelism on ``n`` processes (process 0 writes ``out``); None if it failed."""
    if n == 1:
        return _run([sys.executable, *WORKER, "--backend", "jax", *args, "--json", str(out)], out, timeout)
    port = _free_port()
    env = _env()
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, *WORKER, "--backend", "jax", *args, "--process-id", str(i),
                               "--num-processes", str(n), "--port", str(port), "--json", str(out)],
                              env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(n)]
    outputs, codes = [], []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outputs.append(p.communicate()[0])
        codes.append(p.returncode)
    if any(codes) or not out.exists():
        log.error("JAX multi-process run failed (exits %s):\n%s", codes, "\n".join(o[-3000:] for o in outputs))
        return None
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - start
    return result


def worker_args(model: str, opts: argparse.Namespace) -> List[str]:
    batches = opts.mlp_num_batches_per_iter if model == "mlp" else opts.num_batches_per_iter
    return ["--model", model, "--batch-size", str(opts.batch_size), "--image-size", str(opts.image_size),
            "--num-warmup-batches", str(opts.num_warmup_batches), "--num-batches-per-iter", str(batches),
            "--num-iters", str(opts.num_iters)]


def synthetic(model: str, np: int, opts: argparse.Namespace, tmp: Path) -> List[Dict[str, Dict[int, Optional[dict]]]]:
    """``opts.repeats`` alternated rounds: each backend at 1 and ``np`` ranks."""
    args = worker_args(model, opts)
    rounds = []
    for rep in range(opts.repeats):
        results: Dict[str, Dict[int, Optional[dict]]] = {b: {} for b in BACKENDS}
        for n in (1, np):
            for backend in BACKENDS:
                out = tmp / f"{model}-{backend}-{n}-{rep}.json"
                load = load_average()
                if backend == "horovod":
                    res = _run(horovod_cmd(n, [*WORKER, "--backend", "horovod", *args, "--json", str(out)]), out,
                               opts.timeout)
                else:
                    res = run_jax(n, args, out, opts.timeout)
                results[backend][n] = res
                if res:
                    res["load1"] = load
                    log.info("  %s %s np=%d: %.1f img/sec total (per rank %.1f +-%.1f), load %.2f", model, backend,
                             n, res["total_img_sec"], res["img_sec_mean"], res["img_sec_conf"], load)
        rounds.append(results)
    return rounds


def efficiency(res: Dict[int, Optional[dict]], np: int) -> Optional[float]:
    if not res.get(1) or not res.get(np):
        return None
    return res[np]["total_img_sec"] / (np * res[1]["total_img_sec"])


def _median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(synth: Dict[str, list], np: int) -> List[str]:
    """Every round's figures, then each model's medians and the verdict (ours >= JAX's)."""
    lines = [f"| model | round | backend | load | 1 rank img/s | {np} ranks img/s (total) | scaling efficiency |",
             "|---|---|---|---|---|---|---|"]
    summary = [f"| model | backend | 1 rank img/s (median) | {np} ranks img/s (median) | efficiency: median | range |",
               "|---|---|---|---|---|---|"]
    verdicts = []
    for model, rounds in synth.items():
        effs: Dict[str, List[float]] = {b: [] for b in BACKENDS}
        for i, res in enumerate(rounds):
            for backend in BACKENDS:
                one, many = res[backend].get(1), res[backend].get(np)
                eff = efficiency(res[backend], np)
                loads = "/".join(f"{r['load1']:.2f}" for r in (one, many) if r)
                cells = [f"{r['total_img_sec']:.1f}" if r else "failed" for r in (one, many)]
                cells.append(f"{100 * eff:.1f}%" if eff is not None else "–")
                lines.append(f"| {model} | {i + 1} | {backend} | {loads} | " + " | ".join(cells) + " |")
                if eff is not None:
                    effs[backend].append(eff)
        for backend in BACKENDS:
            runs = {n: [r[backend][n]["total_img_sec"] for r in rounds if r[backend].get(n)] for n in (1, np)}
            e = effs[backend]
            spread = f"{100 * min(e):.1f}–{100 * max(e):.1f}%" if e else "–"
            summary.append(f"| {model} | {backend} | {_median(runs[1]):.1f} | {_median(runs[np]):.1f} | "
                           f"**{100 * _median(e):.1f}%** | {spread} |")
        if effs["horovod"] and effs["jax"]:
            ours, theirs = _median(effs["horovod"]), _median(effs["jax"])
            verdicts.append(f"{model}: scaling efficiency horovod.jax {100 * ours:.1f}% vs JAX multi-process "
                            f"(Gloo, pmean) {100 * theirs:.1f}% ({'MET' if ours >= theirs else 'NOT MET'}: target "
                            f"ours >= JAX's; difference {100 * (ours - theirs):+.1f} points)")
    return lines + [""] + summary + [""] + verdicts + [
        "", f"Threads pinned: {PINNED}. Scaling efficiency = {np}-rank total img/s / ({np} x 1-rank img/s) of the "
        "same backend, per round of runs made one after the other."]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=5)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--mlp-num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="alternated rounds of every backend at 1 and N ranks")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per job")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        synth = {m: synthetic(m, opts.np, opts, Path(tmp_name)) for m in opts.models.split(",")}
    print()
    print("\n".join(report(synth, opts.np)))
    print(f"\n(total benchmark wall time {time.perf_counter() - start:.0f} s)")
    if opts.json:
        Path(opts.json).write_text(json.dumps({"options": vars(opts), "synthetic": synth}, indent=1))
    ok = all(r["horovod"].get(opts.np) and r["jax"].get(opts.np) for rounds in synth.values() for r in rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
