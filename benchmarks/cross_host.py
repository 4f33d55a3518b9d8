"""Allreduce across namespace hosts whose links are limited to 1 Gbit/s: this project against torch Gloo.

Makes 2, then 3 hosts with tests/support/hosts.py's ``namespace_hosts`` (needs root), limits the link towards
every host to 1 Gbit/s (``tc tbf``), and runs over real ssh:

- the link's own ceiling: one raw TCP stream from host 1 to host 2;
- this project through ``horovodrun``: 1 rank per host, and 2 ranks per host with
  HOROVOD_HIERARCHICAL_ALLREDUCE=1 and =0 (shm inside a host, tcp across: the plane is hierarchical for Sum
  either way) and with HOROVOD_CPU_OPERATIONS=tcp (one flat ring over every rank);
- torch.distributed Gloo through one ``torchrun`` agent per host (c10d rendezvous on host 1), 1 and 2 per host.

Each job times 64 MB float32 allreduces (each after a barrier, after a warm-up) and 4 KB allreduces (batches of
back-to-back calls). Then, if the kernel has ``sch_netem``, 0.2 ms is added to every link and the 4 KB latency is
measured again. Prints a markdown table; ``--json`` keeps the raw samples.

    sudo python benchmarks/cross_host.py [--hosts 2,3] [--iters 5] [--json out.json]

Link utilisation is the lower bound on the bytes any allreduce must bring into each host, 2(h-1)/h x 64 MB for
h hosts (a ring with one rank per host moves exactly that: its busbw), over the time taken, over 125 MB/s.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.hosts import HostCluster, ShapingUnavailable, namespace_hosts  # noqa: E402

log = logging.getLogger("benchmarks.cross_host")
LINK_RATE = "1gbit"
LINK_BYTES_PER_S = 125e6
DELAY_MS = 0.2
RESULT = re.compile(r"RESULT (\{.*\})")


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMIX_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def _results(output: str) -> List[dict]:
    return [json.loads(m.group(1)) for m in RESULT.finditer(output)]


def _communicate(procs: Sequence[subprocess.Popen], timeout: float) -> List[str]:
    """Outputs of ``procs`` (started in sessions of their own); on timeout kill their groups, by id, and raise."""
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        raise RuntimeError(f"a job did not finish within {timeout:.0f}s") from None
    return outputs


def _popen(argv: List[str], env: Dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)


def run_horovod(cluster: HostCluster, slots: int, extra_env: Dict[str, str], worker_args: List[str],
                timeout: float) -> Optional[dict]:
    """One horovodrun job of ``slots`` ranks per host; rank 0's RESULT, or None (with its output logged)."""
    argv = [sys.executable, "-m", "horovod.runner", "-np", str(slots * len(cluster.hosts)), "-H",
            cluster.hosts_arg(slots), *cluster.launcher_args(), sys.executable, "-m",
            "benchmarks.workers.cross_host_hvd", *worker_args]
    (output,) = _communicate([_popen(argv, cluster.launcher_env(_env(extra_env)))], timeout)
    found = _results(output)
    if not found:
        log.error("horovodrun job failed:\n%s", output[-3000:])
    return found[-1] if found else None


def run_gloo(cluster: HostCluster, slots: int, worker_args: List[str], timeout: float) -> Optional[dict]:
    """One torchrun agent per host over ssh (c10d rendezvous on the first host); global rank 0's RESULT."""
    port = random.randint(29400, 29900)
    first = cluster.hosts[0].address
    env = " ".join(f"{k}={v}" for k, v in (("PYTHONPATH", _env()["PYTHONPATH"]), ("OMP_NUM_THREADS", "1"),
                                           ("GLOO_SOCKET_IFNAME", "eth0")))
    procs = []
    for index, host in enumerate(cluster.hosts):
        command = (f"cd {ROOT} && env {env} {sys.executable} -m torch.distributed.run --nnodes "
                   f"{len(cluster.hosts)} --node-rank {index} --nproc-per-node {slots} --rdzv-backend c10d "
                   f"--rdzv-endpoint {first}:{port} -m benchmarks.workers.cross_host_torch {' '.join(worker_args)}")
        procs.append(_popen(host.ssh_command(command), cluster.launcher_env(_env())))
    outputs = _communicate(procs, timeout)
    found = [r for out in outputs for r in _results(out)]
    if not found:
        log.error("torchrun job failed:\n%s", "\n---\n".join(out[-2000:] for out in outputs))
    return found[-1] if found else None


def link_ceiling(cluster: HostCluster, both_ways: bool, nbytes: int = 128 << 20) -> Optional[float]:
    """Bytes per second of a raw TCP stream from the first host to the second through the shaped link.

    With ``both_ways`` the second host streams to the first at the same time (as in an allreduce, where every
    link carries data one way and the acknowledgements of the other stream) and the slower stream counts.
    """
    pairs = [cluster.hosts[0:2]] + ([cluster.hosts[1::-1]] if both_ways else [])
    module = f"cd {ROOT} && {sys.executable} -m benchmarks.workers.cross_host_link"
    servers, senders = [], []
    for server, client in pairs:
        port = random.randint(29901, 29990)
        servers.append(_popen(server.ssh_command(f"{module} serve {port} {nbytes}"), cluster.launcher_env(_env())))
        senders.append(_popen(client.ssh_command(f"{module} send {server.address} {port} {nbytes}"),
                              cluster.launcher_env(_env())))
    _communicate(senders, 120)
    found = [r for out in _communicate(servers, 60) for r in _results(out)]
    if len(found) != len(pairs):
        return None
    return min(r["bytes"] / r["seconds"] for r in found)


