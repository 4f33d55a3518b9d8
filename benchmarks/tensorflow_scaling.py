"""TensorFlow 2 scaling benchmark: horovod.tensorflow's synthetic benchmark on 1 and N ranks, in one run.

Runs ``examples/tensorflow2/tensorflow2_synthetic_benchmark.py`` for each model under this project's
``horovodrun`` (``-np 1``, then ``-np N``) with the same model, batch, image size and iteration counts, and prints
each model's throughput and scaling efficiency, throughput(N) / (N x throughput(1)).

Threads are pinned so that the 1-rank and N-rank runs compare: every rank runs TensorFlow with one intra-op and
one inter-op thread (``--num-threads 1 --num-interop-threads 1``; ``OMP_NUM_THREADS=1``). With TensorFlow's
default inter-op pool (one thread per core), a lone rank runs independent ops of the step on every core and the
1-rank figure no longer measures one rank's share of the machine.

The 1-rank and N-rank runs alternate ``--repeats`` times (each pair measured close together, so that the
machine's load falls on both); every pair gives an efficiency, and the table reports their median and range, and
the 1-minute load average before each run. ``--profile`` adds where the N-rank step's time goes
(``benchmarks/workers/tf_step_profile.py``: the step, the same step without the gradient exchange, and the
exchange alone, alternated inside one job).

    python benchmarks/tensorflow_scaling.py [--np 2] [--models cnn,mlp] [--repeats 3] [--profile] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.torch_scaling import (  # noqa: E402
    _env,
    _run,
    add_scaling_options,
    efficiency,
    horovod_cmd,
    synthetic_args,
)

BENCH = ROOT / "examples" / "tensorflow2" / "tensorflow2_synthetic_benchmark.py"
PINNED = "1 intra-op and 1 inter-op TensorFlow thread per rank, OMP_NUM_THREADS=1"
log = logging.getLogger("benchmarks.tensorflow_scaling")


def load_average() -> float:
    """The 1-minute load average (what else was running when a job started)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def synthetic(model: str, np: int, opts: argparse.Namespace, tmp: Path) -> List[Dict[int, Optional[dict]]]:
    """``opts.repeats`` alternated pairs of runs of one model, at 1 and ``np`` ranks (rank 0's JSON of each run,
    with the load before it, or None if it failed)."""
    common = [*synthetic_args(model, opts), "--num-interop-threads", "1"]
    pairs: List[Dict[int, Optional[dict]]] = []
    for rep in range(opts.repeats):
        results: Dict[int, Optional[dict]] = {}
        for n in (1, np):
            out = tmp / f"{model}-{n}-{rep}.json"
            load = load_average()
            res = _run(horovod_cmd(n, [str(BENCH), *common, "--json", str(out)]), out, opts.timeout)
            results[n] = res
            if res:
                res["load1"] = load
                log.info("  %s np=%d: %.1f img/sec total (per rank %.1f +-%.1f), load %.2f", model, n,
                         res["total_img_sec"], res["img_sec_mean"], res["img_sec_conf"], load)
        pairs.append(results)
    return pairs


def _median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(synth: Dict[str, List[Dict[int, Optional[dict]]]], np: int) -> List[str]:
    """The markdown tables (every pair, then each model's median and range) and what was pinned."""
    lines = [f"| model | pair | load | 1 rank img/s | {np} ranks img/s (total) | scaling efficiency |",
             "|---|---|---|---|---|---|"]
    summary = [f"| model | parameters | pairs | 1 rank img/s (median) | {np} ranks img/s (median) | "
               "efficiency: median | range |", "|---|---|---|---|---|---|---|"]
    for model, pairs in synth.items():
        effs = []
        for i, res in enumerate(pairs):
            eff = efficiency(res, np)
            one, many = res.get(1), res.get(np)
            cells = [f"{r['total_img_sec']:.1f} +-{r['img_sec_conf'] * r['size']:.1f}" if r else "failed"
                     for r in (one, many)]
            loads = "/".join(f"{r['load1']:.2f}" for r in (one, many) if r)
            cells.append(f"{100 * eff:.1f}%" if eff is not None else "–")
            lines.append(f"| {model} | {i + 1} | {loads} | " + " | ".join(cells) + " |")
            if eff is not None:
                effs.append(eff)
        runs = {n: [r[n]["total_img_sec"] for r in pairs if r.get(n)] for n in (1, np)}
        params = next((f"{r[n]['parameters'] / 1e6:.2f} M" for r in pairs for n in (1, np) if r.get(n)), "–")
        spread = f"{100 * min(effs):.1f}–{100 * max(effs):.1f}%" if effs else "–"
        summary.append(f"| {model} | {params} | {len(effs)} | {_median(runs[1]):.1f} | {_median(runs[np]):.1f} | "
                       f"**{100 * _median(effs):.1f}%** | {spread} |")
    return lines + [""] + summary + [
        "", f"Threads pinned: {PINNED}. Scaling efficiency = {np}-rank total img/s / ({np} x 1-rank img/s), per "
        "pair of runs made one after the other."]


