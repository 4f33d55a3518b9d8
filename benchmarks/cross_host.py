"""Allreduce across namespace hosts whose links are limited to 1 Gbit/s: this project against torch Gloo.

Makes 2, then 3 hosts with tests/support/hosts.py's ``namespace_hosts`` (needs root), limits the link towards
every host to 1 Gbit/s (``Host.shape``: ``tc tbf`` with a 1 Mbit bucket and a 2 ms queue), and runs over real
ssh (``--configs`` picks, ``--rounds`` repeats them, alternating):

- ``raw``: the link's own ceiling: one raw TCP stream from host 1 to host 2, alone and with one the other way;
- ``ring``, ``hier``, ``flat``, ``tcp``: this project through ``horovodrun``: 1 rank per host (a ring across
  hosts), and 2 ranks per host hierarchical (the default: shm inside a host, tcp across), with
  HOROVOD_HIERARCHICAL_ALLREDUCE=0 (one flat tcp ring over every rank) and with HOROVOD_CPU_OPERATIONS=tcp;
- ``gloo``: torch.distributed Gloo through one ``torchrun`` agent per host (c10d rendezvous on host 1), 1 and
  2 ranks per host;
- ``pystar``, ``pyrd``: the 4 KB allreduce's floor, 1 rank per host: the same blocking call in plain Python, one
  thread, raw TCP, as a star through rank 0 (what a carried collective moves) or by recursive doubling
  (``benchmarks/workers/cross_host_floor.py``): what any Python implementation pays on these hosts.

Each job times 64 MB float32 allreduces (each after a barrier, after a warm-up) and 4 KB allreduces (batches
of back-to-back calls). Then, if the kernel has ``sch_netem`` (and without ``--skip-latency``), 0.2 ms is
added to every link and the 4 KB latency is measured again. Prints a markdown table (rounds merged: best,
median and worst of every sample); ``--json`` keeps the raw rows.

    sudo python benchmarks/cross_host.py [--hosts 2,3] [--iters 5] [--configs raw,ring,hier,flat,gloo]
                                         [--rounds 1] [--skip-latency] [--json out.json]
    sudo python benchmarks/cross_host.py --plan '2:ring;8:ring,gloo1;4:hier' --skip-latency   # many hosts

``--plan`` gives each host count its own configurations (``gloo1``/``gloo2``: Gloo at 1 or 2 ranks per host
only). The end of the output lists the ratios the many-host work is judged by (:func:`ratios`).

Link utilisation is the lower bound on the bytes any allreduce must bring into each host, 2(h-1)/h x 64 MB for
h hosts (a ring with one rank per host moves exactly that: its busbw), over the time taken, over 125 MB/s; with
1 rank per host it is also the algbw's share of the ring bound, link x h / (2(h-1)).
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
from typing import Callable, Dict, List, Optional, Sequence, Tuple

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


def _on_every_host(cluster: HostCluster, command_for: Callable[[int], str], what: str,
                   timeout: float) -> Optional[dict]:
    """Run ``command_for(index)`` on every host over ssh at once; the last RESULT any of them printed."""
    procs = [_popen(host.ssh_command(f"cd {ROOT} && {command_for(index)}"), cluster.launcher_env(_env()))
             for index, host in enumerate(cluster.hosts)]
    outputs = _communicate(procs, timeout)
    found = [r for out in outputs for r in _results(out)]
    if not found:
        log.error("%s job failed:\n%s", what, "\n---\n".join(out[-2000:] for out in outputs))
    return found[-1] if found else None


def run_gloo(cluster: HostCluster, slots: int, worker_args: List[str], timeout: float) -> Optional[dict]:
    """One torchrun agent per host over ssh (c10d rendezvous on the first host); global rank 0's RESULT."""
    port = random.randint(29400, 29900)
    first = cluster.hosts[0].address
    env = " ".join(f"{k}={v}" for k, v in (("PYTHONPATH", _env()["PYTHONPATH"]), ("OMP_NUM_THREADS", "1"),
                                           ("GLOO_SOCKET_IFNAME", "eth0")))
    return _on_every_host(cluster, lambda index: (
        f"env {env} {sys.executable} -m torch.distributed.run --nnodes {len(cluster.hosts)} --node-rank {index} "
        f"--nproc-per-node {slots} --rdzv-backend c10d --rdzv-endpoint {first}:{port} "
        f"-m benchmarks.workers.cross_host_torch {' '.join(worker_args)}"), "torchrun", timeout)


