"""Worker: every rank allreduces ``argv[1]`` MiB float32 tensors, back to back, for ``argv[3]`` seconds, each
started asynchronously and then waited for, as a training step's gradients are (so it goes through the engine's
data plane: a blocking call this large would be a direct fast round, copied by the caller's thread); rank 1
stops itself with SIGSTOP ``argv[2]`` seconds in, from another thread, at a moment when its engine thread waits
for a peer early inside a collective (as a debugger attaching, or a wedged driver, would stop it). With small chunks
(HOROVOD_SHM_CHUNK_BYTES, HOROVOD_TCP_CHUNK_BYTES) a collective has hundreds of such waits, so the others are
all but sure to wait for it in the data plane, not between collectives. In the shm plane that needs a tensor below
``horovod.backends.shm.DIRECT_ALLREDUCE_BYTES`` (:data:`tests.support.freeze.CHUNKED_MIB`): from there an allreduce
is direct, with two waits, and a rank stopped in the last one has already told the others to go on. Before it stops, rank 1 writes "<wall time> <pid>" to
``$STOP_FILE``. With a negative ``argv[2]`` nothing stops (the test cuts a host off instead); rank 0 creates
``$STREAMING_FILE`` once the stream is under way.

Every rank but the stopped one prints ``RESULT ok <steps>`` or ``RESULT <ExceptionType> <seconds since the stop>
<message on one line>``, and raises the exception again, so that the launcher ends the job.
"""
import os
import signal
import sys
import threading
import time

import numpy as np

import horovod.numpy as hvd
from horovod.backends import peer_waits
from horovod.core import basics

hvd.init()
mib, stop_after, seconds = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
x = np.ones(int(mib * (1 << 20)) // 4, np.float32)
stop_file = os.environ.get("STOP_FILE", "")


durations = []      # seconds per step, measured by the main loop


def early_inside_the_data_plane(limit: float) -> bool:
    """Whether this rank's engine thread is waiting for a peer in the data plane right now, in a collective that
    has run less than ``limit`` seconds. Early on, the other ranks still need this rank's data: on a ring, a wait
    near the end of the collective comes after this rank sent all it had, and the others could finish without it
    (then negotiation, not the data plane, would wait for it)."""
    engine = basics.engine()
    running = engine.running
    if running is None or time.monotonic() - running[1] > limit:
        return False
    return any(ident == engine.thread_ident for ident, _ in peer_waits.snapshot())


def stop_myself() -> None:
    time.sleep(stop_after)
    while len(durations) < 3:
        time.sleep(0.01)
    limit = 0.25 * sorted(durations)[len(durations) // 2]      # a quarter of the median step
    while not early_inside_the_data_plane(limit):      # land early inside a collective, not between two
        time.sleep(0.0005)
    with open(stop_file, "w") as f:
        f.write(f"{time.time()!r} {os.getpid()}")
    os.kill(os.getpid(), signal.SIGSTOP)


if hvd.rank() == 1 and stop_after >= 0:
    threading.Thread(target=stop_myself, daemon=True).start()
# Every rank runs the same number of steps: rank 0 decides when to stop, and says so in each step's sum.
step, go = 0, True
try:
    start = time.time()
    while go:
        x[0] = 1.0 if hvd.rank() != 0 or time.time() - start < seconds else -1e9
        began = time.monotonic()
        go = bool(hvd.synchronize(hvd.allreduce_async(x, name=f"stream.{step % 4}", op=hvd.Sum))[0] > 0)
        durations.append(time.monotonic() - began)
        step += 1
        if step == 3 and hvd.rank() == 0 and os.environ.get("STREAMING_FILE"):
            open(os.environ["STREAMING_FILE"], "w").close()     # the stream is under way
    print(f"RESULT ok {step}", flush=True)
except Exception as exc:  # what the user's program would see
    stopped = float(open(stop_file).read().split()[0]) if os.path.exists(stop_file) else float("nan")
    text = str(exc).replace("\n", " | ")
    print(f"RESULT {type(exc).__name__} {time.time() - stopped:.1f} {text}", flush=True)
    raise
