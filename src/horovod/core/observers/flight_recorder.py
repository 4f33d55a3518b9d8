"""The flight recorder: every rank writes the last collectives it took part in, per process set, when the job is
in trouble, so that the ranks' records can be compared (``python -m horovod.timeline flight DIR``).

Like PyTorch's Flight Recorder, for every data plane. The records are kept by the engines
(:mod:`horovod.core.engine.flight`: one ring of ``HOROVOD_FLIGHT_RECORDER_SIZE`` records per process set, filled
on paths the engine takes anyway); this module formats and writes them, as ``rank.<rank>.json`` in the job's
folder (:mod:`horovod.common.flight_records`), when:

- an engine aborts (a lost peer, a stall or deadlock shutdown, a failed collective): :class:`FlightObserver`,
  attached to every engine on every rank, is told before any pending handle fails;
- the coordinator reports a deadlock (every rank hears the report);
- the process receives SIGUSR1 (:func:`install_signal_handler`; faulthandler dumps every thread's stack too);
- other code calls :func:`dump_all` (the stall inspector) or ``flight_records.request_dump`` (layers below this
  one).
"""
from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import socket
import threading
import time
from typing import Dict, List, Optional

from horovod.common import config, flight_records
from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.engine import flight
from horovod.core.engine.observer import EngineObserver

log = logging.getLogger(__name__)

REPEAT_SECONDS = 1.0            # the same reason within this long after a write does not write again
LOCK_SECONDS = 10.0             # longest a dump waits for another one to finish
_lock = threading.Lock()
_written: Dict[str, float] = {}     # reason -> when its last write ended (monotonic)
_signal_installed = [False]


class FlightObserver(EngineObserver):
    """Writes this process's flight records when an engine aborts or hears a stall or deadlock report."""

    def on_incident(self, kind: str, message: str) -> None:
        dump_all(kind, message)


def observers() -> List[EngineObserver]:
    """What an engine on any rank needs for the flight recorder: one observer, or none when it is off."""
    return [FlightObserver()] if config.get("HOROVOD_FLIGHT_RECORDER_SIZE") > 0 else []


def dump_all(reason: str, detail: str = "", blocking: bool = True) -> Optional[str]:
    """Write this process's records (every process set it belongs to) into the job's folder, as
    ``rank.<rank>.json``; return the folder, or None when nothing was written. Never raises. A second call with the
    same ``reason`` within ``REPEAT_SECONDS`` of a write returns the folder without writing again. ``blocking``
    False (a signal handler) gives up at once while another dump is being written."""
    try:
        if not _lock.acquire(blocking, LOCK_SECONDS if blocking else -1):
            return None
        try:
            folder = flight_records.default_folder()
            last = _written.get(reason)
            if last is not None and time.monotonic() - last < REPEAT_SECONDS:
                return folder
            doc = process_record(reason, detail)
            if doc is None:
                return None
            path = write_record(folder, doc)
            _written[reason] = time.monotonic()
        finally:
            _lock.release()
        log.warning("Flight record of rank %d (%s) written to %s", doc["rank"], reason, path)
        return folder
    except Exception as exc:        # a diagnostic must never take the job down with it
        log.warning("Could not write the flight record (%s): %s: %s", reason, type(exc).__name__, exc)
        return None


def process_record(reason: str, detail: str = "") -> Optional[dict]:
    """This process's flight record as a JSON-ready dict (None when no engine ever kept one)."""
    rings = flight.rings()
    if not rings:
        return None
    global_rank = rings[0].global_rank
    whole = next((r for r in rings if r.process_set_id == 0), None)
    size = len(whole.ranks) if whole is not None else int(os.environ.get("HOROVOD_SIZE") or 0)
    return {
        "format": flight_records.FORMAT, "version": flight_records.VERSION,
        "rank": global_rank, "size": size, "host": os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname(),
        "pid": os.getpid(), "reason": reason, "detail": detail, "written_at": round(time.time(), 6),
        "capacity": rings[0].capacity,
        "process_sets": [ring_record(ring) for ring in rings],
    }


def ring_record(ring: flight.FlightRing) -> dict:
    """One process set's part of the record: who, and its entries oldest first."""
    return {"id": ring.process_set_id, "ranks": list(ring.ranks), "rank_in_set": ring.rank,
            "submitted": ring.count, "closed_at": _stamp(ring.closed_at),
            "entries": [entry_record(ring, record) for record in ring.snapshot()]}