def run_floor(cluster: HostCluster, algorithm: str, worker_args: List[str], timeout: float) -> Optional[dict]:
    """The plain-Python 4 KB allreduce (``star`` or ``rd``), one process per host over ssh; rank 0's RESULT."""
    port = random.randint(29400, 29900)
    addresses = ",".join(host.address for host in cluster.hosts)
    small_only = " ".join(["0", "0", *worker_args[2:]])
    return _on_every_host(cluster, lambda rank: (
        f"env PYTHONPATH={_env()['PYTHONPATH']} {sys.executable} -m benchmarks.workers.cross_host_floor "
        f"{algorithm} {rank} {len(cluster.hosts)} {addresses} {port} {small_only}"), f"plain-Python {algorithm}",
        timeout)


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


CONFIGS = {  # name -> (label, ranks per host, environment); "raw" and "gloo" are handled apart
    "ring": ("ours, 1 rank/host (ring)", 1, {}),
    "hier": ("ours, 2 ranks/host, hierarchical (default)", 2, {}),
    "flat": ("ours, 2 ranks/host, HOROVOD_HIERARCHICAL_ALLREDUCE=0 (flat ring)", 2,
             {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}),
    "tcp": ("ours, 2 ranks/host, HOROVOD_CPU_OPERATIONS=tcp (flat ring)", 2, {"HOROVOD_CPU_OPERATIONS": "tcp"}),
}
GLOO_SLOTS = {"gloo": (1, 2), "gloo1": (1,), "gloo2": (2,)}   # torch Gloo at 1 and/or 2 ranks per host
FLOORS = {"pystar": ("star", "plain Python star, 1 rank/host (4 KB floor)"),
          "pyrd": ("rd", "plain Python recursive doubling, 1 rank/host (4 KB floor)")}
DEFAULT_CONFIGS = "raw,ring,hier,flat,gloo"


def measure_once(cluster: HostCluster, names: Sequence[str], args: argparse.Namespace) -> List[dict]:
    """One row per configuration in ``names``, each run once on ``cluster``."""
    count, rows = len(cluster.hosts), []
    worker = [str(args.warmup), str(args.iters), str(args.small_batches), str(args.small_calls)]
    for name in names:
        if name == "raw":
            for both_ways in (False, True):
                rows.append({"hosts": count, "config": "raw TCP, " + ("2 streams opposite ways" if both_ways
                                                                       else "1 stream"),
                             "load": load(), "ceiling": link_ceiling(cluster, both_ways)})
        elif name.startswith("gloo"):
            for slots in GLOO_SLOTS[name]:
                rows.append({"hosts": count, "config": f"torch Gloo (torchrun), {slots} rank(s)/host",
                             "load": load(), "result": run_gloo(cluster, slots, worker, args.timeout)})
        elif name in FLOORS:
            algorithm, label = FLOORS[name]
            rows.append({"hosts": count, "config": label, "load": load(),
                         "result": run_floor(cluster, algorithm, worker, args.timeout)})
        else:
            label, slots, extra = config_spec(name)
            rows.append({"hosts": count, "config": label, "load": load(),
                         "result": run_horovod(cluster, slots, extra, worker, args.timeout)})
    return rows


def config_spec(name: str) -> Tuple[str, int, Dict[str, str]]:
    """A configuration by name, with ``+VARIABLE=value`` suffixes added to its environment and label."""
    base, *assignments = name.split("+")
    label, slots, extra = CONFIGS[base]
    extra = dict(extra, **dict(a.split("=", 1) for a in assignments))
    return label + "".join(f", {a}" for a in assignments), slots, extra


def config_names(text: str) -> List[str]:
    """Comma-separated configuration names, checked."""
    names = [n for n in text.split(",") if n]
    unknown = {n.split("+")[0] for n in names} - set(CONFIGS) - {"raw"} - set(GLOO_SLOTS) - set(FLOORS)
    if unknown:
        raise SystemExit(f"unknown configurations {sorted(unknown)}: choose from raw, {', '.join(GLOO_SLOTS)}, "
                         f"{', '.join(FLOORS)}, "
                         f"{', '.join(CONFIGS)} (ours may take +VARIABLE=value suffixes)")
    return names


