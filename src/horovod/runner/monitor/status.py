"""What the live page shows, read from the job's rendezvous store inside the launcher (no network hop).

Every rank puts a heartbeat into the store once a second (``horovod.core.observers.heartbeat``; the scope and field
names are in :mod:`horovod.common.heartbeat_records`). :class:`BeatLog` keeps the last two beats of each rank as
they arrive (the store calls it on every put), so that rates come from consecutive beats and the age of a beat is
measured on the launcher's clock. :class:`JobStatus` turns them, the ranks' latest reports and the job's layout
(static, or the elastic driver's current round) into the JSON of ``/api/status``, and asks every rank for its
Python stack for ``/api/stacks``.
"""
from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from typing import Callable, Deque, Dict, List, Optional, Tuple

from horovod.common import heartbeat_records as rec
from horovod.common import wire

log = logging.getLogger(__name__)

STACK_SECONDS = 2.0         # how long the stack button waits for the ranks' answers
WAITING_SECONDS = 1.0       # a rank that has waited this long for a peer is shown as waiting for it
# {"size": n, "hosts": [host by rank], "elastic": None or the driver's view, optionally "local_pids": {rank: pid}
# of the ranks the launcher started on this machine}
JobView = Callable[[], dict]

# /proc/<pid>/stat states of a local rank that say it cannot run.
_PROC_STATES = {"T": "stopped (SIGSTOP, or a debugger holds it)", "t": "stopped by a debugger (tracing stop)",
                "Z": "exited (a zombie its launcher has not reaped)", "X": "exited",
                "D": "blocked in the kernel (uninterruptible sleep)"}
_STOPPED = {"stopped": _PROC_STATES["T"], "tracing-stop": _PROC_STATES["t"]}     # psutil's status -> ours


class BeatLog:
    """The last two heartbeats of every rank, stamped with the launcher's clock when they arrived."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._beats: Dict[str, Deque[Tuple[float, bytes]]] = {}

    def on_put(self, key: str, value: bytes) -> None:
        """The store's watcher for the heartbeat scope: O(1), never raises (it runs in the store's thread)."""
        try:
            with self._lock:
                beats = self._beats.get(key)
                if beats is None:
                    beats = self._beats[key] = collections.deque(maxlen=2)
                beats.append((time.monotonic(), value))
        except Exception:  # the store must keep serving the rank whatever happens here
            pass

    def last_two(self, key: str) -> List[Tuple[float, bytes]]:
        """The rank's last beats, oldest first, each (arrival on time.monotonic, packed record)."""
        with self._lock:
            return list(self._beats.get(key, ()))


def static_view(hosts: List[str], local_pids: Optional[Dict[int, int]] = None) -> JobView:
    """The layout of a static job: ``hosts[rank]`` for each rank; ``local_pids``, which the launcher fills as it
    starts the ranks on this machine (read at every snapshot), lets the page say what became of a rank that
    never sent a heartbeat."""
    view = {"size": len(hosts), "hosts": list(hosts), "elastic": None, "local_pids": local_pids}
    return lambda: view


def _unpack(raw: Optional[bytes]) -> Optional[dict]:
    if not raw:
        return None
    try:
        value = wire.unpack(raw)
    except Exception:
        return None
    return value if isinstance(value, dict) else None


def _proc_state(host: Optional[str], pid: Optional[int]) -> Optional[str]:
    """What the kernel says of a rank on this machine that cannot run (stopped, exited, ...), else None."""
    if not pid or host != socket.gethostname():
        return None
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return "exited"
    except (OSError, IndexError, ValueError):
        return None
    return _PROC_STATES.get(state)


def _started_state(pid: int) -> Optional[str]:
    """What the kernel says of a rank the launcher started here (``pid``, the process it started, and what that
    started in turn: a shell may run the program) when it is stopped or gone, else None. (Not a wait in the
    kernel: a rank that starts reads files.)"""
    import psutil

    from horovod.runner.process import stopped_process

    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return _PROC_STATES["Z"]
        stopped = stopped_process(pid)
    except psutil.NoSuchProcess:
        return "exited"
    except psutil.Error:
        return None
    return None if stopped is None else _STOPPED[stopped[1]]


def _number(value, digits: int = 3) -> Optional[float]:
    return None if value is None else round(float(value), digits)


