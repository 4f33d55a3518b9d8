"""Worker for the flight recorder's tests: every rank runs the same few collectives, then one rank misbehaves.

``flight.py stall R``: rank R sleeps instead of submitting the next allreduce (``allreduce.step.late``), so the
stall inspector (with a shutdown time) ends the job; the error is not caught, so the others exit non-zero.
``flight.py kill R MARKS``: rank R kills itself (SIGKILL) instead of submitting it. It waits first until every other
rank has submitted that allreduce (each marks it with a file in the folder MARKS), so that the kill never races a
survivor's last completed collective and the records always diverge at the same place.
``flight.py wait STOPFILE``: every rank prints ``READY <pid>`` and idles (in Python) until STOPFILE exists, then
runs one more allreduce and exits 0 (the test sends SIGUSR1 meanwhile).
"""
import os
import signal
import sys
import time

import numpy as np

import horovod.numpy as hvd


def common_steps() -> None:
    for step in range(4):
        hvd.allreduce(np.full(3, float(step)), name=f"step.{step}")
    hvd.broadcast(np.zeros(2), 0, name="params")
    hvd.allgather(np.ones((1, 2)), name="gathered")


def idle_until(path: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    mode, arg = sys.argv[1], sys.argv[2]
    hvd.init()
    common_steps()
    if mode == "wait":
        print(f"READY {os.getpid()}", flush=True)
        idle_until(arg)
        hvd.allreduce(np.ones(1), name="after.signal")
        return
    misbehaving = int(arg)
    marks = sys.argv[3] if mode == "kill" else None
    if hvd.rank() == misbehaving:
        if marks:
            wait_for_marks(marks, hvd.size() - 1)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)                      # the stall shutdown ends the job long before this
    handle = hvd.allreduce_async(np.ones(3), name="step.late")
    if marks:
        with open(os.path.join(marks, f"rank.{hvd.rank()}"), "w"):
            pass
    hvd.synchronize(handle)


def wait_for_marks(folder: str, count: int, limit: float = 60.0) -> None:
    """Waits until ``count`` ranks have marked in ``folder`` that they submitted the late allreduce."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and (not os.path.isdir(folder) or len(os.listdir(folder)) < count):
        time.sleep(0.01)


if __name__ == "__main__":
    main()
