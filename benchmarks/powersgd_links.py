"""PowerSGD on slow links (issue 30): step time and bytes on the wire of a 10 M-parameter MLP on two namespace
hosts (1 rank each) whose links are limited with ``tc`` (100 Mbit/s, then 1 Gbit/s), and the accuracy PowerSGD
keeps on the digits example.

Per link rate, one job per configuration (``--rounds`` repeats them, alternating), over real ssh:

- ours uncompressed, with ``Compression.fp16`` and ``.bf16``, and with ``hvd.Compression.powersgd`` at each
  ``--ranks`` (horovodrun, 1 rank per host);
- DDP without a hook (its default 25 MB buckets), and DDP with ``powerSGD_hook`` at the first of ``--ranks``
  (torchrun, one agent per host, Gloo). The hook runs with one bucket (``bucket_cap_mb`` above the model's
  40 MB): in torch 2.13 on Gloo it aborts with several ("Received data size doesn't match expected size").

Both PowerSGDs start at step 2 (``start_powerSGD_iter=2``) and the timed steps come after ``--warmup`` steps, so
the compressed path is what is timed. A step is zero_grad, forward, backward and the optimizer's step on a batch
of 32 (synthetic data). Bytes on the wire are the rank's own ``eth0`` counters (``/proc/net/dev`` in its host's
namespace: headers, acknowledgements and negotiation included) over the timed steps, per step; the payload is
what the ranks allreduce per step (gradients, or P and Q plus the uncompressed biases).

With ``--accuracy-seeds 0,1,2`` it also trains examples/pytorch/pytorch_digits.py at 2 ranks on this host
(20 epochs, about 440 steps) uncompressed and with PowerSGD at each ``--ranks`` (``start_powerSGD_iter`` 50),
per seed, and prints the held-out accuracies. ``--skip-links`` runs only that.

    sudo python benchmarks/powersgd_links.py [--rates 100mbit,1gbit] [--ranks 4,1] [--configs ...]
                                             [--warmup 4] [--steps 6] [--rounds 1] [--accuracy-seeds 0,1,2]
                                             [--skip-links] [--json out]
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.cross_host import _communicate, _env, _popen, _results, load  # noqa: E402
from benchmarks.jobs import run_job  # noqa: E402
from tests.support.hosts import HostCluster, namespace_hosts  # noqa: E402

log = logging.getLogger("benchmarks.powersgd_links")
WORKER = "benchmarks.workers.powersgd_step"
ACCURACY = re.compile(r"test accuracy on \d+ held-out digits: ([\d.]+)%")


def run_ours(cluster: HostCluster, compression: str, rank: int, args: argparse.Namespace) -> Optional[dict]:
    """One horovodrun job, 1 rank per host; rank 0's RESULT, or None (its output logged)."""
    argv = [sys.executable, "-m", "horovod.runner", "-np", str(len(cluster.hosts)), "-H", cluster.hosts_arg(1),
            *cluster.launcher_args(), sys.executable, "-m", WORKER, "hvd", compression, str(rank),
            str(args.warmup), str(args.steps)]
    (output,) = _communicate([_popen(argv, cluster.launcher_env(_env()))], args.timeout)
    found = _results(output)
    if not found:
        log.error("horovodrun job failed:\n%s", output[-3000:])
    return found[-1] if found else None


def run_ddp(cluster: HostCluster, hook: str, rank: int, args: argparse.Namespace) -> Optional[dict]:
    """One torchrun agent per host over ssh (c10d rendezvous on the first host), Gloo; rank 0's RESULT."""
    port = random.randint(29400, 29900)
    env = " ".join(f"{k}={v}" for k, v in (("PYTHONPATH", _env()["PYTHONPATH"]), ("OMP_NUM_THREADS", "1"),
                                           ("GLOO_SOCKET_IFNAME", "eth0")))
    procs = []
    for index, host in enumerate(cluster.hosts):
        command = (f"cd {ROOT} && env {env} {sys.executable} -m torch.distributed.run --nnodes "
                   f"{len(cluster.hosts)} --node-rank {index} --nproc-per-node 1 --rdzv-backend c10d "
                   f"--rdzv-endpoint {cluster.hosts[0].address}:{port} -m {WORKER} ddp {hook} {rank} "
                   f"{args.warmup} {args.steps}")
        procs.append(_popen(host.ssh_command(command), cluster.launcher_env(_env())))
    outputs = _communicate(procs, args.timeout)
    found = [r for out in outputs for r in _results(out)]
    if not found:
        log.error("torchrun job failed:\n%s", "\n---\n".join(out[-2000:] for out in outputs))
    return found[-1] if found else None