def profile(np: int, opts: argparse.Namespace, tmp: Path) -> Dict[int, Optional[Dict[str, List[float]]]]:
    """The step profile (``tf_step_profile``) at 1 and ``np`` ranks: rank 0's per-step seconds of each call."""
    out: Dict[int, Optional[Dict[str, List[float]]]] = {}
    for n in (1, np):
        path = tmp / f"profile-{n}.json"
        cmd = horovod_cmd(n, ["-m", "benchmarks.workers.tf_step_profile", str(path), "--batch-size",
                              str(opts.batch_size), "--image-size", str(opts.image_size)])
        log.info("running: %s (load %.2f)", " ".join(cmd), load_average())
        proc = subprocess.run(cmd, env=_env(), cwd=str(ROOT), timeout=opts.timeout, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        rank0 = Path(f"{path}.0")
        if proc.returncode != 0 or not rank0.exists():
            log.error("profile failed (exit %d):\n%s", proc.returncode, proc.stdout[-5000:])
            out[n] = None
            continue
        out[n] = json.loads(rank0.read_text())["times"]
    return out


def _ms_cell(seconds: List[float]) -> str:
    """Median (10th–90th percentile) in ms."""
    v = sorted(seconds)
    return f"{1e3 * _median(v):.1f} ({1e3 * v[len(v) // 10]:.1f}–{1e3 * v[(9 * len(v)) // 10]:.1f})"


def profile_report(prof: Dict[int, Optional[Dict[str, List[float]]]], np: int) -> List[str]:
    """Medians (and 10th-90th percentiles) of each timed call, in ms, what the exchange adds to a step, and what
    the early starts (``HOROVOD_TF_OVERLAP_BYTES``, see ``tf_step_profile --alone-bytes``) add to that."""
    lines = ["| ranks | step (default: one grouped allreduce), ms | step with early starts, ms | step without the "
             "exchange, ms | exchange alone, ms | exchange adds, ms | early starts add, ms |",
             "|---|---|---|---|---|---|---|"]
    for n, times in prof.items():
        if not times:
            lines.append(f"| {n} | failed | | | |")
            continue
        adds = 1e3 * (_median(times["grouped"]) - _median(times["local"]))
        early = 1e3 * (_median(times["dist"]) - _median(times["grouped"]))
        cells = " | ".join(_ms_cell(times[key]) for key in ("grouped", "dist", "local", "reduce"))
        lines.append(f"| {n} | {cells} | {adds:+.1f} | {early:+.1f} |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # --models: comma-separated cnn, mlp, or keras.applications names (those are slow on CPUs).
    add_scaling_options(parser, "cnn,mlp", warmup=5, batches=10, mlp_batches=50, iters=5)
    parser.add_argument("--repeats", type=int, default=3, help="alternated pairs of 1-rank and N-rank runs")
    parser.add_argument("--profile", action="store_true", help="also profile the CNN step (tf_step_profile)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        synth = {m: synthetic(m, opts.np, opts, Path(tmp_name)) for m in opts.models.split(",")}
        prof = profile(opts.np, opts, Path(tmp_name)) if opts.profile else {}
    print()
    print("\n".join(report(synth, opts.np)))
    if prof:
        print()
        print("\n".join(profile_report(prof, opts.np)))
    print(f"\n(total benchmark wall time {time.perf_counter() - start:.0f} s)")
    if opts.json:
        Path(opts.json).write_text(json.dumps({"options": vars(opts), "pinned": PINNED, "synthetic": synth,
                                              "profile": prof}, indent=1))
    return 0 if all(all(r.get(opts.np) for r in pairs) for pairs in synth.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
