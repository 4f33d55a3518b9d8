"""Timeline overhead: the PyTorch synthetic benchmark at N ranks with and without HOROVOD_TIMELINE, in one run.

Runs ``examples/pytorch/pytorch_synthetic_benchmark.py`` under this project's ``horovodrun``, alternating
without and with a timeline (off, on, off, on, ... so that drift in the machine hits both alike), and prints
each run's throughput, the mean of each side and the overhead: 1 - throughput(on) / throughput(off). It then
summarizes the last recorded timeline with ``python -m horovod.timeline summary`` (the report tool).

    python benchmarks/timeline_overhead.py [--np 2] [--model resnet] [--rounds 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.torch_scaling import BENCH, _env, _run, horovod_cmd  # noqa: E402

log = logging.getLogger("benchmarks.timeline_overhead")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--model", default="resnet", choices=["resnet", "mlp"])
    parser.add_argument("--rounds", type=int, default=2, help="pairs of (off, on) runs")
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--json", help="write the numbers here")
    parser.add_argument("--keep-timeline", help="copy the last recorded timeline here")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    runs = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        timeline = Path(tmp) / "timeline.json"
        for i in range(args.rounds):
            for side in ("off", "on"):
                out = Path(tmp) / f"{side}{i}.json"
                bench = [str(BENCH), "--model", args.model, "--num-iters", str(args.num_iters), "--json", str(out)]
                env_args = ["--timeline-filename", str(timeline)] if side == "on" else []
                cmd = horovod_cmd(args.np, bench)
                cmd[3:3] = env_args                 # horovodrun flags go before the command
                result = _run(cmd, out, args.timeout)
                if result is None:
                    return 1
                runs[side].append(result["total_img_sec"])
                log.info("%s run %d: %.1f img/sec", side, i + 1, result["total_img_sec"])
        off, on = sum(runs["off"]) / len(runs["off"]), sum(runs["on"]) / len(runs["on"])
        overhead = 1 - on / off
        events = json.loads(timeline.read_text())
        print(f"\nsynthetic benchmark ({args.model}, {args.np} ranks): without timeline {off:.1f} img/sec "
              f"(runs {', '.join(f'{x:.1f}' for x in runs['off'])}), with timeline {on:.1f} img/sec "
              f"(runs {', '.join(f'{x:.1f}' for x in runs['on'])})")
        print(f"timeline overhead: {overhead * 100:.1f}% of step time (target <= 5%); the last timeline has "
              f"{len(events)} events, {timeline.stat().st_size / 1e6:.1f} MB\n")
        report = subprocess.run([sys.executable, "-m", "horovod.timeline", "summary", str(timeline), "--top", "5"],
                                env=_env(), cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        print(report.stdout)
        if args.keep_timeline:
            shutil.copy(timeline, args.keep_timeline)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "np": args.np, "runs": runs, "off": off,
                                               "on": on, "overhead": overhead}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