def plan(args: argparse.Namespace) -> List[Tuple[int, List[str]]]:
    """(host count, configurations) in run order: ``--plan 2:ring;8:ring,gloo1``, else every --hosts x --configs."""
    if args.plan:
        steps = [part.split(":", 1) for part in args.plan.split(";") if part]
        return [(int(count), config_names(names)) for count, names in steps]
    return [(int(count), config_names(args.configs)) for count in args.hosts.split(",")]


def measure_hosts(count: int, names: List[str], args: argparse.Namespace) -> List[dict]:
    """The configurations ``names`` on ``count`` fresh namespace hosts, alternated ``--rounds`` times."""
    rows: List[dict] = []
    with namespace_hosts(count) as cluster:
        shape_all(cluster)
        for _ in range(args.rounds):
            rows += measure_once(cluster, names, args)
        if args.skip_latency:
            return rows
        try:
            shape_all(cluster, DELAY_MS)
        except ShapingUnavailable as exc:
            log.warning("no netem delay on this kernel, skipping the latency runs: %s", exc)
            rows.append({"hosts": count, "config": f"+{DELAY_MS} ms netem", "skipped": str(exc)})
            return rows
        small_only = ["0", "0", str(args.small_batches), str(args.small_calls)]
        rows.append({"hosts": count, "config": f"ours, 1 rank/host, +{DELAY_MS} ms", "load": load(),
                     "result": run_horovod(cluster, 1, {}, small_only, args.timeout)})
        if any(n in ("gloo", "gloo1") for n in names):
            rows.append({"hosts": count, "config": f"torch Gloo, 1 rank/host, +{DELAY_MS} ms", "load": load(),
                         "result": run_gloo(cluster, 1, small_only, args.timeout)})
    return rows


def merge(rows: List[dict]) -> List[dict]:
    """Rows of the same hosts and configuration (one per round) as one, with every sample and every load."""
    merged: Dict[tuple, dict] = {}
    for row in rows:
        into = merged.setdefault((row["hosts"], row["config"]), {
            "hosts": row["hosts"], "config": row["config"], "loads": [], "ceilings": [], "failed": 0,
            "skipped": row.get("skipped"), "big": [], "small": [], "big_bytes": 0})
        if "load" in row:
            into["loads"].append(row["load"])
        if "ceiling" in row:
            into["ceilings"].append(row["ceiling"])
        elif row.get("result"):
            into["big"] += row["result"]["big"]
            into["small"] += row["result"]["small"]
            into["big_bytes"] = row["result"]["big_bytes"]
        elif "skipped" not in row:
            into["failed"] += 1
    return list(merged.values())


def summarise(row: dict) -> dict:
    """A merged row's 4 KB median latency and its 64 MB algbw, busbw and link share (best, median, worst)."""
    out: dict = {"small_us": statistics.median(row["small"]) * 1e6 if row["small"] else None}
    factor = 2 * (row["hosts"] - 1) / row["hosts"]
    for key, pick in (("best", min), ("median", statistics.median), ("worst", max)):
        if row["big"]:
            algbw = row["big_bytes"] / pick(row["big"])
            out[key] = {"algbw": algbw / 1e6, "busbw": factor * algbw / 1e6,
                        "link": 100 * factor * algbw / LINK_BYTES_PER_S}
    return out


def _cell(values: List[float]) -> str:
    """``best (median) [worst]`` of a figure; the value alone when there is one."""
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{max(values):.1f} ({statistics.median(values):.1f}) [{min(values):.1f}]"


def table(rows: List[dict]) -> str:
    """Markdown: per hosts and configuration, 64 MB algbw/busbw/link % (best, median, worst), 4 KB latency."""
    lines = ["| hosts | configuration | 64 MB algbw MB/s best (median) [worst] | busbw MB/s | % of link | "
             "4 KB latency µs (median) | samples | load |", "|---|---|---|---|---|---|---|---|"]
    for row in merge(rows):
        head, loads = f"| {row['hosts']} | {row['config']} |", ", ".join(row["loads"])
        if row["skipped"]:
            lines.append(f"{head} skipped: {row['skipped'][:80]} | | | | | |")
            continue
        if row["ceilings"]:
            ok = [c for c in row["ceilings"] if c]
            cells = ["–", _cell([c / 1e6 for c in ok]), _cell([100 * c / LINK_BYTES_PER_S for c in ok])] \
                if ok else ["failed", "", ""]
            lines.append(f"{head} {' | '.join(cells)} | – | {len(ok)} | {loads} |")
            continue
        s = summarise(row)
        big = ["–"] * 3
        if row["big"]:
            big = [f"{s['best'][f]:.1f} ({s['median'][f]:.1f}) [{s['worst'][f]:.1f}]"
                   for f in ("algbw", "busbw", "link")]
        small = f"{s['small_us']:.0f}" if s["small_us"] is not None else "–"
        counted = row["big"] or row["small"]        # the floors time the 4 KB call only
        samples = f"{len(counted)}" + (f", {row['failed']} runs failed" if row["failed"] else "")
        lines.append(f"{head} " + " | ".join(big) + f" | {small} | {samples} | {loads} |")
    return "\n".join(lines)