def _stamp(t: Optional[float]) -> Optional[float]:
    return None if t is None else round(t, 6)


def state_of(record: list) -> str:
    """The last state a record reached."""
    for field, name in ((flight.FAILED, "failed"), (flight.DONE, "done"), (flight.STARTED, "started"),
                        (flight.NEGOTIATED, "negotiated")):
        if record[field] is not None:
            return name
    return "submitted"


def entry_record(ring: flight.FlightRing, record: list) -> dict:
    """One collective, as written out (``plane``: the data plane that ran it, None until it started)."""
    request = record[flight.REQUEST]
    rtype = RequestType(request.rtype)
    out = {"seq": record[flight.SEQ], "name": request.name, "op": rtype.name,
           "dtype": DataType(request.dtype).name.lower(), "shape": list(request.shape),
           "bytes": record[flight.NBYTES], "state": state_of(record),
           "plane": ring.plane_of(record) if record[flight.STARTED] is not None else None}
    if rtype in (RequestType.ALLREDUCE, RequestType.REDUCESCATTER):
        out["reduce_op"] = ReduceOp(request.reduce_op).name
    if rtype == RequestType.BROADCAST:
        out["root_rank"] = request.root
    for field, name in ((flight.SUBMITTED, "submitted"), (flight.NEGOTIATED, "negotiated"),
                        (flight.STARTED, "started"), (flight.DONE, "done"), (flight.FAILED, "failed")):
        out[name + "_at"] = _stamp(record[field])
    if record[flight.ERROR] is not None:        # its first line: the record's "detail" holds an abort's whole text
        out["error"] = record[flight.ERROR].split("\n", 1)[0][:500]
    return out


def to_json(doc: dict) -> str:
    """The record as JSON with one entry per line (readable with ``less``, ``grep``)."""
    head = {k: v for k, v in doc.items() if k != "process_sets"}
    sets = []
    for part in doc["process_sets"]:
        fields = {k: v for k, v in part.items() if k != "entries"}
        lines = ",\n".join("    " + json.dumps(entry) for entry in part["entries"])
        sets.append(json.dumps(fields)[:-1] + ', "entries": [\n' + lines + "\n  ]}")
    return json.dumps(head)[:-1] + ',\n "process_sets": [\n  ' + ",\n  ".join(sets) + "\n ]}\n"


def write_record(folder: str, doc: dict) -> str:
    """Write ``doc`` as ``<folder>/rank.<rank>.json`` (atomically: readers never see half a file)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, flight_records.file_name(doc["rank"]))
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
        f.write(to_json(doc))
    os.replace(temporary, path)
    return path


# ---------------------------------------------------------------------------------------------- SIGUSR1
def _on_sigusr1(signum: int, frame) -> None:
    dump_all("SIGUSR1", "the process received SIGUSR1", blocking=False)


def install_signal_handler() -> bool:
    """Have SIGUSR1 write this process's flight record (idempotent; True when installed; nothing when the
    recorder is off).

    Only from the main thread, and only when the program has no handler of its own for SIGUSR1 (nor ignores it).
    Then faulthandler is registered on SIGUSR1 after our handler, chaining to it, so the signal also dumps every
    thread's stack to stderr, at C level (even while a thread holds the GIL), as a test harness or an operator
    expects; a faulthandler registration made earlier (to stderr) is replaced by this one, which writes to stderr.
    """
    if _signal_installed[0]:
        return True
    if config.get("HOROVOD_FLIGHT_RECORDER_SIZE") <= 0:
        return False
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGUSR1"):
        return False
    if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
        log.debug("SIGUSR1 has a handler of the program's: the flight recorder does not take it")
        return False
    try:
        # An earlier faulthandler registration would keep its C handler past signal.signal() and lose it: undo it
        # first, so that the one below installs faulthandler's handler over ours and chains to it.
        faulthandler.unregister(signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, _on_sigusr1)
    except (ValueError, OSError) as exc:
        log.debug("could not install the flight recorder's SIGUSR1 handler: %s", exc)
        return False
    _signal_installed[0] = True
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)
    except (ValueError, OSError, RuntimeError, AttributeError) as exc:     # no usable sys.stderr
        log.debug("SIGUSR1 writes the flight record, but cannot dump the stacks: %s", exc)
    return True


flight_records.set_dumper(lambda reason, detail: dump_all(reason, detail))
