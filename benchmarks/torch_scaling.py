"""PyTorch scaling benchmark: Horovod vs torch DistributedDataParallel (Gloo) on 1 and N ranks, in one run.

Runs ``examples/pytorch/pytorch_synthetic_benchmark.py`` for each model under this project's ``horovodrun``
(``-np 1`` and ``-np N``) and under ``torchrun --nproc_per_node 1`` and ``N`` with ``--ddp``, with the same
model, batch, image size and iteration counts and one thread per rank (``OMP_NUM_THREADS=1`` and
``torch.set_num_threads(1)``). It prints each backend's scaling efficiency, throughput(N) / (N x
throughput(1)), and the Horovod/DDP ratio of N-rank throughput. ``--np`` also takes a list (``2,4,8,16``):
the 1-rank runs are then shared, each count gets its own efficiency, and the table gets a column per count.
It then times the ResNet-18-sized step
(53 torch gradients, 46 MB, ``hvd.allreduce_async_`` each then ``synchronize``) against one raw mpi4py
Allreduce of the same 46 MB under Open MPI's ``mpirun`` (and, for reference, torch.distributed Gloo's 53
async allreduces).

    python benchmarks/torch_scaling.py [--np 2 | --np 2,4,8,16] [--models resnet,mlp] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.jobs import TIMED_OUT, Deadline, run_job  # noqa: E402

BENCH = ROOT / "examples" / "pytorch" / "pytorch_synthetic_benchmark.py"
log = logging.getLogger("benchmarks.torch_scaling")


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    return env


def _run(cmd: List[str], out: Path, timeout: float) -> Optional[dict]:
    """Run one job; return the JSON its rank 0 wrote, or None (and log its output) if it failed."""
    log.info("running: %s", " ".join(cmd))
    start = time.perf_counter()
    returncode, output = run_job(cmd, _env(), str(ROOT), timeout)
    if returncode != 0 or not out.exists():
        log.error("failed (exit %d%s):\n%s", returncode, ", timed out" if returncode == TIMED_OUT else "",
                  output[-5000:])
        return None
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - start
    return result


def horovod_cmd(np: int, args: List[str]) -> List[str]:
    return [sys.executable, "-m", "horovod.runner", "-np", str(np), sys.executable, *args]


def torchrun_cmd(np: int, args: List[str]) -> List[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(np), *args]


def rank_counts(text: str) -> Union[int, List[int]]:
    """``--np``: one count (``2``, kept an int as before) or a comma-separated list (``2,4,8,16``)."""
    counts = [int(c) for c in text.split(",") if c.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--np wants rank counts such as 2 or 2,4,8,16, not {text!r}")
    return counts[0] if len(counts) == 1 else counts


def add_scaling_options(parser: argparse.ArgumentParser, models: str, warmup: int, batches: int,
                        mlp_batches: int, iters: int, np_list: bool = False) -> None:
    """A scaling script's options: ``--np`` (with ``np_list``, one count or a list: ``rank_counts``), those it
    passes through to a synthetic benchmark (with its defaults), then ``--json`` and ``--timeout``."""
    if np_list:
        parser.add_argument("--np", type=rank_counts, default=2, help="rank count, or a list such as 2,4,8,16")
    else:
        parser.add_argument("--np", type=int, default=2)
    add_synthetic_options(parser, models, warmup, batches, mlp_batches, iters)
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per job")


def add_synthetic_options(parser: argparse.ArgumentParser, models: str, warmup: int, batches: int,
                          mlp_batches: int, iters: int) -> None:
    """The options passed through to a synthetic benchmark (``synthetic_args``), with these defaults."""
    parser.add_argument("--models", default=models)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=warmup)
    parser.add_argument("--num-batches-per-iter", type=int, default=batches)
    parser.add_argument("--mlp-num-batches-per-iter", type=int, default=mlp_batches,
                        help="the MLP's steps are much shorter, so it times more of them per iteration")
    parser.add_argument("--num-iters", type=int, default=iters)


def synthetic_args(model: str, opts: argparse.Namespace) -> List[str]:
    """A synthetic benchmark's command-line arguments for ``model``: one thread per rank, no GPU."""
    batches = opts.mlp_num_batches_per_iter if model == "mlp" else opts.num_batches_per_iter
    return ["--model", model, "--batch-size", str(opts.batch_size), "--image-size", str(opts.image_size),
            "--num-warmup-batches", str(opts.num_warmup_batches), "--num-batches-per-iter", str(batches),
            "--num-iters", str(opts.num_iters), "--num-threads", "1", "--no-cuda"]