CONFIGS = ("none", "fp16", "bf16", "powersgd", "ddp", "ddp-hook")


def configurations(ranks: Sequence[int], chosen: Sequence[str]) -> List[tuple]:
    """(label, runner, compression, rank) in the order they run, for the ``--configs`` chosen."""
    unknown = set(chosen) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"unknown --configs {sorted(unknown)}: choose from {', '.join(CONFIGS)}")
    configs = []
    if "none" in chosen:
        configs.append(("ours, uncompressed", run_ours, "none", 0))
    configs += [(f"ours, Compression.{c}", run_ours, c, 0) for c in ("fp16", "bf16") if c in chosen]
    if "powersgd" in chosen:
        configs += [(f"ours, PowerSGD R={r}", run_ours, "powersgd", r) for r in ranks]
    if "ddp" in chosen:
        configs.append(("DDP, no hook", run_ddp, "none", 0))
    if "ddp-hook" in chosen:
        configs.append((f"DDP, powerSGD_hook R={ranks[0]} (1 bucket)", run_ddp, "powersgd", ranks[0]))
    return configs


def measure_links(args: argparse.Namespace) -> List[dict]:
    ranks = [int(r) for r in args.ranks.split(",")]
    rows: List[dict] = []
    with namespace_hosts(2) as cluster:
        for rate in args.rates.split(","):
            for host in cluster.hosts:
                host.shape(rate=rate)
            for _ in range(args.rounds):
                for label, runner, compression, rank in configurations(ranks, args.configs.split(",")):
                    log.info("%s, %s (load %s)", rate, label, load())
                    rows.append({"rate": rate, "config": label, "load": load(),
                                 "result": runner(cluster, compression, rank, args)})
            log.info("%s", links_table([r for r in rows if r["rate"] == rate]))
    return rows


def links_table(rows: List[dict]) -> str:
    """Markdown: per rate and configuration, the median step (min-max), the speed-ups, bytes per step."""
    merged: Dict[tuple, dict] = {}
    for row in rows:
        into = merged.setdefault((row["rate"], row["config"]), {"times": [], "tx": [], "rx": [], "payload": None,
                                                                "failed": 0, "loads": []})
        into["loads"].append(row["load"])
        result = row["result"]
        if not result:
            into["failed"] += 1
            continue
        into["times"] += result["times"]
        into["tx"] += [w["tx"] for w in result["wire"]]
        into["rx"] += [w["rx"] for w in result["wire"]]
        into["payload"] = result["payload"]
    lines = ["| link | configuration | step ms, median (min-max) | speed-up over ours uncompressed | "
             "DDP hook's step / this step | sent per rank per step (eth0) | payload per step | steps | load |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (rate, config), m in merged.items():
        if not m["times"]:
            lines.append(f"| {rate} | {config} | failed ({m['failed']} runs) | | | | | | {', '.join(m['loads'])} |")
            continue
        median = statistics.median(m["times"])
        base = merged.get((rate, "ours, uncompressed"), {}).get("times")
        hook = next((v["times"] for (r, c), v in merged.items() if r == rate and "powerSGD_hook" in c), None)
        ratio = f"{statistics.median(base) / median:.1f}x" if base else "–"
        versus = f"{statistics.median(hook) / median:.2f}x" if hook else "–"
        lines.append(f"| {rate} | {config} | {1e3 * median:.0f} ({1e3 * min(m['times']):.0f}-"
                     f"{1e3 * max(m['times']):.0f}) | {ratio} | {versus} | {_mb(statistics.mean(m['tx']))} | "
                     f"{_mb(m['payload'])} | {len(m['times'])} | {', '.join(m['loads'])} |")
    return "\n".join(lines)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.1f} kB"


