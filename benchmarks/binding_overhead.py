"""The binding-overhead scripts' shared parts (``torch_overhead.py``, ``jax_overhead.py``, ``mxnet_overhead.py``,
``object_helpers.py``, ``tensorflow_overhead.py``): their command line, which runs a worker of
``benchmarks/workers`` under this project's horovodrun, and the table of the op layer's call against the
binding's that the workers built on ``benchmarks/workers/overhead_rows.py`` write."""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Callable, List, Optional

from benchmarks.torch_scaling import _run, horovod_cmd


def size_label(nbytes: int) -> str:
    """``4 KB``, ``16 MB`` or ``100 B``: a size as the tables print it."""
    for unit, shift in (("MB", 20), ("KB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def overhead_main(argv: Optional[List[str]], doc: str, worker: str, sizes: str, scale: float,
                  report: Callable[[dict], List[str]]) -> int:
    """A binding-overhead script's command line (``--np``, ``--sizes``, ``--scale``, ``--json``, ``--timeout``):
    runs ``worker`` (a module of benchmarks/workers taking OUT.json SIZES SCALE) under horovodrun and prints
    ``report`` of what its rank 0 wrote."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--sizes", default=sizes, help="bytes per tensor, comma-separated")
    parser.add_argument("--scale", type=float, default=scale,
                        help="multiplies the iteration counts of benchmarks/workers/timing.py::iterations")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--timeout", type=float, default=600)
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "overhead.json"
        res = _run(horovod_cmd(opts.np, ["-m", worker, str(out), opts.sizes, str(opts.scale)]), out, opts.timeout)
    if res is None:
        return 1
    print()
    print("\n".join(report(res)))
    if opts.json:
        Path(opts.json).write_text(json.dumps({"options": vars(opts), "results": res}, indent=1))
    return 0


def report(res: dict) -> List[str]:
    """One markdown table: per size and call, the op layer's time, the binding's (``res["binding"]``), and the
    difference."""
    binding = res["binding"]
    lines = [f"{res['size']} ranks; latency per call in µs", "",
             f"| tensor | call | op layer | {binding} | {binding} − op layer |", "|---|---|---|---|---|"]
    for nbytes, rows in res["results"].items():
        for call, got in rows.items():
            ours, theirs = got["ops"] * 1e6, got["binding"] * 1e6
            lines.append(f"| {size_label(int(nbytes))} | {call} | {ours:.1f} | {theirs:.1f} | {theirs - ours:.1f} |")
    return lines