def counts_of(np: Union[int, Sequence[int]]) -> List[int]:
    """The rank counts of ``--np`` as a list."""
    return [np] if isinstance(np, int) else list(np)


def synthetic(model: str, np: Union[int, Sequence[int]], opts: argparse.Namespace, tmp: Path,
              deadline: Optional[Deadline] = None) -> Dict[str, Dict[int, Optional[dict]]]:
    """Throughput of one model for Horovod and DDP at 1 and ``np`` ranks (each of them, for a list). With a
    ``deadline``, each job's limit is cut to end by it, and the jobs that no longer fit are skipped (None)."""
    common = synthetic_args(model, opts)
    results: Dict[str, Dict[int, Optional[dict]]] = {"horovod": {}, "ddp": {}}
    for n in dict.fromkeys([1, *counts_of(np)]):
        for backend in ("horovod", "ddp"):
            out = tmp / f"{model}-{backend}-{n}.json"
            if backend == "horovod":
                cmd = horovod_cmd(n, [str(BENCH), *common, "--json", str(out)])
            else:
                cmd = torchrun_cmd(n, [str(BENCH), *common, "--ddp", "--json", str(out)])
            limit = deadline.limit(opts.timeout) if deadline else opts.timeout
            if limit is None:
                log.warning("  %s %s np=%d: skipped, the deadline is near", model, backend, n)
                results[backend][n] = None
                continue
            res = _run(cmd, out, limit)
            results[backend][n] = res
            if res:
                log.info("  %s %s np=%d: %.1f img/sec total (per rank %.1f +-%.1f)", model, backend, n,
                         res["total_img_sec"], res["img_sec_mean"], res["img_sec_conf"])
    return results


def step_53(np: int, tmp: Path, timeout: float) -> Dict[str, Optional[float]]:
    """The 53-gradient step under horovod.torch, one raw mpi4py Allreduce of 46 MB, and Gloo's 53 allreduces."""
    out: Dict[str, Optional[float]] = {}
    path = tmp / "step-hvd.json"
    res = _run(horovod_cmd(np, ["-m", "benchmarks.workers.torch_hvd_step", str(path)]), path, timeout)
    out["horovod.torch"] = res["step_53"] if res else None
    mpirun = shutil.which("mpirun") or str(Path(sys.executable).parent / "mpirun")
    path = tmp / "step-mpi.json"
    if Path(mpirun).exists():
        res = _run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(np), sys.executable, "-m",
                    "benchmarks.workers.mpi_collectives", str(path), "4"], path, timeout)
        out["mpi4py"] = res["step_53"] if res else None
    else:
        log.warning("mpirun not found: skipping the raw mpi4py reference")
        out["mpi4py"] = None
    path = tmp / "step-gloo.json"
    res = _run(torchrun_cmd(np, ["-m", "benchmarks.workers.torch_collectives", str(path), "4"]), path, timeout)
    out["torch-gloo"] = res["step_53"] if res else None
    return out


def efficiency(res: Dict[int, Optional[dict]], np: int) -> Optional[float]:
    if not res.get(1) or not res.get(np):
        return None
    return res[np]["total_img_sec"] / (np * res[1]["total_img_sec"])


