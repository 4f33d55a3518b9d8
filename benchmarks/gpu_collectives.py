"""GPU figures of issue 33: several ranks on one GPU, CUDA tensors.

Runs ``benchmarks/workers/gpu_bench.py`` under this project's launcher and prints, per allreduce size, the median
time on the CUDA IPC plane, staged through host memory (the path before it), and through torch.distributed Gloo on
the same CUDA tensors, with the ratios; then the step time of a synthetic 9.5 M-parameter MLP (batch 256) with
``hvd.DistributedOptimizer`` on each path against ``DistributedDataParallel`` over Gloo.

    python benchmarks/gpu_collectives.py [--np 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.jobs import run_job  # noqa: E402
from benchmarks.torch_scaling import _env, horovod_cmd  # noqa: E402

log = logging.getLogger("benchmarks.gpu_collectives")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gpu.json"
        code, output = run_job(horovod_cmd(args.np, [str(ROOT / "benchmarks" / "workers" / "gpu_bench.py"), str(out)]),
                               _env(), str(ROOT), 500)
        if code != 0 or not out.exists():
            log.error("the GPU job failed (exit %d):\n%s", code, output[-6000:])
            return 1
        result = json.loads(out.read_text())
    log.info("%d ranks on %s, torch %s", result["ranks"], result["gpu"], result["torch"])
    log.info("%10s %12s %12s %12s %14s %12s", "allreduce", "IPC (us)", "staged (us)", "Gloo (us)", "staged/IPC",
             "Gloo/IPC")
    for row in result["allreduce"]:
        log.info("%10s %12.1f %12.1f %12.1f %14.2f %12.2f", f"{row['bytes'] >> 10} KB", row["ipc_s"] * 1e6,
                 row["staged_s"] * 1e6, row["gloo_s"] * 1e6, row["staged_s"] / row["ipc_s"],
                 row["gloo_s"] / row["ipc_s"])
    steps = result["step_s"]
    log.info("MLP step (%.1f M parameters, batch 256 per rank): ours on IPC %.2f ms, ours staged %.2f ms, "
             "DDP (Gloo) %.2f ms; DDP/ours %.2f", result["params"] / 1e6, steps["hvd_ipc"] * 1e3,
             steps["hvd_staged"] * 1e3, steps["ddp_gloo"] * 1e3, steps["ddp_gloo"] / steps["hvd_ipc"])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
