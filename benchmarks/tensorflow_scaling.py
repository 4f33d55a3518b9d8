"""TensorFlow 2 scaling benchmark: horovod.tensorflow's synthetic benchmark on 1 and N ranks, in one run.

Runs ``examples/tensorflow2/tensorflow2_synthetic_benchmark.py`` for each model under this project's
``horovodrun`` (``-np 1``, then ``-np N``) with the same model, batch, image size and iteration counts, and prints
each model's throughput and scaling efficiency, throughput(N) / (N x throughput(1)).

Threads are pinned so that the 1-rank and N-rank runs compare: every rank runs TensorFlow with one intra-op and
one inter-op thread (``--num-threads 1 --num-interop-threads 1``; ``OMP_NUM_THREADS=1``). With TensorFlow's
default inter-op pool (one thread per core), a lone rank runs independent ops of the step on every core and the
1-rank figure no longer measures one rank's share of the machine.

    python benchmarks/tensorflow_scaling.py [--np 2] [--models cnn,mlp] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.torch_scaling import (  # noqa: E402
    _run,
    add_scaling_options,
    efficiency,
    horovod_cmd,
    synthetic_args,
)

BENCH = ROOT / "examples" / "tensorflow2" / "tensorflow2_synthetic_benchmark.py"
PINNED = "1 intra-op and 1 inter-op TensorFlow thread per rank, OMP_NUM_THREADS=1"
log = logging.getLogger("benchmarks.tensorflow_scaling")


def synthetic(model: str, np: int, opts: argparse.Namespace, tmp: Path) -> Dict[int, Optional[dict]]:
    """Throughput of one model at 1 and ``np`` ranks (rank 0's JSON of each run, or None if it failed)."""
    common = [*synthetic_args(model, opts), "--num-interop-threads", "1"]
    results: Dict[int, Optional[dict]] = {}
    for n in (1, np):
        out = tmp / f"{model}-{n}.json"
        res = _run(horovod_cmd(n, [str(BENCH), *common, "--json", str(out)]), out, opts.timeout)
        results[n] = res
        if res:
            log.info("  %s np=%d: %.1f img/sec total (per rank %.1f +-%.1f)", model, n, res["total_img_sec"],
                     res["img_sec_mean"], res["img_sec_conf"])
    return results


def report(synth: Dict[str, Dict[int, Optional[dict]]], np: int) -> List[str]:
    """The markdown table of throughput and scaling efficiency, and what was pinned."""
    lines = [f"| model | parameters | 1 rank img/s | {np} ranks img/s (total) | scaling efficiency |",
             "|---|---|---|---|---|"]
    for model, res in synth.items():
        one, many = res.get(1), res.get(np)
        eff = efficiency(res, np)
        params = next((f"{r['parameters'] / 1e6:.2f} M" for r in (one, many) if r), "–")
        cells = [f"{r['total_img_sec']:.1f} +-{r['img_sec_conf'] * r['size']:.1f}" if r else "failed"
                 for r in (one, many)]
        cells.append(f"{100 * eff:.1f}%" if eff is not None else "–")
        lines.append(f"| {model} | {params} | " + " | ".join(cells) + " |")
    lines += ["", f"Threads pinned: {PINNED}. Scaling efficiency = {np}-rank total img/s / ({np} x 1-rank img/s)."]
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # --models: comma-separated cnn, mlp, or keras.applications names (those are slow on CPUs).
    add_scaling_options(parser, "cnn,mlp", warmup=5, batches=10, mlp_batches=50, iters=5)
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        synth = {m: synthetic(m, opts.np, opts, Path(tmp_name)) for m in opts.models.split(",")}
    print()
    print("\n".join(report(synth, opts.np)))
    print(f"\n(total benchmark wall time {time.perf_counter() - start:.0f} s)")
    if opts.json:
        Path(opts.json).write_text(json.dumps({"options": vars(opts), "pinned": PINNED, "synthetic": synth},
                                              indent=1))
    return 0 if all(r.get(opts.np) for r in synth.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
