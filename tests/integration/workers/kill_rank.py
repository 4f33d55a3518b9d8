"""Worker: every rank loops allreduces; rank 1 SIGKILLs itself after a few iterations.

Rank 1 writes the time of its death to $KILL_FILE first. Every survivor records how long after the kill its
pending allreduce failed, and the error, in $RESULT_DIR/rank.<r>.json (and prints them), then re-raises.
Survivors ignore SIGTERM so that the launcher's fail-fast cannot cut the measurement short (it SIGKILLs them
after its grace period anyway).
"""
import json
import os
import signal
import time

import numpy as np

import horovod.numpy as hvd

hvd.init()
rank = hvd.rank()
kill_file = os.environ["KILL_FILE"]
result_dir = os.environ["RESULT_DIR"]
if rank != 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
x = np.ones(1000, np.float32)
try:
    for i in range(100000):
        if rank == 1 and i == 20:
            with open(kill_file + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.replace(kill_file + ".tmp", kill_file)
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(x, op=hvd.Sum, name="loop")
        # A mix of sizes so that ranks are caught in different places (negotiation, small and large data).
        if i % 3 == 0:
            hvd.allreduce(np.ones(300_000, np.float32), op=hvd.Sum, name="big")
    raise SystemExit("rank 1 never died")
except hvd.HorovodInternalError as exc:
    failed_at = time.time()
    deadline = failed_at + 5
    while not os.path.exists(kill_file) and time.time() < deadline:
        time.sleep(0.01)
    with open(kill_file) as f:
        killed_at = float(f.read())
    report = {"rank": rank, "elapsed": failed_at - killed_at, "type": type(exc).__name__, "message": str(exc)}
    with open(os.path.join(result_dir, f"rank.{rank}.json.tmp"), "w") as f:
        json.dump(report, f)
    os.replace(os.path.join(result_dir, f"rank.{rank}.json.tmp"), os.path.join(result_dir, f"rank.{rank}.json"))
    print("SURVIVOR", json.dumps(report), flush=True)
    # Later calls fail at once with the same kind of error instead of hanging.
    try:
        hvd.allreduce(x, name="after")
    except hvd.HorovodInternalError:
        print("LATER_CALL_FAILS_FAST", flush=True)
    raise
