"""The ResNet-18-sized step of ``torch_hvd_step.py`` (53 torch gradients, 46 MB), with the flight recorder turned
off and on between blocks of steps inside one job: every rank drops its engine's ring (``Engine.flight_ring``, what
``HOROVOD_FLIGHT_RECORDER_SIZE=0`` leaves out) and takes it back at the same block, so both sides share the
process, its memory and the machine's drift. Run under horovodrun with the recorder on (the default). Writes
``{"off": [...], "on": [...]}`` (seconds per step of each block, in pairs) and the same in CPU time of rank 0's
process (every thread: the callers' and the engine's), ``cpu_off`` and ``cpu_on``, from rank 0. CPU time hardly
moves when other jobs take the machine's cores, wall time does."""
from __future__ import annotations

import sys
import time

import torch

import horovod.torch as hvd
from benchmarks.workers.timing import resnet18_shapes, write
from horovod.core import basics


def main(out: str, pairs: int, steps: int) -> None:
    torch.set_num_threads(1)
    hvd.init()
    engine = basics.engine()
    ring = engine.flight_ring
    assert ring is not None, "run with the flight recorder on (HOROVOD_FLIGHT_RECORDER_SIZE > 0)"
    grads = [torch.ones(s, dtype=torch.float32) for s in resnet18_shapes()]

    def step() -> None:
        handles = [hvd.allreduce_async_(g, name=f"step.{i}", op=hvd.Average) for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    def block(on: bool):
        hvd.barrier()
        engine.flight_ring = ring if on else None
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        elapsed, used = (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps
        engine.flight_ring = ring
        return elapsed, used

    for _ in range(3):
        step()
    rows = {"off": [], "on": [], "cpu_off": [], "cpu_on": [], "steps_per_block": steps, "size": hvd.size()}
    for pair in range(pairs):
        for on in ((False, True) if pair % 2 == 0 else (True, False)):     # ABBA: no side always goes first
            side = "on" if on else "off"
            elapsed, used = block(on)
            rows[side].append(elapsed)
            rows["cpu_" + side].append(used)
    if hvd.rank() == 0:
        write(out, rows)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
