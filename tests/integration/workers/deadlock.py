"""Worker: the ranks end up waiting on different collectives, a certain deadlock.

Rank 0 fails an assertion between two collectives (as a test body that fails on one rank only) and goes on to the
``barrier`` that ends the test; the other ranks are already in the test's next collective, argv[1]
(``reducescatter`` or ``allreduce``, named ``deadlock.grad``). With argv[2] == ``poll`` every rank waits the way
TF1-graph collectives do: from a second thread, in short timed waits, while the main thread waits for it.

Every rank prints ``BLOCKED`` when it enters its last collective, then ``RESULT <ExceptionType> <elapsed>
<message on one line>`` when that collective fails, and exits non-zero (the job ends). With the deadlock
shutdown disabled the collectives never fail: the test ends the job itself.
"""
import sys
import threading
import time

import numpy as np

import horovod.numpy as hvd
from horovod.core import ops

POLL_SECONDS = 0.01


def collective(kind: str):
    """The handle of this rank's last collective."""
    if hvd.rank() == 0:
        return ops.barrier_async()
    x = np.ones((hvd.size() * 2, 3), np.float32)
    if kind == "reducescatter":
        return ops.reducescatter_async(x, name="deadlock.grad")
    return ops.allreduce_async(x, name="deadlock.grad")


def wait(handle, how: str):
    if how != "poll":
        return handle.wait()
    outcome = {}

    def poller():
        while True:
            try:
                outcome["value"] = handle.wait(timeout=POLL_SECONDS)
                return
            except TimeoutError:
                continue
            except BaseException as exc:  # handed to the main thread
                outcome["error"] = exc
                return

    thread = threading.Thread(target=poller, daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def main() -> int:
    kind, how = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "block"
    hvd.init()
    hvd.allreduce(np.ones(3), name="deadlock.warmup")   # every rank: the job works up to here
    if hvd.rank() == 0:
        try:
            assert hvd.size() < 0, "this rank's check failed"
            hvd.allreduce(np.ones(3), name="deadlock.skipped")
        except AssertionError:
            pass                                         # the test fails here; its teardown runs a barrier
    print("BLOCKED", flush=True)
    start = time.monotonic()
    try:
        wait(collective(kind), how)
    except Exception as exc:  # what the user's program sees
        text = str(exc).replace("\n", " | ")
        print(f"RESULT {type(exc).__name__} {time.monotonic() - start:.1f} {text}", flush=True)
        return 1
    print("RESULT ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