def measure_accuracy(args: argparse.Namespace) -> List[dict]:
    """The digits example at 2 ranks on this host, per seed: uncompressed and PowerSGD at each rank."""
    rows = []
    ranks = [int(r) for r in args.ranks.split(",")]
    configs = [("uncompressed", ["--compression", "none"])]
    configs += [(f"PowerSGD R={r}", ["--compression", "powersgd", "--powersgd-rank", str(r)]) for r in ranks]
    with tempfile.TemporaryDirectory(prefix="powersgd-digits-") as tmp:
        for seed in [int(s) for s in args.accuracy_seeds.split(",")]:
            for label, extra in configs:
                cmd = [sys.executable, "-m", "horovod.runner", "-np", "2", sys.executable,
                       "examples/pytorch/pytorch_digits.py", "--epochs", "20", "--seed", str(seed),
                       "--checkpoint", str(Path(tmp) / "digits.pt"), "--min-accuracy", "0", *extra]
                status, output = run_job(cmd, _env(), str(ROOT), args.timeout)
                found = ACCURACY.search(output)
                if status or not found:
                    log.error("digits run failed (%s, seed %d):\n%s", label, seed, output[-2000:])
                rows.append({"seed": seed, "config": label, "accuracy": float(found.group(1)) if found else None})
                log.info("digits, seed %d, %s: %s %%", seed, label, rows[-1]["accuracy"])
    return rows


def accuracy_table(rows: List[dict]) -> str:
    """Markdown: per configuration, each seed's accuracy, the mean, and the largest drop below uncompressed."""
    seeds = sorted({r["seed"] for r in rows})
    by = {(r["config"], r["seed"]): r["accuracy"] for r in rows}
    configs = list(dict.fromkeys(r["config"] for r in rows))
    lines = ["| digits, 2 ranks, 20 epochs | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | "
             "largest drop below uncompressed (points) |", "|---" * (len(seeds) + 3) + "|"]
    for config in configs:
        values = [by.get((config, s)) for s in seeds]
        ok = [v for v in values if v is not None]
        drops = [by[("uncompressed", s)] - by[(config, s)] for s in seeds
                 if by.get((config, s)) is not None and by.get(("uncompressed", s)) is not None]
        lines.append(f"| {config} | " + " | ".join(f"{v:.2f}" if v is not None else "failed" for v in values)
                     + f" | {statistics.mean(ok):.2f} | " + (f"{max(drops):.2f}" if config != "uncompressed"
                                                               and drops else "–") + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="100mbit,1gbit", help="tc rates of the links, comma-separated")
    parser.add_argument("--ranks", default="4,1", help="PowerSGD ranks for ours; DDP's hook runs the first")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    parser.add_argument("--warmup", type=int, default=4, help="steps before timing (2 of them uncompressed)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per job")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the configurations, alternating")
    parser.add_argument("--timeout", type=float, default=400, help="seconds per job")
    parser.add_argument("--accuracy-seeds", default="", help="also train the digits example with these seeds")
    parser.add_argument("--skip-links", action="store_true", help="only the accuracy runs")
    parser.add_argument("--json", help="write the raw rows here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    links = [] if args.skip_links else measure_links(args)
    accuracy = measure_accuracy(args) if args.accuracy_seeds else []
    if links:
        log.info("\n%s", links_table(links))
    if accuracy:
        log.info("\n%s", accuracy_table(accuracy))
    if args.json:
        Path(args.json).write_text(json.dumps({"links": links, "accuracy": accuracy}, indent=1))
    return 0 if all(r["result"] for r in links) and all(r["accuracy"] is not None for r in accuracy) else 1


if __name__ == "__main__":
    sys.exit(main())
