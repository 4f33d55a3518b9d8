"""What ``python -m horovod.bench`` prints and writes: nccl-tests' columns (size, count, type, time, algbw,
busbw) per op, one block of columns per peer, and each peer's time against this project's."""
from __future__ import annotations

from typing import Dict, List, Optional

# busbw = algbw x this factor (nccl-tests' PERFORMANCE.md): the bytes each rank's link carries, per byte of op.
BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}

# results[peer][op][nbytes] = seconds per call (None: the peer lacks the op)
Results = Dict[str, Dict[str, Dict[int, Optional[float]]]]


def parse_size(text: str) -> int:
    """``4096``, ``4K``, ``64M``, ``1G`` (powers of 1024) as bytes."""
    text = text.strip().upper().rstrip("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def sizes_between(low: int, high: int, factor: int) -> List[int]:
    """nccl-tests' ``-b low -e high -f factor``: low, low x factor, ... up to high."""
    if low <= 0 or factor < 2 or high < low:
        raise ValueError("need 0 < minbytes <= maxbytes and a step factor of at least 2")
    sizes = [low]
    while sizes[-1] * factor <= high:
        sizes.append(sizes[-1] * factor)
    return sizes


def columns(nbytes: int, seconds: Optional[float], op: str, n: int) -> List[str]:
    """time (µs), algbw and busbw (GB/s) of one measurement, or dashes."""
    if seconds is None:
        return ["-", "-", "-"]
    algbw = nbytes / seconds / 1e9
    return [f"{seconds * 1e6:.1f}", f"{algbw:.3f}", f"{algbw * BUS_FACTOR[op](n):.3f}"]


def table(results: Results, n: int) -> str:
    """One block per op: a row per size with every peer's time, algbw and busbw, then each other peer's time
    over this project's (below 1: this project is slower)."""
    peers = list(results)
    others = [p for p in peers if p != "horovod"] if "horovod" in peers else []
    lines: List[str] = []
    for op in dict.fromkeys(op for p in peers for op in results[p]):
        lines.append(f"# {op}, {n} ranks, float32 (time in us, algbw and busbw in GB/s)")
        head = f"{'size':>12} {'count':>11} {'type':>7}"
        for p in peers:
            head += f" {p + ' time':>14} {'algbw':>8} {'busbw':>8}"
        head += "".join(f" {p + '/ours':>12}" for p in others)
        lines.append(head)
        for nbytes in sorted({s for p in peers for s in results[p].get(op, {})}):
            row = f"{nbytes:>12} {max(1, nbytes // 4):>11} {'float':>7}"
            for p in peers:
                cells = columns(nbytes, results[p].get(op, {}).get(nbytes), op, n)
                row += f" {cells[0]:>14} {cells[1]:>8} {cells[2]:>8}"
            ours = results["horovod"].get(op, {}).get(nbytes) if others else None
            for p in others:
                theirs = results[p].get(op, {}).get(nbytes)
                row += f" {theirs / ours:>12.2f}" if ours and theirs else f" {'-':>12}"
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


def as_json(results: Results, n: int) -> dict:
    """The raw figures: per peer, op and size, seconds per call, algbw and busbw."""
    return {"ranks": n, "results": {
        peer: {op: {str(nbytes): None if t is None else {
            "seconds": t, "algbw_GBps": nbytes / t / 1e9, "busbw_GBps": nbytes / t / 1e9 * BUS_FACTOR[op](n)}
            for nbytes, t in by_size.items()} for op, by_size in by_op.items()}
        for peer, by_op in results.items()}}


def plot(results: Results, path: str, n: int) -> None:
    """algbw against size, one log-log panel per op, a line per peer (needs matplotlib)."""
    from horovod.bench.plot import algbw_panels

    ops = list(dict.fromkeys(op for p in results for op in results[p]))
    series = {op: [(peer, [(s, s / t / 1e9) for s, t in results[peer].get(op, {}).items() if t], {})
                   for peer in results] for op in ops}
    algbw_panels(series, path, f"{n} ranks")