def _median_row(rows: List[dict], hosts: int, config: str) -> Optional[dict]:
    found = [r for r in merge(rows) if r["hosts"] == hosts and r["config"] == config and (r["big"] or r["small"])]
    return summarise(found[0]) if found else None


def ratios(rows: List[dict]) -> List[str]:
    """The figures the many-host work is judged by, from this run's medians (lines of text; none missing silently).

    64 MB with 1 rank per host as a share of the ring bound (algbw <= link x h / (2(h-1)), i.e. busbw over the
    link), against torch Gloo at 1 rank per host on the same hosts, the 4 KB latency at the most hosts over that at
    the fewest (ours, and the plain-Python floors where they ran), and 2 ranks per host hierarchical as a share of
    the link.
    """
    ring, hier, gloo = CONFIGS["ring"][0], CONFIGS["hier"][0], "torch Gloo (torchrun), 1 rank(s)/host"
    counts = sorted({r["hosts"] for r in rows})
    lines = []
    for count in counts:
        ours, theirs, two = (_median_row(rows, count, c) for c in (ring, gloo, hier))
        if ours and "median" in ours:
            lines.append(f"{count} hosts x 1 rank, 64 MB: {ours['median']['link']:.1f}% of the ring bound "
                         f"({ours['median']['algbw']:.1f} MB/s algbw)")
            if theirs and "median" in theirs:
                speedup = ours["median"]["algbw"] / theirs["median"]["algbw"]
                lines.append(f"{count} hosts x 1 rank, 64 MB: {speedup:.2f}x torch Gloo "
                             f"({theirs['median']['algbw']:.1f} MB/s)")
        if two and "median" in two:
            lines.append(f"{count} hosts x 2 ranks hierarchical, 64 MB: {two['median']['link']:.1f}% of the link")
    for label, name in [(ring, "4 KB, 1 rank/host")] + [(text, f"4 KB, {text.split(',')[0]}")
                                                         for _, text in FLOORS.values()]:
        small = {c: (_median_row(rows, c, label) or {}).get("small_us") for c in counts}
        small = {c: v for c, v in small.items() if v}
        if len(small) >= 2:
            lo, hi = min(small), max(small)
            lines.append(f"{name}: {small[hi]:.0f} µs at {hi} hosts / {small[lo]:.0f} µs at {lo} hosts = "
                         f"{small[hi] / small[lo]:.2f}x")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="2,3", help="comma-separated host counts")
    parser.add_argument("--warmup", type=int, default=1, help="64 MB allreduces before timing")
    parser.add_argument("--iters", type=int, default=5, help="timed 64 MB allreduces")
    parser.add_argument("--small-batches", type=int, default=5)
    parser.add_argument("--small-calls", type=int, default=200, help="4 KB allreduces per batch")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help=f"comma-separated, run in this order each round: raw, gloo (gloo1, gloo2: 1 or 2 "
                             f"ranks/host only), pystar, pyrd (plain-Python 4 KB floors), {', '.join(CONFIGS)}; "
                        "ours take +VARIABLE=value suffixes (ring+HOROVOD_TCP_CHUNK_BYTES=0)")
    parser.add_argument("--plan", help="per host count configurations, overriding --hosts and --configs: "
                        "'2:ring;8:ring,gloo1;4:hier'")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the configurations, alternating")
    parser.add_argument("--skip-latency", action="store_true", help="no netem run")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per job")
    parser.add_argument("--json", help="write the raw rows here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows: List[dict] = []
    for count, names in plan(args):
        log.info("%d hosts, load %s", count, load())
        rows += measure_hosts(count, names, args)
        print(table([r for r in rows if r["hosts"] == count]), flush=True)
    print(table(rows))
    print("\n".join(ratios(rows)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("result") or "ceiling" in r or "skipped" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
