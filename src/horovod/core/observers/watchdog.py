"""The data-plane watchdog: notice a peer that stopped sending in the middle of a collective, and say so.

The stall inspector watches negotiation (a tensor some ranks submitted and others did not). Once a collective
runs, its ranks wait for each other inside the data plane, and a peer that freezes there (stopped by SIGSTOP or
a debugger, wedged in a driver, its host cut off) would leave the others waiting in silence. Every blocking
receive of the socket planes records itself on :mod:`horovod.backends.peer_waits`; this module's thread (one per
process, started with the first engine) reads that board every ``min(1, warning / 4)`` seconds, and also when a
wait on it is due to reach the warning or the shutdown time, so that a stall ends the job on time, and the rank
that has waited longest (the one that waits for the silent peer itself) is the first to end.

When a receive has had no byte from its peer for ``HOROVOD_STALL_CHECK_TIME_SECONDS`` (the stall inspector's
knob, default 60 s; ``HOROVOD_STALL_CHECK_DISABLE`` turns both off), the rank logs **one** report for that stall:
the collective and its tensors, the process set, the plane, how long it has waited, how far the transfer got, the
peer it waits for and that peer's state (:mod:`.peer_state`: stopped, exited, running, or what its heartbeat
says). With ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` set, a stall that lasts that long ends the job: the waiting
receive is cut, and the engine fails every pending handle with a ``HorovodInternalError`` carrying the report.
Without it nothing is ended (a debugger may hold the rank on purpose). Fast rounds wait outside the engine and
tell the coordinator, whose stall inspector reports them.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
import weakref
from typing import Dict, List, Optional

from horovod.backends import peer_waits
from horovod.common import config
from horovod.common.types import DataType, RequestType, numpy_dtype
from horovod.core.controller.messages import TensorResponse
from horovod.core.engine import Engine, lifecycle
from horovod.core.observers import flight_recorder, heartbeat, peer_state

log = logging.getLogger("horovod.stall")  # a named channel: see horovod.common.logging_setup

MIB = float(1 << 20)
MIN_SLEEP_S = 0.01      # a wait due now is checked after this much (the thread never spins)


class _Settings:
    def __init__(self) -> None:
        self.disabled = bool(config.get("HOROVOD_STALL_CHECK_DISABLE"))
        self.warning_s = float(config.get("HOROVOD_STALL_CHECK_TIME_SECONDS"))
        shutdown_s = float(config.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"))
        # As the stall inspector: a shutdown time under the check time is ignored (a stall is one only then).
        self.shutdown_s = shutdown_s if shutdown_s >= self.warning_s else 0.0
        self.interval = max(0.05, min(1.0, self.warning_s / 4))


class DataPlaneWatchdog:
    """Watches the data-plane waits of this process's engines (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: weakref.WeakSet[Engine] = weakref.WeakSet()
        self._thread: Optional[threading.Thread] = None
        self._wake = threading.Event()
        self._reported: Dict[int, float] = {}      # id(wait) -> when reported
        self._ended: set = set()
        self._failed = False                      # a check raised (logged as a warning the first time)
        self._last_check = time.monotonic()
        self._resumed_at = 0.0          # this process ran again after being stopped itself (see check)
        self.next_due = float("inf")    # when the next wait reaches its warning or shutdown time (see check)
        self.settings = _Settings()

    def watch(self, engine: Engine) -> None:
        """Watch ``engine``'s collectives (starts the thread on the first call)."""
        with self._lock:
            self.settings = _Settings()
            if self.settings.disabled:
                return
            self._engines.add(engine)
            if self._thread is None or not self._thread.is_alive():
                self._wake.clear()
                self._thread = threading.Thread(target=self._run, name="horovod-watchdog", daemon=True)
                self._thread.start()

    def unwatch(self, engine: Engine) -> None:
        with self._lock:
            self._engines.discard(engine)
            if not self._engines:
                self._wake.set()
                self._thread = None

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while not self._wake.wait(self._sleep_s(time.monotonic())):
            try:
                self.check(time.monotonic())
            except Exception:       # said once, loudly: a watchdog that fails in silence watches nothing
                log.log(logging.DEBUG if self._failed else logging.WARNING,
                        "The data-plane watchdog's check failed; stalls may go unreported", exc_info=True)
                self._failed = True

    def _sleep_s(self, now: float) -> float:
        """How long the thread sleeps before the next check: the interval, or less when a wait is due sooner."""
        return max(MIN_SLEEP_S, min(self.settings.interval, self.next_due - now))

    def _engine_of(self, ident: int) -> Optional[Engine]:
        with self._lock:
            engines = list(self._engines)
        return next((e for e in engines if e.thread_ident == ident), None)

    def check(self, now: float) -> List[str]:
        """Look at every wait once; log (and return) the reports this check made."""
        settings, made = self.settings, []
        if now - self._last_check > 2 * settings.interval + 1.0:
            # The watchdog's own sleep overran: this process was stopped (or starved) itself. Its waits did not
            # wait for their peers meanwhile, so they count from now.
            self._resumed_at = now
        self._last_check = now
        waits = peer_waits.snapshot()
        live = {id(w) for _, w in waits}
        self._reported = {k: t for k, t in self._reported.items() if k in live}
        self._ended &= live
        self.next_due = float("inf")
        for _, wait in waits:
            quiet = min(wait.quiet_for(now), now - self._resumed_at)
            due = _due(settings, quiet, id(wait) in self._reported, id(wait) in self._ended)
            if due is not None and due > quiet:
                self.next_due = min(self.next_due, now + due - quiet)
            if quiet < settings.warning_s:
                continue
            engine = self._engine_of(wait.owner)
            ending = settings.shutdown_s > 0 and quiet >= settings.shutdown_s and id(wait) not in self._ended
            if id(wait) in self._reported and not ending:
                continue
            report = describe(engine, wait, now, settings, ending, quiet)
            made.append(report)
            heartbeat.publish_report("data-plane stall", report)     # for the launcher's live page
            if ending:
                self._ended.add(id(wait))
                flight_recorder.dump_all("data-plane stall", report)
                _end(engine, wait, report)      # the engine's abort logs the report, as an error
            else:
                self._reported[id(wait)] = now
                log.warning("%s", report)
                flight_recorder.dump_all("data-plane stall", report)
        return made


