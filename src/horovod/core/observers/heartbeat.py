"""Every rank's heartbeat through the job's rendezvous, and its Python stack on request.

Under horovodrun (static and elastic) every rank reaches the launcher's authenticated key-value store
(``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT`` and the job secret). A daemon thread in each rank puts, once a second,
a small record under scope :data:`BEAT_SCOPE`, key ``<global rank>``: wall time, host, pid and what its engines
do (the collective running and for how long, and the rank it waits for in the data plane). Between beats it
long-polls the key ``<global rank>`` of :data:`ASK_SCOPE`: when another rank asks for its stack, it answers
with every thread's Python stack, the program's own threads first, under :data:`STACK_SCOPE`.

So a rank that stalls can say of a peer on any host whether it still beats (alive: then what it does and where
its code is) or not (how long since its last beat: stopped, frozen in native code that holds the GIL, or its host
cut off). Jobs started without horovodrun's rendezvous (plain ``mpirun``) have no such channel, and the reports
say so. The heartbeat costs one small put per second per rank.

The beat also carries running totals read from the flight rings (collectives submitted, completed, their bytes,
the last completed sequence number), from which the launcher's live page (``horovod.runner.monitor``) computes
rates, and the thread puts the rank's latest stall, deadlock or data-plane report (:func:`publish_report`) under
:data:`REPORT_SCOPE`. Scope and field names are shared with the launcher through
:mod:`horovod.common.heartbeat_records`.
"""
from __future__ import annotations

import itertools
import logging
import os
import socket
import sys
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional

from horovod.common import config, wire
from horovod.common import heartbeat_records as rec
from horovod.common.heartbeat_records import (
    ASK_SCOPE,
    BEAT_SCOPE,
    BEAT_SECONDS,
    REPORT_SCOPE,
    STACK_SCOPE,
    STALE_SECONDS,
)
from horovod.common.kvstore import KVStoreClient
from horovod.core.engine import flight

log = logging.getLogger("horovod.stall")  # a named channel: see horovod.common.logging_setup
READ_TIMEOUT_SECONDS = 2.0              # a report reads the store at most this long per call (its host may be cut)
HOROVOD_THREAD_PREFIX = "horovod-"
OWN_THREAD_FRAMES = 2       # innermost frames shown of Horovod's own threads (the program's threads: all of them)

Status = Callable[[], dict]


def _client(timeout: float = 5.0) -> Optional[KVStoreClient]:
    """A new connection to the job's rendezvous store, or None when this job has none."""
    addr, port = config.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), config.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    key = wire.secret_from_env()
    if not addr or not port or key is None:
        return None
    try:
        return KVStoreClient(addr, int(port), key, timeout=timeout)
    except (OSError, wire.AuthenticationError) as exc:
        log.debug("heartbeat: no rendezvous store to use: %s", exc)
        return None


class Heartbeat:
    """This rank's heartbeat thread, and its answers to stack requests."""

    def __init__(self, rank: int, status: Status) -> None:
        self.rank = rank
        self.status = status
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="horovod-heartbeat", daemon=True)
        self._client: Optional[KVStoreClient] = None

    def start(self) -> bool:
        """Start beating; False when the job has no rendezvous store to beat to."""
        self._client = _client()
        if self._client is None:
            return False
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._wake()
            self._thread.join(2 * BEAT_SECONDS + 1.0)
        if self._client is not None:
            self._client.close()

    def _wake(self) -> None:
        """End the thread's long poll now by asking on its own key (else a stop waits up to BEAT_SECONDS for it:
        an elastic reset would pay that on every rank); best effort, through a connection of its own."""
        waker = _client(timeout=READ_TIMEOUT_SECONDS)
        if waker is None:
            return
        try:
            waker.put(ASK_SCOPE, str(self.rank), b"")
        except (OSError, wire.PeerClosedError, ValueError) as exc:
            log.debug("heartbeat: could not wake the heartbeat thread: %s", exc)
        finally:
            waker.close()

    def _run(self) -> None:
        client, me = self._client, str(self.rank)
        assert client is not None
        try:
            # The address this rank reaches the launcher from: a peer can probe it when the beats stop.
            addr = client.local_address()
            while not self._stop.is_set():
                record = {rec.T: time.time(), rec.HOST: socket.gethostname(), rec.PID: os.getpid(), rec.ADDR: addr,
                          **self.status()}
                client.put(BEAT_SCOPE, me, wire.pack(record))
                _put_report(client, me)
                try:
                    asked = client.wait(ASK_SCOPE, [me], BEAT_SECONDS)[0]
                except TimeoutError:
                    continue
                client.delete(ASK_SCOPE, me)
                if self._stop.is_set():
                    break                   # the ask was stop()'s wake-up
                client.put(STACK_SCOPE, rec.stack_key(self.rank, asked.decode()), own_stack().encode())
            _put_report(client, me)         # a report made while the rank shuts down
        except (OSError, wire.PeerClosedError, ValueError) as exc:
            if not self._stop.is_set():
                log.debug("heartbeat: the rendezvous store went away: %s", exc)