class JobStatus:
    """Builds ``/api/status`` from the store and the job's layout; asks the ranks for their stacks."""

    def __init__(self, store, job: JobView, beats: Optional[BeatLog] = None) -> None:
        self.store = store
        self.job = job
        self.beats = beats or BeatLog()
        self.started = time.time()
        self._stack_lock = threading.Lock()

    def watch(self) -> None:
        """Have the store hand every heartbeat to :attr:`beats` as it arrives."""
        self.store.watch(rec.BEAT_SCOPE, self.beats.on_put)

    def snapshot(self) -> dict:
        """The whole status: ``job``, ``ranks`` (one entry per rank of the current job) and ``reports``."""
        view = self.job()
        now, mono = time.time(), time.monotonic()
        size = int(view.get("size") or 0)
        hosts = list(view.get("hosts") or [])
        pids = view.get("local_pids") or {}
        ranks = [self.rank_status(rank, hosts[rank] if rank < len(hosts) else None, now, mono, pids.get(rank))
                 for rank in range(size)]
        job = {"size": size, "start_time": self.started, "uptime_s": round(now - self.started, 1),
               "launcher_host": socket.gethostname(), "elastic": view.get("elastic")}
        return {"time": now, "job": job, "ranks": ranks, "reports": self.reports(now)}

    def rank_status(self, rank: int, host: Optional[str], now: float, mono: float,
                    local_pid: Optional[int] = None) -> dict:
        """One rank's entry: who, what it does, its rates (from its last two beats) and its state. ``local_pid``:
        the process the launcher started for it on this machine, if it did (what became of a rank that has sent
        no heartbeat yet)."""
        key = str(rank)
        beats = [(arrived, _unpack(raw)) for arrived, raw in self.beats.last_two(key)]
        beats = [(arrived, beat) for arrived, beat in beats if beat is not None]
        if not beats:                       # beats put before the watcher was set (or a hand-made store)
            beat = _unpack(self.store.get(rec.BEAT_SCOPE, key))
            beats = [(None, beat)] if beat is not None else []
        entry = {"rank": rank, "host": host, "pid": None, "state": "starting",
                 "state_text": "no heartbeat yet (starting, or not started by horovodrun)",
                 "last_collective": None, "running_s": None, "waiting_for": None, "waited_s": None,
                 "collectives_per_s": None, "bytes_per_s": None, "last_completed_seq": None,
                 "submitted_seq": None, "completed": None, "heartbeat_age_s": None, "negotiating": None,
                 "negotiating_s": None, "missing_ranks": None}
        if not beats:
            if local_pid:
                entry["pid"] = local_pid
                kernel = _started_state(local_pid)
                if kernel is not None:
                    entry.update(state="exited" if kernel.startswith("exited") else "stopped",
                                 state_text=f"no heartbeat yet, and the process is {kernel}")
            return entry
        arrived, beat = beats[-1]
        age = max(0.0, mono - arrived) if arrived is not None else max(0.0, now - float(beat.get(rec.T, now)))
        entry.update(host=beat.get(rec.HOST, host), pid=beat.get(rec.PID), heartbeat_age_s=round(age, 1),
                     last_collective=beat.get(rec.RUNNING), last_completed_seq=beat.get(rec.LAST_DONE),
                     submitted_seq=beat.get(rec.SUBMITTED), completed=beat.get(rec.DONE))
        stale = age > rec.STALE_SECONDS
        # The beat's durations grow by its age only while the rank is stuck: its last two beats show no collective
        # completed in between (else the beat caught one of many short collectives, which has long finished).
        stuck = len(beats) == 2 and beats[0][1].get(rec.DONE) == beat.get(rec.DONE)
        since = age if stuck and not stale else 0.0
        if entry["last_collective"] is not None:
            entry["running_s"] = _number(float(beat.get(rec.RUNNING_S, 0.0)) + since, 1)
        if beat.get(rec.WAITING_FOR) is not None:
            entry["waiting_for"] = beat.get(rec.WAITING_FOR)
            entry["waited_s"] = _number(float(beat.get(rec.WAITING_S, 0.0)) + since, 1)
        if beat.get(rec.NEGOTIATING) is not None:
            entry.update(negotiating=beat.get(rec.NEGOTIATING), missing_ranks=beat.get(rec.MISSING),
                         negotiating_s=_number(float(beat.get(rec.NEGOTIATING_S, 0.0)) + since, 1))
        if not stale and len(beats) == 2:
            entry.update(_rates(beats[0][1], beat))
        entry.update(_state(entry, stale, age, stuck))
        return entry

    def reports(self, now: float) -> List[dict]:
        """Every rank's latest stall, deadlock or data-plane report, newest first."""
        found = []
        for key, raw in self.store.items(rec.REPORT_SCOPE).items():
            report = _unpack(raw)
            if report is None:
                continue
            t = float(report.get(rec.T, now))
            found.append({"rank": report.get(rec.RANK, key), "kind": report.get(rec.KIND, "report"), "time": t,
                          "age_s": round(max(0.0, now - t), 1), "text": str(report.get(rec.TEXT, ""))})
        return sorted(found, key=lambda r: -r["time"])

    def stacks(self, timeout: float = STACK_SECONDS) -> dict:
        """Ask every rank of the job for its Python stack at once; each rank's stack, or why none came within
        ``timeout`` seconds (the wording of the ranks' own reports)."""
        size = int(self.job().get("size") or 0)
        ranks = list(range(size))
        with self._stack_lock:          # one request at a time: a rank keeps one request
            ask = f"monitor-{os.getpid()}-{time.monotonic_ns()}"
            keys = [rec.stack_key(rank, ask) for rank in ranks]
            for rank in ranks:
                self.store.put(rec.ASK_SCOPE, str(rank), ask.encode())
            _, values = self.store.wait(rec.STACK_SCOPE, keys, timeout)
            stacks = []
            for rank, key, value in zip(ranks, keys, values):
                text = value.decode(errors="replace") if value else ""
                if not value:
                    self.store.delete(rec.ASK_SCOPE, str(rank))
                self.store.delete(rec.STACK_SCOPE, key)
                stacks.append({"rank": rank, "answered": bool(value), "text": rec.stack_text(rank, text, timeout)})
        return {"time": time.time(), "timeout_s": timeout, "stacks": stacks}


