"""A/B of a fast-round setting inside one job: each op and size timed with the setting as it is (A) and changed
(B), alternated in lockstep on every rank, so that the VM's drift between runs (which moves a small op's time by
20 % or more from one job to the next) hits both sides alike.

A setting is a module-level name of :mod:`horovod.core.engine.fast_rounds` (``fast_rounds.``),
:mod:`horovod.backends.cma` (``cma.``) or the shm data plane, :mod:`horovod.backends.shm` (``shm.``: with
``HOROVOD_FAST_ROUNDS=0`` every op goes through it), optionally one entry of a dict keyed by request type, and a value; a
function is replaced by one that returns the value. The rounds' kept keys are dropped at every switch, so a
changed threshold takes effect at once. Run it under ``horovodrun``; rank 0 prints, per op and size, the median
time per call (µs) of each side, how many calls went direct (by cross-memory copies), and B / A:

    horovodrun -np 2 python benchmarks/fast_round_ab.py --set fast_rounds.YIELD_SECONDS=0 --sizes 4K,64K,1M
    horovodrun -np 2 python benchmarks/fast_round_ab.py --set 'fast_rounds.DIRECT_FROM[BROADCAST]=65536' \\
        --ops broadcast --sizes 64K,96K,128K
    horovodrun -np 2 python benchmarks/fast_round_ab.py --set cma.root_share=0 --ops broadcast   # reader-only
    HOROVOD_FAST_ROUNDS=0 horovodrun -np 2 python benchmarks/fast_round_ab.py \
        --set 'shm.DIRECT_ALLGATHER_BYTES=(4194304, 1073741824)' --ops allgather --sizes 64M,256M
"""
from __future__ import annotations

import argparse
import ast
import re
import statistics
import time
from typing import Callable, Dict, List, Tuple

from horovod.backends import cma, shm
from horovod.bench.peers import HorovodPeer
from horovod.common.types import RequestType
from horovod.core import basics
from horovod.core.engine import fast_rounds

MODULES = {"fast_rounds": fast_rounds, "cma": cma, "shm": shm}
SETTING = re.compile(r"^(\w+)\.(\w+)(?:\[(\w+)\])?=(.+)$")
SWITCHES = 14            # 7 timed blocks per side
WARM_CALLS = 20          # after each switch, untimed


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def setting(text: str) -> Tuple[Callable[[], None], Callable[[], None]]:
    """(apply, restore) for ``module.NAME=value`` or ``module.NAME[REQUEST_TYPE]=value``."""
    match = SETTING.match(text)
    if match is None or match.group(1) not in MODULES:
        raise SystemExit(f"--set {text!r}: expected MODULE.NAME=VALUE or MODULE.NAME[TYPE]=VALUE, "
                         f"MODULE one of {', '.join(MODULES)}")
    module, name, entry, raw = MODULES[match.group(1)], match.group(2), match.group(3), match.group(4)
    if not hasattr(module, name):
        raise SystemExit(f"--set {text!r}: {module.__name__} has no {name}")
    value = ast.literal_eval(raw)
    original = getattr(module, name)
    if entry is not None:
        changed = dict(original)
        changed[RequestType[entry]] = value
    elif callable(original):
        def changed(*args, **kwargs):
            return value
    else:
        changed = value
    return (lambda: setattr(module, name, changed)), (lambda: setattr(module, name, original))


def _direct_rounds(rounds) -> int:
    """Direct rounds run so far on this rank (none without fast rounds)."""
    return rounds.direct if rounds is not None else 0


def compare(peer: HorovodPeer, op: str, nbytes: int, apply: Callable[[], None],
            restore: Callable[[], None]) -> Dict[str, float]:
    """Medians (µs per call) and direct-round counts of side A (as it is) and B (changed) for one op and size."""
    run = peer.runs(op, nbytes)
    rounds = basics.engine_for(None).fast
    calls = 400 if nbytes <= 64 << 10 else 150 if nbytes <= 1 << 20 else 30
    times: List[List[float]] = [[], []]
    direct = [0, 0]
    for switch in range(SWITCHES):
        side = switch % 2
        (apply if side else restore)()
        if rounds is not None:
            rounds.forget_keys()
        peer.barrier()
        for _ in range(WARM_CALLS):
            run()
        before = _direct_rounds(rounds)
        start = time.perf_counter()
        for _ in range(calls):
            run()
        times[side].append((time.perf_counter() - start) / calls * 1e6)
        direct[side] += _direct_rounds(rounds) - before
    restore()
    a, b = statistics.median(times[0]), statistics.median(times[1])
    return {"a": a, "b": b, "direct_a": direct[0], "direct_b": direct[1], "ratio": b / a}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", required=True, dest="change", help="the setting side B changes (see above)")
    parser.add_argument("--ops", default="allreduce,allgather,broadcast,reducescatter")
    parser.add_argument("--sizes", default="4K,64K,256K,1M", help="bytes, as horovod.bench counts them")
    args = parser.parse_args()
    apply, restore = setting(args.change)
    peer = HorovodPeer()
    if peer.rank == 0:
        print(f"# {args.change} (B) against as it is (A), {peer.size} ranks; µs per call, medians of "
              f"{SWITCHES // 2} blocks per side")
        print("| op | size | A | B | direct calls A / B | B / A |")
        print("|---|---|---|---|---|---|")
    for op in args.ops.split(","):
        for size in args.sizes.split(","):
            nbytes = parse_size(size)
            got = compare(peer, op, nbytes, apply, restore)
            if peer.rank == 0:
                print(f"| {op} | {size} | {got['a']:.1f} | {got['b']:.1f} | {got['direct_a']} / {got['direct_b']} "
                      f"| {got['ratio']:.2f} |", flush=True)
    peer.close()


if __name__ == "__main__":
    main()