def own_stack() -> str:
    """Every thread's Python stack, the program's own threads first (Horovod's own last), innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    ours = [i for i in frames if not names.get(i, "").startswith(HOROVOD_THREAD_PREFIX)]
    theirs = [i for i in frames if i not in ours]
    blocks = []
    for ident in ours + theirs:
        if ident == threading.get_ident():
            continue
        name = names.get(ident, f"thread {ident}")
        stack = traceback.format_stack(frames[ident])
        if ident in theirs:             # Horovod's own threads: where they are is enough
            stack = stack[-OWN_THREAD_FRAMES:]
        blocks.append(f"Thread {name!r}:\n" + "".join(stack).rstrip())
    return "\n".join(blocks)


class _Reader:
    """The reporting side: one connection, opened on first use, shared under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Optional[KVStoreClient] = None
        self._tried = False

    def client(self) -> Optional[KVStoreClient]:
        if not self._tried:
            self._tried = True
            self._client = _client(READ_TIMEOUT_SECONDS)
        return self._client

    def beat_of(self, peer: int) -> Optional[dict]:
        with self._lock:
            client = self.client()
            if client is None:
                return None
            raw = client.get(BEAT_SCOPE, str(peer))
        return wire.unpack(raw) if raw else None

    def stacks_of(self, peers: List[int], timeout: float) -> Optional[Dict[int, str]]:
        """Ask every rank in ``peers`` for its stack at once; what came back within ``timeout`` ('' for none)."""
        with self._lock:
            client = self.client()
            if client is None:
                return None
            ask = f"{os.getpid()}-{time.monotonic_ns()}"
            keys = {peer: rec.stack_key(peer, ask) for peer in peers}
            for peer in peers:
                client.put(ASK_SCOPE, str(peer), ask.encode())
            try:
                values = client.wait(STACK_SCOPE, list(keys.values()), timeout)
                return {peer: value.decode() for peer, value in zip(peers, values)}
            except TimeoutError:
                got = {}
                for peer, key in keys.items():
                    value = client.get(STACK_SCOPE, key)
                    got[peer] = value.decode() if value else ""
                    if not value:
                        client.delete(ASK_SCOPE, str(peer))
                return got

    def beat_or_none(self, peer: int) -> Optional[dict]:
        try:
            return self.beat_of(peer)
        except (OSError, wire.PeerClosedError, ValueError):
            return None


_reader = _Reader()
_running: Dict[int, Heartbeat] = {}


def start(rank: int, status: Status) -> None:
    """Start this process's heartbeat as global rank ``rank`` (again after each init)."""
    global _reader, _totals
    stop()
    _reader = _Reader()
    _totals = Totals()
    beat = Heartbeat(rank, status)
    if beat.start():
        _running[rank] = beat


def stop() -> None:
    for beat in list(_running.values()):
        beat.stop()
    _running.clear()


