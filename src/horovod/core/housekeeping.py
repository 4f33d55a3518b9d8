"""Collectives Horovod submits for its own bookkeeping and reads later without waiting for them (the torch
optimizer's unused-parameter masks, polled at the next step).

A program that removes a process set right after its last step must not find them in flight:
``remove_process_set`` lets them finish first. Every rank of the set submitted them in the same step, so they
complete; the wait is bounded, so a rank that skipped a step cannot hang the removal, which then names them as
it names a user's collectives still in flight.
"""
from __future__ import annotations

import threading
import time
from typing import Dict, List

from horovod.core.engine.handles import Handle

SETTLE_SECONDS = 30.0

_lock = threading.Lock()
_handles: Dict[int, List[Handle]] = {}


def track(process_set_id: int, handle: Handle) -> None:
    """Remember ``handle``, a bookkeeping collective on ``process_set_id``, until it completes."""
    with _lock:
        live = [h for h in _handles.get(process_set_id, []) if not h.poll()]
        live.append(handle)
        _handles[process_set_id] = live


def settle(process_set_id: int, timeout: float = SETTLE_SECONDS) -> None:
    """Wait up to ``timeout`` seconds in all for the bookkeeping collectives on ``process_set_id`` to complete.
    Their results and errors stay with their handles, for whoever submitted them to read."""
    with _lock:
        handles = _handles.pop(process_set_id, [])
    deadline = time.monotonic() + timeout
    for handle in handles:
        try:
            handle.wait(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return
        except Exception:       # the owner reads the error from its handle
            continue