def shape_all(cluster: HostCluster, delay_ms: Optional[float] = None) -> None:
    for host in cluster.hosts:
        host.shape(delay_ms=delay_ms, rate=LINK_RATE)


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def measure_hosts(count: int, args: argparse.Namespace) -> List[dict]:
    """Every configuration on ``count`` fresh namespace hosts; one row per configuration."""
    rows: List[dict] = []
    worker = [str(args.warmup), str(args.iters), str(args.small_batches), str(args.small_calls)]
    configs = [("ours, 1 rank/host", 1, {}), ("ours hierarchical=1, 2 ranks/host", 2,
                                              {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}),
               ("ours hierarchical=0, 2 ranks/host", 2, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}),
               ("ours flat tcp ring, 2 ranks/host", 2, {"HOROVOD_CPU_OPERATIONS": "tcp"})]
    with namespace_hosts(count) as cluster:
        shape_all(cluster)
        for both_ways in (False, True):
            rows.append({"hosts": count, "config": "raw TCP, " + ("2 streams opposite ways" if both_ways else
                                                                   "1 stream (ceiling)"),
                         "ceiling": link_ceiling(cluster, both_ways), "load": load()})
        for name, slots, extra in configs:
            rows.append({"hosts": count, "config": name, "load": load(),
                         "result": run_horovod(cluster, slots, extra, worker, args.timeout)})
        if not args.skip_gloo:
            for slots in (1, 2):
                rows.append({"hosts": count, "config": f"torch Gloo (torchrun), {slots} rank(s)/host", "load": load(),
                             "result": run_gloo(cluster, slots, worker, args.timeout)})
        try:
            shape_all(cluster, DELAY_MS)
        except ShapingUnavailable as exc:
            log.warning("no netem delay on this kernel, skipping the latency runs: %s", exc)
            rows.append({"hosts": count, "config": f"+{DELAY_MS} ms netem", "skipped": str(exc)})
            return rows
        small_only = ["0", "0", str(args.small_batches), str(args.small_calls)]
        rows.append({"hosts": count, "config": f"ours, 1 rank/host, +{DELAY_MS} ms", "load": load(),
                     "result": run_horovod(cluster, 1, {}, small_only, args.timeout)})
        if not args.skip_gloo:
            rows.append({"hosts": count, "config": f"torch Gloo, 1 rank/host, +{DELAY_MS} ms", "load": load(),
                         "result": run_gloo(cluster, 1, small_only, args.timeout)})
    return rows


def summarise(row: dict) -> dict:
    """Best and median 64 MB time, algbw, busbw (one rank per host ring) and link %, and 4 KB latency."""
    result, hosts = row.get("result"), row["hosts"]
    if not result:
        return {}
    out = {"small_us": statistics.median(result["small"]) * 1e6 if result["small"] else None}
    if result["big"]:
        factor = 2 * (hosts - 1) / hosts
        for key, t in (("best", min(result["big"])), ("median", statistics.median(result["big"]))):
            algbw = result["big_bytes"] / t
            out[key] = {"seconds": t, "algbw": algbw / 1e6, "busbw": factor * algbw / 1e6,
                        "link": factor * algbw / LINK_BYTES_PER_S}
    return out


def table(rows: List[dict]) -> str:
    """Markdown: per hosts and configuration, 64 MB algbw/busbw/link % (best, median) and 4 KB latency."""
    lines = ["| hosts | configuration | 64 MB algbw MB/s best (median) | busbw MB/s best (median) | "
             "% of link best (median) | 4 KB latency µs | load |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "ceiling" in row:
            c = row["ceiling"]
            cell = f"{c / 1e6:.1f} ({c / LINK_BYTES_PER_S:.0%} of 125 MB/s)" if c else "failed"
            lines.append(f"| {row['hosts']} | {row['config']} | – | {cell} | – | – | {row['load']} |")
            continue
        if "skipped" in row:
            lines.append(f"| {row['hosts']} | {row['config']} | skipped: {row['skipped'][:80]} | | | | |")
            continue
        s = summarise(row)
        if not s:
            lines.append(f"| {row['hosts']} | {row['config']} | failed | | | | {row.get('load', '')} |")
            continue
        big = [f"{s['best'][k] * (100 if k == 'link' else 1):.1f} ({s['median'][k] * (100 if k == 'link' else 1):.1f})"
               for k in ("algbw", "busbw", "link")] if "best" in s else ["–"] * 3
        small = f"{s['small_us']:.0f}" if s["small_us"] is not None else "–"
        lines.append(f"| {row['hosts']} | {row['config']} | " + " | ".join(big) + f" | {small} | {row['load']} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="2,3", help="comma-separated host counts")
    parser.add_argument("--warmup", type=int, default=1, help="64 MB allreduces before timing")
    parser.add_argument("--iters", type=int, default=5, help="timed 64 MB allreduces")
    parser.add_argument("--small-batches", type=int, default=5)
    parser.add_argument("--small-calls", type=int, default=200, help="4 KB allreduces per batch")
    parser.add_argument("--skip-gloo", action="store_true")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per job")
    parser.add_argument("--json", help="write the raw rows here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows: List[dict] = []
    for count in (int(c) for c in args.hosts.split(",")):
        log.info("%d hosts, load %s", count, load())
        rows += measure_hosts(count, args)
        print(table([r for r in rows if r["hosts"] == count]), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("result") or "ceiling" in r or "skipped" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