def describe_peer(peer: int, beat: Optional[dict] = None) -> str:
    """A sentence on global rank ``peer``'s heartbeat (``beat`` when already read): its age, and what it was
    doing; '' without a channel."""
    if beat is None:
        try:
            beat = _reader.beat_of(peer)
        except (OSError, wire.PeerClosedError, ValueError) as exc:
            return f"Its heartbeat cannot be read ({exc})."
    if beat is None:
        return ("It has no heartbeat in the job's rendezvous (it never started one, or the job has no rendezvous)."
                if _reader.client() is not None else "")
    age = max(0.0, time.time() - float(beat.get(rec.T, 0.0)))
    doing = _doing(beat)
    if age > STALE_SECONDS:
        return (f"No heartbeat for {age:.1f} s: the process is stopped or frozen (native code holding the GIL), "
                f"or its host cannot reach the launcher's host. Its last heartbeat said: {doing}.")
    return f"Its heartbeat is {age:.1f} s old: {doing}."


def _doing(beat: dict) -> str:
    running = beat.get(rec.RUNNING)
    if not running:
        return "no collective running (it is in its own code)"
    text = f"{running} for {beat.get(rec.RUNNING_S, 0.0):.1f} s"
    waiting = beat.get(rec.WAITING_FOR)
    if waiting is not None:
        text += f", waiting {beat.get(rec.WAITING_S, 0.0):.1f} s for rank {waiting}"
    return text


def stacks_of(peers: List[int], timeout: float) -> Dict[int, str]:
    """Each rank's Python stack (every thread, its own code first), or a line that says why it could not be had
    within ``timeout`` seconds; the ranks are asked at once."""
    try:
        stacks = _reader.stacks_of(list(peers), timeout)
    except (OSError, wire.PeerClosedError, ValueError) as exc:
        return {p: rec.no_store_text(p, str(exc)) for p in peers}
    if stacks is None:
        return {p: rec.no_store_text(p) for p in peers}
    return {p: rec.stack_text(p, stack, timeout) for p, stack in stacks.items()}


def beat_of(peer: int) -> Optional[dict]:
    """Rank ``peer``'s last heartbeat record (host, pid, what it does), or None."""
    return _reader.beat_or_none(peer)


def what(batch: list) -> str:
    """A batch of tensor responses in words: "ALLREDUCE of tensor 'x' and 3 more tensor(s)"."""
    from horovod.common.types import RequestType

    first = batch[0]
    try:
        op = RequestType(first.rtype).name
    except ValueError:
        op = str(first.rtype)
    more = f" and {len(batch) - 1} more tensor(s)" if len(batch) > 1 else ""
    return f"{op} of tensor '{first.name}'{more}"


def status_lines(engines: List) -> dict:
    """What a rank's engines are doing, for its heartbeat: the first running collective and the data-plane wait
    of its engine thread, if any, and the running totals of its flight rings (:class:`Totals`)."""
    status = _totals.update()
    status.update(_engine_status(engines))
    return status


def _engine_status(engines: List) -> dict:
    from horovod.backends import peer_waits

    now, waits = time.monotonic(), dict(peer_waits.snapshot())
    for engine in engines:
        running = engine.running
        if running is None:
            continue
        batch, started = running
        status = {rec.RUNNING: what(batch), rec.RUNNING_S: now - started}
        wait = waits.get(engine.thread_ident)
        if wait is not None:
            status.update({rec.WAITING_FOR: wait.peer, rec.WAITING_S: wait.quiet_for(now)})
        return status
    return _negotiation(engines, now)


def _negotiation(engines: List, now: float) -> dict:
    """On a coordinator with nothing running: its oldest tensor that some ranks submitted and others did not, how
    long it has been pending and the global ranks missing (read from the heartbeat's thread while the engine
    thread changes the tables: a read that races with a change is skipped, the next beat reads again)."""
    for engine in engines:
        coordinator = getattr(engine, "coordinator", None)
        if coordinator is None:
            continue
        try:
            pending, joined = coordinator.pending_names(), coordinator.joined
        except RuntimeError:        # a table changed size while it was read
            return {}
        if not pending:
            continue
        name, since, submitted = min(pending, key=lambda p: p[1])
        missing = sorted(engine.ranks[r] for r in set(range(engine.size)) - set(submitted) - joined)
        if missing:
            return {rec.NEGOTIATING: name, rec.NEGOTIATING_S: max(0.0, now - since), rec.MISSING: missing}
    return {}