def report(synth: Dict[str, dict], step: Dict, np: Union[int, Sequence[int]]) -> List[str]:
    """The markdown tables and the two verdicts (for a list of counts: ``report_counts``)."""
    if not isinstance(np, int):
        if len(np) != 1:
            return report_counts(synth, step, list(np))
        np, step = np[0], step.get(np[0], step)
    lines = [f"| model | backend | 1 rank img/s | {np} ranks img/s (total) | scaling efficiency |",
             "|---|---|---|---|---|"]
    verdicts = []
    for model, res in synth.items():
        for backend in ("horovod", "ddp"):
            one, many = res[backend].get(1), res[backend].get(np)
            eff = efficiency(res[backend], np)
            cells = [f"{r['total_img_sec']:.1f}" if r else "failed" for r in (one, many)]
            cells.append(f"{100 * eff:.1f}%" if eff is not None else "–")
            lines.append(f"| {model} | {backend} | " + " | ".join(cells) + " |")
        e_h, e_d = efficiency(res["horovod"], np), efficiency(res["ddp"], np)
        if e_h is not None and e_d is not None:
            ratio = res["horovod"][np]["total_img_sec"] / res["ddp"][np]["total_img_sec"]
            verdicts.append(f"{model}: scaling efficiency horovod {100 * e_h:.1f}% vs DDP {100 * e_d:.1f}% "
                            f"({'MET' if e_h >= e_d else 'NOT MET'}: target horovod >= DDP; "
                            f"difference {100 * (e_h - e_d):+.1f} points); {np}-rank throughput "
                            f"horovod/DDP = {ratio:.3f}")
    hvd, mpi, gloo = step.get("horovod.torch"), step.get("mpi4py"), step.get("torch-gloo")
    if hvd is not None:
        line = f"ResNet-18 step (53 torch tensors, 46 MB, {np} ranks): horovod.torch {hvd * 1e3:.1f} ms"
        if mpi is not None:
            line += (f", one raw mpi4py Allreduce of 46 MB {mpi * 1e3:.1f} ms, ratio {hvd / mpi:.2f} "
                     f"({'MET' if hvd <= 1.2 * mpi else 'NOT MET'}: target <= 1.2)")
        if gloo is not None:
            line += f"; torch-gloo 53 async allreduces {gloo * 1e3:.1f} ms"
        verdicts.append(line)
    return lines + [""] + verdicts


def report_counts(synth: Dict[str, dict], step: Dict[int, Dict[str, Optional[float]]],
                  counts: List[int]) -> List[str]:
    """One table for several rank counts (total img/s and scaling efficiency per count), then per model and
    count the Horovod/DDP verdict, then the 53-gradient step at each count."""
    head = " | ".join(f"{n} ranks img/s | {n} eff" for n in counts)
    lines = [f"| model | backend | 1 rank img/s | {head} |", "|---|---|---|" + "---|---|" * len(counts)]
    verdicts = []
    for model, res in synth.items():
        for backend in ("horovod", "ddp"):
            one = res[backend].get(1)
            cells = [f"{one['total_img_sec']:.1f}" if one else "failed"]
            for n in counts:
                many, eff = res[backend].get(n), efficiency(res[backend], n)
                cells += [f"{many['total_img_sec']:.1f}" if many else "failed",
                          f"{100 * eff:.1f}%" if eff is not None else "–"]
            lines.append(f"| {model} | {backend} | " + " | ".join(cells) + " |")
        for n in counts:
            e_h, e_d = efficiency(res["horovod"], n), efficiency(res["ddp"], n)
            if e_h is not None and e_d is not None:
                ratio = res["horovod"][n]["total_img_sec"] / res["ddp"][n]["total_img_sec"]
                verdicts.append(f"{model}, {n} ranks: scaling efficiency horovod {100 * e_h:.1f}% vs DDP "
                                f"{100 * e_d:.1f}% ({'MET' if e_h >= e_d else 'NOT MET'}; difference "
                                f"{100 * (e_h - e_d):+.1f} points); throughput horovod/DDP = {ratio:.3f}")
    for n in counts:
        verdicts += [line for line in report({}, step.get(n, {}), n) if line.startswith("ResNet-18 step")]
    return lines + [""] + verdicts


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scaling_options(parser, "resnet,mlp", warmup=3, batches=5, mlp_batches=20, iters=5, np_list=True)
    parser.add_argument("--skip-step", action="store_true", help="skip the 53-gradient step measurement")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        synth = {m: synthetic(m, opts.np, opts, tmp) for m in opts.models.split(",")}
        if isinstance(opts.np, int):
            step = {} if opts.skip_step else step_53(opts.np, tmp, opts.timeout)
        else:
            step = {} if opts.skip_step else {n: step_53(n, tmp, opts.timeout) for n in opts.np}
    print()
    print("\n".join(report(synth, step, opts.np)))
    print(f"\n(total benchmark wall time {time.perf_counter() - start:.0f} s)")
    if opts.json:
        Path(opts.json).write_text(json.dumps({"options": vars(opts), "synthetic": synth, "step_53": step}, indent=1))
    ok = all(r["horovod"].get(n) for r in synth.values() for n in counts_of(opts.np))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
