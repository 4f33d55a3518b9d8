"""The command line of ``python -m horovod.bench`` (see :mod:`horovod.bench`): parse, time every op at every size
for every peer in turn, and let rank 0 print the table and write the JSON and the plot."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import List, Optional

from horovod.bench import peers as peer_lib
from horovod.bench import report
from horovod.bench.timing import iterations, measure, measure_within

log = logging.getLogger(__name__)

DEFAULT_OPS = "allreduce,allgather,broadcast,reducescatter"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m horovod.bench",
        description="Collective latency and bandwidth on this job's ranks (run it under horovodrun), in "
                    "nccl-tests' columns; optionally against mpi4py and torch.distributed Gloo in the same run.")
    parser.add_argument("--ops", default=DEFAULT_OPS,
                        help=f"comma-separated, from {', '.join(peer_lib.OPS)} (default: {DEFAULT_OPS})")
    parser.add_argument("-b", "--minbytes", default="4K", help="smallest message size (default 4K)")
    parser.add_argument("-e", "--maxbytes", default="64M", help="largest message size (default 64M)")
    parser.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier between rows (default 4)")
    parser.add_argument("--sizes", help="comma-separated sizes instead of -b/-e/-f (e.g. 4K,1M,64M)")
    parser.add_argument("--peers", default="horovod",
                        help="comma-separated, from horovod, mpi4py (needs horovodrun --mpi or mpirun), gloo "
                             "(needs torch); default: horovod")
    parser.add_argument("-n", "--iters", type=int, default=0,
                        help="calls per timed repeat (default: by size, 2000 for small messages down to 6)")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds per op, size and peer: as many calls as fit (instead of --iters)")
    parser.add_argument("--json", help="rank 0 writes the raw figures here")
    parser.add_argument("--plot", help="rank 0 draws algbw against size here (PNG; needs matplotlib)")
    args = parser.parse_args(argv)
    args.ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = sorted(set(args.ops) - set(peer_lib.OPS))
    if unknown:
        parser.error(f"unknown op(s) {', '.join(unknown)}: choose from {', '.join(peer_lib.OPS)}")
    try:
        args.sizes = ([report.parse_size(s) for s in args.sizes.split(",")] if args.sizes else
                      report.sizes_between(report.parse_size(args.minbytes), report.parse_size(args.maxbytes),
                                           args.stepfactor))
    except ValueError as exc:
        parser.error(str(exc))
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    return args


def time_one(peer: peer_lib.Peer, op: str, nbytes: int, args: argparse.Namespace) -> Optional[float]:
    """Seconds per call of ``op`` at ``nbytes`` on ``peer``, or None when the peer lacks it."""
    run = peer.runs(op, nbytes)
    if run is None:
        return None
    if args.budget > 0:
        return measure_within(run, peer.barrier, args.iters or iterations(nbytes), args.budget, peer.agree)[0]
    return measure(run, peer.barrier, args.iters or iterations(nbytes))


def sweep(peers: List[peer_lib.Peer], args: argparse.Namespace) -> report.Results:
    """Every op at every size for every peer, the peers in turn for each (op, size)."""
    results: report.Results = {p.name: {op: {} for op in args.ops} for p in peers}
    lead = peers[0]
    for nbytes in args.sizes:
        started = time.perf_counter()
        for op in args.ops:
            for peer in peers:
                results[peer.name][op][nbytes] = time_one(peer, op, nbytes, args)
        if lead.rank == 0:
            log.info("%d bytes done in %.1f s", nbytes, time.perf_counter() - started)
    return results


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    peers = peer_lib.open_peers(args.peers)
    if not peers:
        log.error("no peer to time: pass --peers horovod (the default) or one whose library is here")
        return 2
    try:
        results = sweep(peers, args)
    finally:
        for peer in reversed(peers):
            peer.close()
    if peers[0].rank == 0:
        n = peers[0].size
        sys.stdout.write(report.table(results, n) + "\n")
        sys.stdout.flush()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report.as_json(results, n), f, indent=1)
        if args.plot:
            report.plot(results, args.plot, n)
    return 0