class _RingCursor:
    """How far :class:`Totals` has read one flight ring."""

    __slots__ = ("ring", "seen", "pending", "last_done")

    def __init__(self, ring: flight.FlightRing) -> None:
        self.ring = ring
        self.seen = 0                   # every record up to this sequence number was looked at
        self.pending: List[list] = []   # records looked at while in flight: looked at again at the next beat
        self.last_done = 0


class Totals:
    """Running totals of the collectives this rank completed (count and bytes, every process set), and the global
    set's last submitted and completed sequence numbers, read from the flight rings at each beat.

    The engine keeps no counters for this: its flight ring already stamps every record when it is done, so the
    heartbeat thread reads the records added since the last beat, and those it saw in flight then (amortized O(1)
    per collective, on the heartbeat thread; nothing on the engine's path). A ring that dropped records before they
    were read (more than its capacity in one second) undercounts. Without a flight recorder
    (``HOROVOD_FLIGHT_RECORDER_SIZE=0``) the totals are absent.
    """

    MAX_PENDING = 4096

    def __init__(self) -> None:
        self.done = 0
        self.nbytes = 0
        self._cursors: Dict[int, _RingCursor] = {}

    def update(self) -> dict:
        """Read what the rings added since the last call; the totals as heartbeat fields ({} without rings)."""
        status: dict = {}
        for ring in flight.rings():
            cursor = self._cursors.get(ring.process_set_id)
            if cursor is None or cursor.ring is not ring:
                cursor = self._cursors[ring.process_set_id] = _RingCursor(ring)
            self._read(cursor)
            if ring.process_set_id == 0:
                status[rec.SUBMITTED] = ring.count
                status[rec.LAST_DONE] = cursor.last_done
        if self._cursors:
            status[rec.DONE] = self.done
            status[rec.DONE_BYTES] = self.nbytes
        return status

    def _read(self, cursor: _RingCursor) -> None:
        pending: List[list] = []
        ring = cursor.ring
        count = ring.count
        # The records added since the last beat, newest last: one C-level copy of the ring's tail (no Python code
        # runs during it, so the engine cannot append meanwhile); a record that was dropped is not counted.
        new = tuple(itertools.islice(reversed(ring.records), max(0, count - cursor.seen)))[::-1]
        if new:
            cursor.seen = new[-1][flight.SEQ]
        # One loop over the records in flight at the last beat and the new ones (in sequence order), inlined: at
        # thousands of collectives a second this is the heartbeat's main cost.
        done, nbytes, last = 0, 0, cursor.last_done
        seq_i, done_i, failed_i, bytes_i = flight.SEQ, flight.DONE, flight.FAILED, flight.NBYTES
        for batch in (cursor.pending, new):
            for record in batch:
                if record[done_i] is not None:
                    done += 1
                    nbytes += record[bytes_i]
                    if record[seq_i] > last:
                        last = record[seq_i]
                elif record[failed_i] is None:
                    pending.append(record)
        self.done += done
        self.nbytes += nbytes
        cursor.last_done = last
        cursor.pending = pending[-self.MAX_PENDING:]


_totals = Totals()


# -------------------------------------------------------------------------- reports, for the launcher's live page
_report: Dict[str, object] = {}        # the latest report not yet put into the store
_report_lock = threading.Lock()


def publish_report(kind: str, text: str) -> None:
    """Hand this rank's latest stall, deadlock or data-plane report to the heartbeat thread, which puts it under
    :data:`REPORT_SCOPE` at its next beat (within a second). Never blocks and never raises: a report must not
    cost the rank that makes it."""
    try:
        with _report_lock:
            _report.clear()
            _report.update({rec.T: time.time(), rec.KIND: str(kind), rec.TEXT: str(text)[:rec.REPORT_MAX_CHARS]})
    except Exception:   # never let the live page break a report
        log.debug("heartbeat: could not keep a report", exc_info=True)


def _put_report(client: KVStoreClient, me: str) -> None:
    with _report_lock:
        if not _report:
            return
        record = {**_report, rec.RANK: int(me)}
        _report.clear()
    client.put(REPORT_SCOPE, me, wire.pack(record))