def _rates(older: dict, newer: dict) -> dict:
    """Collectives and bytes per second between two beats of one rank (its own clock)."""
    dt = float(newer.get(rec.T, 0.0)) - float(older.get(rec.T, 0.0))
    if dt <= 0 or newer.get(rec.DONE) is None or older.get(rec.DONE) is None:
        return {}
    done = max(0, int(newer[rec.DONE]) - int(older[rec.DONE]))
    nbytes = max(0, int(newer.get(rec.DONE_BYTES, 0)) - int(older.get(rec.DONE_BYTES, 0)))
    return {"collectives_per_s": round(done / dt, 1), "bytes_per_s": round(nbytes / dt, 1)}


def _state(entry: dict, stale: bool, age: float, stuck: bool = False) -> dict:
    """The rank's state: a short code (for the page's colours and for scripts) and a sentence. ``stuck``: its
    last two beats show no collective completed in between."""
    if stale:
        kernel = _proc_state(entry["host"], entry["pid"])
        text = f"not answering: no heartbeat for {age:.1f} s"
        if kernel is not None:
            code = "exited" if kernel.startswith("exited") else "stopped"
            return {"state": code, "state_text": f"{text}; the process is {kernel}"}
        return {"state": "not answering", "state_text": text + " (stopped, frozen in native code that holds the "
                                                              "GIL, or its host cannot reach the launcher)"}
    if entry["waiting_for"] is not None and (entry["waited_s"] or 0.0) >= WAITING_SECONDS:
        return {"state": "waiting", "state_text": f"waiting {entry['waited_s']:.1f} s for rank "
                                                  f"{entry['waiting_for']} in {entry['last_collective']}"}
    if entry["last_collective"] is not None:
        return {"state": "in collective", "state_text": f"in {entry['last_collective']}"}
    if entry["missing_ranks"] and (entry["negotiating_s"] or 0.0) >= WAITING_SECONDS:
        missing = entry["missing_ranks"]
        who = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
        return {"state": "negotiating", "state_text": f"negotiating {entry['negotiating_s']:.1f} s: tensor "
                                                      f"'{entry['negotiating']}' waits for {who} to submit it"}
    submitted, done = entry["submitted_seq"], entry["last_completed_seq"]
    if stuck and submitted is not None and done is not None and submitted > done:
        # Submitted, none running, nothing completed: the coordinator waits for a rank that has not submitted it.
        return {"state": "negotiating", "state_text": f"negotiating collective #{done + 1}: submitted, not yet "
                                                      "submitted by every rank (the stall reports name the missing)"}
    return {"state": "running", "state_text": "running (in its own code between collectives)"}