def _due(settings: _Settings, quiet: float, reported: bool, ended: bool) -> Optional[float]:
    """The quiet time at which a wait is next due: its warning, then its shutdown time; None once nothing is."""
    if not reported and quiet < settings.warning_s:
        return settings.warning_s
    if settings.shutdown_s > 0 and not ended:
        return settings.shutdown_s
    return None


WATCHDOG = DataPlaneWatchdog()


def _lifecycle(engine: Engine, started: bool) -> None:
    if started:
        WATCHDOG.watch(engine)
    else:
        WATCHDOG.unwatch(engine)


lifecycle.on_lifecycle(_lifecycle)


def describe(engine: Optional[Engine], wait: peer_waits.PeerWait, now: float, settings: _Settings,
             ending: bool, quiet: Optional[float] = None) -> str:
    """The report for one stalled receive (or send): what runs, where, for how long, and the state of the silent
    peer."""
    if engine is not None:
        who = f"rank {engine.global_rank} (host {engine.control.host_of(engine.rank)})"
    else:
        who = f"this process (host {socket.gethostname()})"
    quiet = wait.quiet_for(now) if quiet is None else quiet
    if wait.peer == peer_waits.ANY_PEER:
        lines = [f"Data plane stalled: {who} has waited {quiet:.1f} s inside {wait.call} "
                 f"{_collective(engine, now)}. MPI does not say which rank it waits for; the other ranks:"]
        lines.append(_mpi_peers(engine))
        culprit = "the rank that does not answer"
    else:
        silent = (f"could send nothing more to rank {wait.peer} (it takes no more bytes)" if wait.sending
                  else f"has received nothing from rank {wait.peer}")
        lines = [f"Data plane stalled: {who} {silent} for {quiet:.1f} s "
                 f"{_collective(engine, now)}. {_transfer(engine, wait)}"]
        lines.append(peer_state.describe(wait.peer, wait.host, peer_waits.peer_pid(wait), sock=wait.sock))
        culprit = f"rank {wait.peer}"
    if ending:
        lines.append(f"Shutting down: the data plane stalled for more than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="
                     f"{settings.shutdown_s:g} s. Find out why {culprit} stopped (its state above), or raise "
                     "the limit.")
    elif settings.shutdown_s <= 0:
        lines.append("The job keeps waiting (a debugger may hold the rank on purpose); set "
                     "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS to end it when a stall lasts that long.")
    return "\n".join(lines)


