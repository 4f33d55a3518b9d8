"""What the live page costs a rank: the heartbeat thread's work per beat, as a share of one second.

The live page (``horovodrun --monitor-port``) adds nothing to the engine's path: the rank's heartbeat thread reads
the running totals (collectives and bytes done, the last completed sequence number) from the flight rings once a
second (``horovod.core.observers.heartbeat.Totals``) and puts one packed record into the rendezvous store. This
script times that work on the heartbeat's own code, at the rate of collectives a ResNet-18-sized step makes (53
gradients a step) and at a higher one, and prints the seconds of GIL-holding work per second of training: the
most a beat can delay the training thread. The end-to-end A/B is ``benchmarks/ab_step.py --env-b
HOROVOD_MONITOR_PORT=0``, whose noise on this machine is far above 1 %.

    python benchmarks/heartbeat_totals.py [--steps-per-s 20,100] [--beats 200]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from horovod.common import wire  # noqa: E402
from horovod.common.types import RequestType  # noqa: E402
from horovod.core.engine import flight  # noqa: E402
from horovod.core.observers import heartbeat  # noqa: E402

GRADIENTS = 53          # ResNet-18's gradient tensors: one collective each per step


def one_beat(totals: heartbeat.Totals, ring: flight.FlightRing, per_beat: int) -> float:
    """Seconds the heartbeat spends on one beat after ``per_beat`` collectives completed: the totals, and the
    record it packs for the store (the put itself is one small message on a socket)."""
    request = SimpleNamespace(request_type=RequestType.ALLREDUCE, tensor_name="grad")
    now = time.time()
    entries = [SimpleNamespace(request=request, tensor=SimpleNamespace(nbytes=1 << 20)) for _ in range(per_beat)]
    ring.submit(entries, now)
    for entry in entries:
        entry.flight[flight.DONE] = now
    start = time.perf_counter()
    status = totals.update()
    wire.pack({"t": now, "host": "h", "pid": 1, "addr": "127.0.0.1", **status})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps-per-s", default="20,100", help="training steps per second to simulate")
    parser.add_argument("--beats", type=int, default=200)
    args = parser.parse_args()
    print(f"{'steps/s':>8} {'collectives/beat':>17} {'median us/beat':>15} {'p99 us/beat':>12} {'share of 1 s':>13}")
    for rate in (float(r) for r in args.steps_per_s.split(",")):
        per_beat = int(rate * GRADIENTS)
        ring = flight.FlightRing(2000, 0, [0, 1], 0, lambda rtype, nbytes: "shm")
        totals = heartbeat.Totals()
        samples = sorted(one_beat(totals, ring, per_beat) for _ in range(args.beats))
        median = statistics.median(samples)
        p99 = samples[int(0.99 * (len(samples) - 1))]
        print(f"{rate:>8g} {per_beat:>17d} {median * 1e6:>15.1f} {p99 * 1e6:>12.1f} {median:>12.4%}")


if __name__ == "__main__":
    main()
