"""What every rank's heartbeat says, and where in the job's rendezvous store it says it.

The ranks write (``horovod.core.observers.heartbeat``); the launcher's live page reads
(``horovod.runner.monitor``). The runner may not import the library's core, so the scope names, the record's field
names and the wording both sides show live here, in the shared ground.

A heartbeat is a msgpack map under :data:`BEAT_SCOPE`, key ``<global rank>``, put once every
:data:`BEAT_SECONDS`. A rank's latest stall, deadlock or data-plane report is a map under :data:`REPORT_SCOPE`,
same key. A stack request is the asker's id under :data:`ASK_SCOPE` (key ``<rank>``); the rank answers under
:data:`STACK_SCOPE`, key :func:`stack_key`.
"""
from __future__ import annotations

from typing import Optional

BEAT_SCOPE, ASK_SCOPE, STACK_SCOPE = "horovod-heartbeat", "horovod-stack-ask", "horovod-stack"
REPORT_SCOPE = "horovod-reports"
BEAT_SECONDS = 1.0
STALE_SECONDS = 3 * BEAT_SECONDS        # a heartbeat older than this says the rank (or its host) does not answer
REPORT_MAX_CHARS = 20000                # a report is cut to this length in the store

# The heartbeat record's fields.
T = "t"                         # wall time of the beat (the rank's clock)
HOST = "host"
PID = "pid"
ADDR = "addr"                   # the address this rank reaches the launcher from
RUNNING = "running"             # the collective its engine runs, in words ("ALLREDUCE of tensor 'x'"), if any
RUNNING_S = "running_s"         # ... for how long
WAITING_FOR = "waiting_for"     # the rank it waits for in the data plane, if any
WAITING_S = "waiting_s"         # ... for how long (since the last byte from it)
NEGOTIATING = "negotiating"     # rank 0 (a set's coordinator): the oldest tensor some ranks have not submitted
NEGOTIATING_S = "negotiating_s"     # ... for how long it has been pending
MISSING = "missing"             # ... the global ranks that have not submitted it
SUBMITTED = "seq"               # collectives submitted to the global process set (its flight ring's count)
LAST_DONE = "done_seq"          # the global process set's last completed sequence number
DONE = "done"                   # collectives completed so far, every process set (a running total)
DONE_BYTES = "bytes"            # their bytes (a running total)

# A report record's fields (besides T).
KIND = "kind"                   # "data-plane stall", "stall", "stall shutdown", "deadlock", ...
TEXT = "text"
RANK = "rank"


def stack_key(rank: int, ask: str) -> str:
    """The key of rank ``rank``'s answer to the stack request ``ask``."""
    return f"{rank}/{ask}"


def stack_text(rank: int, stack: Optional[str], timeout: float) -> str:
    """Rank ``rank``'s stack as a report shows it, or why none came within ``timeout`` s (``stack`` empty or None)."""
    if stack:
        return f"Rank {rank}'s Python stack (every thread, the program's own first):\n{stack}"
    return (f"No Python stack from rank {rank} within {timeout:g} s: its heartbeat thread did not answer (stopped, "
            "native code holding the GIL, or its host is gone).")


def no_store_text(rank: int, reason: Optional[str] = None) -> str:
    """Why no stack could be asked of rank ``rank``: the store cannot be reached (``reason``), or there is none."""
    if reason is not None:
        return f"No Python stack from rank {rank}: the rendezvous store cannot be reached ({reason})."
    return (f"No Python stack from rank {rank}: this job has no rendezvous to ask through (it was not started by "
            "horovodrun).")