def _collective(engine: Optional[Engine], now: float) -> str:
    """'in ALLREDUCE of tensor 'x' and 2 more tensor(s) in the global process set [shm plane], which has run 5.2 s'."""
    if engine is None:
        return "in a data-plane transfer"
    running = engine.running
    plane = getattr(engine.backend, "name", "?")
    where = ("the global process set" if engine.process_set_id == 0
             else f"process set {engine.process_set_id} (ranks {engine.ranks})")
    if running is None:
        return f"in {where} [{plane} plane]"
    batch, started = running
    return f"in {heartbeat.what(batch)} in {where} [{plane} plane], which has run {now - started:.1f} s"


def _transfer(engine: Optional[Engine], wait: peer_waits.PeerWait) -> str:
    """How far the collective and this receive got."""
    parts = []
    running = engine.running if engine is not None else None
    if running is not None:
        total = sum(_nbytes(r) for r in running[0])
        done = min(getattr(engine.backend, "progress", 0), total)
        parts.append(f"The collective moves {total / MIB:.2f} MiB" +
                     (f" and this rank is through {done / MIB:.2f} MiB of it" if done else "") + ".")
    if wait.sending:
        parts.append(f"This send got {wait.done / MIB:.2f} of {wait.total / MIB:.2f} MiB to rank {wait.peer}.")
    elif wait.total <= 64:
        parts.append(f"This rank waits for rank {wait.peer} at a barrier (its signal that it finished a step).")
    else:
        parts.append(f"This receive got {wait.done / MIB:.2f} of {wait.total / MIB:.2f} MiB from rank {wait.peer}.")
    return " ".join(parts)


def _nbytes(response: TensorResponse) -> int:
    count = 1
    for dim in response.shape:
        count *= int(dim)
    extra = response.extra
    if response.rtype == int(RequestType.ALLGATHER) and extra:   # shape is the row shape; extra: rows per rank
        count *= int(sum(extra))
    try:
        return count * numpy_dtype(DataType(response.dtype)).itemsize
    except (ValueError, TypeError):
        return 0


def _mpi_peers(engine: Optional[Engine]) -> str:
    """The state of every other rank of an MPI plane (stopped or exited ones first; at most MOST_RANKS others)."""
    backend = engine.backend if engine is not None else None
    peers = getattr(backend, "peers", None) or getattr(getattr(backend, "large", None), "peers", None) or []
    here = socket.gethostname()
    rows = []
    for position, (host, pid) in enumerate(peers):
        rank = engine.ranks[position] if engine is not None and position < len(engine.ranks) else position
        if engine is not None and rank == engine.global_rank:
            continue
        state = peer_state.process_state(pid) if host == here else None
        silent = state is not None and state.startswith(("stopped", "exited"))
        rows.append((not silent, rank, peer_state.describe(rank, host, pid if host == here else None,
                                                           with_stack=not silent)))
    rows.sort()
    shown = [text for _, _, text in rows[:peer_state.MOST_RANKS]]
    if len(rows) > peer_state.MOST_RANKS:
        shown.append(f"({len(rows) - peer_state.MOST_RANKS} more rank(s) not shown.)")
    return "\n".join(shown) or "(no other rank is known)"


def _end(engine: Optional[Engine], wait: peer_waits.PeerWait, report: str) -> None:
    """End a stalled wait: the engine fails with ``report``, and the receive is cut so that it returns (an MPI
    call cannot be cut: the job is aborted, after the report is logged)."""
    if engine is not None:
        engine.stall_reason = report
    if wait.sock is None and wait.abort is not None:
        log.error("%s", report)
        wait.abort()
        return
    if wait.sock is not None:
        try:
            wait.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
