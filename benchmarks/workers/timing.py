"""Shared timing loop for the collective benchmarks: every peer is measured the same way."""
from __future__ import annotations

import json
import time
from typing import Callable, Dict, List

SIZES = [4, 64, 1024, 4096, 16 * 1024, 64 * 1024, 256 * 1024, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
OPS = ["allreduce", "allgather", "broadcast"]
STEP_SHAPES: List[tuple] = []


def iterations(nbytes: int) -> int:
    """Enough repetitions for a stable figure without making the run long."""
    if nbytes <= 64 * 1024:
        return 2000
    if nbytes <= 1 << 20:
        return 300
    if nbytes <= 16 << 20:
        return 30
    return 6


def measure(run: Callable[[], None], barrier: Callable[[], None], n: int, repeats: int = 3) -> float:
    """Median over ``repeats`` of the mean time per call over ``n`` calls (seconds), after a warm-up."""
    for _ in range(max(3, n // 10)):
        run()
    samples = []
    for _ in range(repeats):
        barrier()
        start = time.perf_counter()
        for _ in range(n):
            run()
        samples.append((time.perf_counter() - start) / n)
    samples.sort()
    return samples[len(samples) // 2]


def sweep(peer: str, sizes, make_runs: Callable[[int], Dict[str, Callable[[], None]]],
          barrier: Callable[[], None], rank: int, size: int) -> Dict:
    """Time every op at every size with the same loop for every peer; rank 0 prints a line per size."""
    rows: Dict = {"peer": peer, "size": size, "results": {}}
    for nbytes in sizes:
        runs = make_runs(nbytes)
        for op in OPS:
            rows["results"].setdefault(op, {})[str(nbytes)] = measure(runs[op], barrier, iterations(nbytes))
        if rank == 0:
            print(f"{peer:<10} {nbytes:>10d} B  " + "  ".join(
                f"{op} {rows['results'][op][str(nbytes)] * 1e6:9.1f} us" for op in OPS), flush=True)
    return rows


def resnet18_shapes() -> List[tuple]:
    """ResNet-18's trainable parameter shapes without the three downsample branches: 53 tensors, 46 MB."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes in (64, 128, 256, 512):
        for block in range(2):
            cin = inplanes if block == 0 else planes
            shapes += [(planes, cin, 3, 3), (planes,), (planes,), (planes, planes, 3, 3), (planes,), (planes,)]
        inplanes = planes
    shapes += [(1000, 512), (1000,)]
    return shapes


def write(path: str, rows: Dict) -> None:
    with open(path, "w") as f:
        json.dump(rows, f)
