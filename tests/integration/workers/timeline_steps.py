"""Worker: a few training-like steps (fused allreduces, an allgather, a broadcast) with a timeline recording.

Mode ``static`` (HOROVOD_TIMELINE=<file> set by the test): rank 0 parses the live file in the middle of the
run and prints ``MIDRUN <events> <names>``. Mode ``dynamic`` (HOROVOD_TIMELINE=DYNAMIC): steps before, between
and after two recordings, to files argv[2] and argv[3], each with its own tensor names.
"""
import json
import sys
import time

import numpy as np

import horovod.numpy as hvd

mode = sys.argv[1]
hvd.init()


def step(prefix: str) -> None:
    handles = [hvd.allreduce_async(np.ones(256 * (i + 1), np.float32), name=f"{prefix}.grad.{i}") for i in range(3)]
    for handle in handles:
        hvd.synchronize(handle)
    hvd.allgather(np.ones((hvd.rank() + 1, 2), np.float32), name=f"{prefix}.gather")
    hvd.broadcast(np.arange(4, dtype=np.float64), root_rank=0, name=f"{prefix}.bcast")


def stopped(prefix: str) -> None:
    """Hold every rank until rank 0 has stopped recording. Without it, another rank could finish the last step
    before rank 0's user thread calls stop_timeline() and submit its next tensors, whose negotiation rank 0's
    coordinator would then rightly record into the file being stopped. This collective itself may or may not
    be recorded (it is named for the recording it ends)."""
    hvd.allreduce(np.zeros(1, np.float32), name=f"{prefix}.stopped")


if mode == "static":
    for i in range(6):
        step("train")
        if i == 2 and hvd.rank() == 0:
            time.sleep(0.6)                 # the writer flushes every 0.2 s
            with open(sys.argv[2]) as f:
                events = json.load(f)       # valid JSON while the job still runs
            names = sorted({e["args"]["name"] for e in events if e.get("name") == "process_name"})
            print("MIDRUN", len(events), ",".join(names), flush=True)
else:
    step("before")
    hvd.start_timeline(sys.argv[2])
    step("first")
    hvd.stop_timeline()
    stopped("first")
    step("between")
    hvd.start_timeline(sys.argv[3], mark_cycles=True)
    step("second")
    hvd.stop_timeline()
    stopped("second")
    step("after")
print("DONE", flush=True)
hvd.shutdown()
