"""The engine: one background thread per process that negotiates and executes collectives.

The user's threads enqueue :class:`Entry` objects and get handles back. The engine thread forwards each new
request to the coordinator (rank 0) as soon as it arrives; it sleeps in ``select`` when there is nothing to
do, and an enqueue wakes it. The coordinator emits ready work at once when nothing else is in flight, and
batches for up to one cycle time (``HOROVOD_CYCLE_TIME``) while other tensors are still arriving, so Tensor
Fusion has something to fuse while a lone op is never delayed. Every rank applies the coordinator's response
lists in the same order, which is what makes the data plane's collectives line up across ranks.

Failure handling: a peer whose socket closes, or any error inside a collective, aborts the engine. Every
pending and future handle then fails with :class:`HorovodInternalError`, and this process's sockets close, so
that every other rank notices within milliseconds instead of hanging.

Waits: when a user thread blocks on a handle whose tensors this rank has not yet been told to run, the rank tells
the coordinator (``W``, on the control channel, so after the requests it sent). The coordinator then emits those
tensors at once, and knows that the rank waits. A wait that ends because the handle completed needs no message;
a timed wait that runs out is taken back (``U``) only when the handle is not waited on again within a short lapse
(:func:`stall_inspector.lapse_seconds`), so polling with short timed waits sends nothing per poll. From these
notices the coordinator's deadlock detector sees when every rank is blocked on a tensor the others never submit;
it reports that on every rank (``D``) and later ends the job like the stall inspector's shutdown.
"""
from __future__ import annotations

import collections
import logging
import os
import select
import selectors
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from horovod.backends.base import Backend
from horovod.backends.comm import PeerLostError
from horovod.backends.reduce import scale_inplace, scaled_copy
from horovod.common import wire
from horovod.common.exceptions import SHUT_DOWN_MESSAGE, HorovodInternalError
from horovod.common.timeline import Timeline, activity, executing
from horovod.common.types import ReduceOp, RequestType, numpy_dtype
from horovod.core.controller import Coordinator
from horovod.core.controller.messages import BATCH, ERROR, JOIN, PARAMS, R_NAME, TensorResponse
from horovod.core.controller.response_cache import ResponseCache
from horovod.core.engine.handles import Handle, waits_from_several_threads
from horovod.core.observers import stall_inspector
from horovod.core.observers.autotune import Autotuner

log = logging.getLogger("horovod.engine")

DUPLICATE_NAME_MESSAGE = (
    "Requested to {op} a tensor with the same name as another tensor that is currently being processed "
    "(name: '{name}'). If you want to request another tensor, use a different tensor name, or wait for the "
    "first one to finish."
)
IDLE_WAKE_SECONDS = 1.0
ABORT_REASON_WAIT_SECONDS = 0.5
LAPSE_RETRY_SECONDS = 0.01
SHUTDOWN_WAIT_SECONDS = 5.0


class Entry:
    """This rank's side of one named collective: its request, buffers and handle."""

    __slots__ = ("request", "tensor", "output", "allocate", "handle", "index")

    def __init__(self, request: list, tensor: Optional[np.ndarray], output: Optional[np.ndarray],
                 handle: Handle, index: int = 0,
                 allocate: Optional[Callable[[tuple, np.dtype], np.ndarray]] = None) -> None:
        self.request = request
        self.tensor = tensor
        self.output = output
        self.allocate = allocate
        self.handle = handle
        self.index = index

    @property
    def name(self) -> str:
        return self.request[R_NAME]


def _default_allocate(shape: tuple, dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


class Engine:
    """The background thread, its queue and the table of in-flight entries of one process."""

    def __init__(self, rank: int, size: int, backend: Backend, control: Dict[int, socket.socket],
                 cache_capacity: int, fusion_threshold: int, cycle_time_ms: float,
                 disable_group_fusion: bool = False, on_close: Optional[Callable[[], None]] = None,
                 spin_us: float = 0.0, affinity: Optional[int] = None,
                 hosts: Optional[List[str]] = None, bucket_bytes: int = 0, bucket_ms: float = 0.0,
                 autotuner: Optional[Autotuner] = None,
                 align_threshold: Callable[[int], int] = lambda nbytes: nbytes) -> None:
        self.rank = rank
        self.size = size
        self.backend = backend
        self.control = control
        self.cache = ResponseCache(cache_capacity)
        self.cycle_s = max(0.0, cycle_time_ms) / 1000.0
        self.coordinator = (Coordinator(size, self.cache, fusion_threshold, disable_group_fusion)
                            if rank == 0 else None)
        self._on_close = on_close
        self.affinity = affinity
        self.hosts = list(hosts) if hosts else ["localhost"] * size
        self._lock = threading.Lock()
        self._queue: collections.deque[Entry] = collections.deque()
        self._table: Dict[str, Entry] = {}
        self._sleeping = False
        self._spin_s = max(0.0, spin_us) / 1e6
        self._last_activity = 0.0
        self._send_lock = threading.Lock()
        # rank 0's wait notices for its engine thread: (begins, names, from a program submitting from several threads)
        self._notes: List[Tuple[bool, List[str], bool]] = []
        self._note_lock = self._lock if rank == 0 else self._send_lock     # guards the handles' wait fields
        self._lapsed: Dict[Handle, float] = {}     # handle -> when its last timed wait ran out
        self._lapse_s = stall_inspector.lapse_seconds()
        self.bucket_bytes = bucket_bytes
        self.bucket_ms = bucket_ms
        self.hold_s = self._hold_seconds()
        self.autotuner = autotuner if rank == 0 else None
        self.align_threshold = align_threshold
        self._cache_capacity = cache_capacity
        self._done_names: List[str] = []      # executed since the autotuner last looked (rank 0, autotune only)
        self._done_bytes = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stop = False
        self._dead: Optional[HorovodInternalError] = None
        self.timeline: Optional[Timeline] = None    # rank 0 only, while recording
        self.stall = stall_inspector.from_config(size) if rank == 0 and size > 1 else None
        self.deadlock = stall_inspector.deadlock_from_config(size) if rank == 0 else None
        self._thread = threading.Thread(target=self._main, name="horovod-engine", daemon=True)

    # ------------------------------------------------------------------ user side
    def start(self) -> Engine:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    def enqueue(self, entries: List[Entry]) -> None:
        """Submit entries (all or none); ValueError for a name already in flight on this rank."""
        with self._lock:
            if self._dead is not None:
                for entry in entries:
                    entry.handle.set_error(HorovodInternalError(str(self._dead)))
                return
            names = set()
            for entry in entries:
                name = entry.name
                if name in self._table or name in names:
                    op = RequestType(entry.request[1]).name.lower()
                    raise ValueError(DUPLICATE_NAME_MESSAGE.format(op=op, name=name))
                names.add(name)
            for entry in entries:
                self._table[entry.name] = entry
                entry.handle.names.append(entry.name)
                entry.handle.on_wait = self._wait_notice
            if self.coordinator is not None:
                self._queue.extend(entries)
                if self._sleeping:
                    self._sleeping = False
                    self._wake()
                return
        # A worker forwards requests to the coordinator from the calling thread: no engine wake-up on the
        # critical path. The send happens outside the table lock, so that a full socket buffer can never block
        # the engine thread (which needs the lock to execute). A send failure means the coordinator is gone:
        # the engine thread sees the closed socket and fails every entry, these included.
        try:
            self._send_control(self.control[0], ["R", [e.request for e in entries]])
        except PeerLostError:
            log.debug("rank %d: could not forward requests; the engine will report it", self.rank)

    def _wait_notice(self, handle: Handle, begins: bool) -> None:
        """A user thread starts (``begins``) or stops blocking on ``handle`` without it having completed.

        The first wait on a handle whose tensors are still in this rank's table tells the coordinator (its
        tensors are then not held back to fill a fusion bucket, and the deadlock detector knows this rank waits).
        A wait that stops is taken back only if nobody waits again within the lapse (see ``_expire_lapses``).
        """
        with self._note_lock:
            if not begins:
                handle.waiters -= 1
                if handle.waiters > 0 or not handle.noticed:
                    return
                first = not self._lapsed
                self._lapsed[handle] = time.monotonic()
                if first:
                    self._wake()                # the engine thread times the lapse
                return
            handle.waiters += 1
            if self._lapsed:
                self._lapsed.pop(handle, None)
            if handle.noticed or not self._queued(handle):
                return
            handle.noticed = True
            if self.coordinator is None:
                # Under the send lock: the notice follows this rank's requests, and no request for a later
                # tensor of the same name can be sent between the table check and the notice.
                try:
                    notice = ["W", list(handle.names)]
                    if waits_from_several_threads():
                        notice.append(True)     # see handles.several_threads
                    wire.send_msg(self.control[0], notice)
                except OSError:
                    pass                        # the engine thread reports the lost coordinator
                return
            self._notes.append((True, list(handle.names), waits_from_several_threads()))
            if self._sleeping:
                self._sleeping = False
                self._wake()

    def _queued(self, handle: Handle) -> bool:
        """True while ``handle``'s tensors wait in this rank's table (not yet emitted by the coordinator)."""
        names = handle.names
        entry = self._table.get(names[0]) if names else None
        return entry is not None and entry.handle is handle

    def _expire_lapses(self) -> Optional[float]:
        """Take back the wait notices of handles whose timed wait ran out a lapse ago and that nobody waits on
        again; returns the seconds until the next lapse is due (None: none left). Engine thread.

        A worker's engine thread must never block on the control socket (the coordinator may be waiting for it
        in a collective while a flood of requests fills the socket): when a user thread holds the send lock, or
        the socket cannot take a message now, it tries again shortly.
        """
        worker = self.coordinator is None
        if not self._note_lock.acquire(blocking=not worker):
            return LAPSE_RETRY_SECONDS
        now = time.monotonic()
        due = None
        expired = []
        try:
            if worker and not select.select([], [self.control[0]], [], 0)[1]:
                return LAPSE_RETRY_SECONDS
            for handle, since in list(self._lapsed.items()):
                if handle.waiters > 0 or not handle.noticed:
                    del self._lapsed[handle]
                    continue
                left = since + self._lapse_s - now
                if left > 0:
                    due = left if due is None else min(due, left)
                    continue
                del self._lapsed[handle]
                handle.noticed = False
                if self._queued(handle):
                    expired.append(list(handle.names))
            if expired and worker:
                for names in expired:
                    try:
                        wire.send_msg(self.control[0], ["U", names])
                    except OSError as exc:
                        raise PeerLostError(0, self._host_of(0), str(exc)) from None
        finally:
            self._note_lock.release()
        if expired and not worker:
            for names in expired:
                self.coordinator.unmark_waiting(0, names)
        return due

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def shutdown(self) -> None:
        """Stop the engine: tell the coordinator (or, on rank 0, everyone) and wait for the thread."""
        with self._lock:
            self._stop = True
            self._wake()
        self._thread.join(SHUTDOWN_WAIT_SECONDS + 5.0)
        if self._thread.is_alive():
            log.warning("rank %d: the engine thread did not stop in time; abandoning it", self.rank)
            self._fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))

    def start_timeline(self, path: str, mark_cycles: bool = False) -> None:
        """Record a timeline to ``path`` (rank 0 writes it; other ranks have nothing to record)."""
        if self.coordinator is None:
            return
        new = Timeline(path, mark_cycles)
        old, self.timeline = self.timeline, new
        self.coordinator.timeline = new
        if old is not None:
            old.close()

    def stop_timeline(self) -> None:
        """Stop recording and close the file (a no-op when no timeline records)."""
        old, self.timeline = self.timeline, None
        if self.coordinator is not None:
            self.coordinator.timeline = None
        if old is not None:
            old.close()

    # ---------------------------------------------------------------- engine side
    def _main(self) -> None:
        if self.affinity is not None:
            try:
                os.sched_setaffinity(0, {self.affinity})   # 0 = the calling thread on Linux
            except (OSError, AttributeError) as exc:
                log.warning("rank %d: could not pin the engine thread to core %s: %s", self.rank, self.affinity, exc)
        try:
            if self.coordinator is not None:
                self._coordinator_loop()
            else:
                self._worker_loop()
        except PeerLostError as exc:
            self._abort(self._root_cause(str(exc)))
        except HorovodInternalError as exc:
            self._abort(str(exc))
        except Exception as exc:
            log.exception("rank %d: the Horovod engine failed", self.rank)
            self._abort(f"Horovod background thread failed on rank {self.rank}: {type(exc).__name__}: {exc}")
        finally:
            self._close()

    def _drain(self) -> List[Entry]:
        queue = self._queue
        if not queue:
            return []
        out = []
        while queue:
            out.append(queue.popleft())
        return out

    def _sleep(self, selector: selectors.BaseSelector, timeout: Optional[float]):
        """Wait for the next event: poll briefly after real work (see ``_active``), then block in the kernel."""
        now = time.perf_counter()
        spin_until = self._last_activity + self._spin_s
        while now < spin_until:
            if self._queue or self._stop or self._notes:
                return []
            events = selector.select(0)
            if events:
                return events
            if timeout is not None and timeout <= 0:
                return []
            now = time.perf_counter()
        with self._lock:
            if self._queue or self._stop or self._notes:
                return []
            self._sleeping = True
        events = selector.select(timeout)
        self._sleeping = False
        return events

    def _active(self) -> None:
        """Something happened after which an answer is due soon (a collective ran, a rank waits): poll a while.

        Merely receiving a request is not such a thing: while gradients stream in during backward, polling after
        each one would only take CPU from the computation.
        """
        self._last_activity = time.perf_counter()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    # --- coordinator (rank 0)
    def _coordinator_loop(self) -> None:
        coord = self.coordinator
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, -1)
        for peer, sock in self.control.items():
            selector.register(sock, selectors.EVENT_READ, peer)
        shutdown_reason = None
        while True:
            # Take new requests and wait notices in one grab: a thread notices a wait only after it enqueued the
            # tensors, so the request is always taken together with (or before) its notice.
            with self._lock:
                entries = self._drain()
                notes = self._notes
                if notes:
                    self._notes = []
            for entry in entries:
                coord.add_request(0, entry.request)
            if notes:
                for begins, names, several in notes:
                    if begins:
                        coord.mark_waiting(0, names, several)
                    else:
                        coord.unmark_waiting(0, names)
                self._active()
            lapse_due = self._expire_lapses() if self._lapsed else None
            if self._stop and shutdown_reason is None:
                shutdown_reason = "rank 0 called hvd.shutdown()"
            if shutdown_reason is not None:
                self._broadcast(["S", shutdown_reason], best_effort=True)
                self._fail_all(HorovodInternalError(f"{SHUT_DOWN_MESSAGE} (Reason: {shutdown_reason}.)"))
                return
            due = coord.emit_due(time.monotonic(), self.bucket_bytes, self.hold_s)
            for other in (self._inspect_stalls(coord), lapse_due):
                if other is not None:
                    due = other if due is None else min(due, other)
            if due == 0.0:
                timeline = self.timeline
                if timeline is not None:
                    timeline.cycle()
                items = coord.take_ready()
                if items:
                    self._broadcast(["L", items])
                    self._apply(items)
                    self._active()
                    if self.autotuner is not None:
                        self._autotune()
                continue
            timeout = IDLE_WAKE_SECONDS if due is None else due
            for key, _ in self._sleep(selector, timeout):
                peer = key.data
                if peer == -1:
                    self._drain_wake()
                    continue
                msg = self._recv_control(peer, key.fileobj)
                kind = msg[0]
                if kind == "R":
                    for request in msg[1]:
                        coord.add_request(peer, request)
                elif kind == "W":
                    coord.mark_waiting(peer, msg[1], len(msg) > 2 and bool(msg[2]))
                    self._active()
                elif kind == "U":
                    coord.unmark_waiting(peer, msg[1])
                elif kind == "X":
                    shutdown_reason = f"rank {peer} called hvd.shutdown()"
                    selector.unregister(key.fileobj)
                elif kind == "A":
                    raise HorovodInternalError(msg[1])

    def _autotune(self) -> None:
        """Feed the autotuner what just ran; when it proposes new values, every rank applies them next."""
        names, self._done_names = self._done_names, []
        nbytes, self._done_bytes = self._done_bytes, 0
        params = self.autotuner.record(names, nbytes, time.monotonic())
        if params is not None:
            item = [PARAMS, params]
            self._broadcast(["L", [item]])
            self._apply([item])
        if self.autotuner.done:
            self.autotuner.close()
            self.autotuner = None

    def _hold_seconds(self) -> float:
        """How long the coordinator may hold a ready tensor nobody waits on: the cycle time or the bucket window."""
        return max(self.cycle_s, self.bucket_ms / 1000.0 if self.bucket_bytes > 0 else 0.0)

    def _set_params(self, params: dict) -> None:
        """Apply tunables decided by rank 0's autotuner (every rank, at the same point of the stream)."""
        if "cycle_time_ms" in params:
            self.cycle_s = max(0.0, float(params["cycle_time_ms"])) / 1000.0
            self.hold_s = self._hold_seconds()
        if "fusion_threshold" in params and self.coordinator is not None:
            self.coordinator.fusion_threshold = self.align_threshold(int(params["fusion_threshold"]))
        if "cache_enabled" in params:
            wanted = self._cache_capacity if params["cache_enabled"] else 0
            if wanted != self.cache.capacity:
                self.cache.set_capacity(wanted)

    def _inspect_stalls(self, coord: Coordinator) -> Optional[float]:
        """Run the stall inspector and the deadlock detector when due; seconds until one is due again (None:
        nothing is partial). A shutdown by either raises, which ends the job on every rank."""
        inspector, detector = self.stall, self.deadlock
        if (inspector is None and detector is None) or not coord.has_partial():
            return None
        now = time.monotonic()
        due = IDLE_WAKE_SECONDS
        if inspector is not None:
            if now >= inspector.next_check:
                message = inspector.check(coord.pending_names(), coord.joined, now)
                if message is not None:
                    raise HorovodInternalError(message)
            due = min(due, inspector.due_in(now))
        if detector is not None:
            if now >= detector.next_check:
                verdict = detector.check(coord.waits(), coord.joined, coord.has_ready(), coord.progress, now,
                                         several_threads=coord.several_threads)
                if verdict is not None:
                    kind, message = verdict
                    if kind == stall_inspector.SHUTDOWN:
                        raise HorovodInternalError(message)
                    self._broadcast(["D", message], best_effort=True)     # every rank logs the report
            due = min(due, detector.due_in(now))
        return max(due, 1e-3)

    def _broadcast(self, msg: list, best_effort: bool = False) -> None:
        """Send ``msg`` to every worker; with ``best_effort`` (shutdown, abort) skip peers that are gone."""
        payload = wire.pack(msg)
        frame = len(payload).to_bytes(4, "little") + payload
        for peer, sock in self.control.items():
            try:
                sock.sendall(frame)
            except OSError as exc:
                if not best_effort:
                    raise PeerLostError(peer, self._host_of(peer), str(exc)) from None

    def _recv_control(self, peer: int, sock: socket.socket) -> list:
        try:
            return wire.recv_msg(sock)
        except (OSError, wire.PeerClosedError) as exc:
            raise PeerLostError(peer, self._host_of(peer), str(exc) or "connection closed") from None

    def _host_of(self, peer: int) -> str:
        return self.hosts[peer] if 0 <= peer < len(self.hosts) else "?"

    # --- worker (rank != 0)
    def _worker_loop(self) -> None:
        sock = self.control[0]
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, -1)
        selector.register(sock, selectors.EVENT_READ, 0)
        stop_sent_at = None
        while True:
            if self._stop and stop_sent_at is None:
                try:
                    with self._send_lock:
                        wire.send_msg(sock, ["X"])
                except OSError:
                    # The coordinator already closed (it shut down first): nothing left to tell it.
                    self._fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))
                    return
                stop_sent_at = time.monotonic()
            timeout = IDLE_WAKE_SECONDS
            if self._lapsed:
                lapse_due = self._expire_lapses()
                if lapse_due is not None:
                    timeout = min(timeout, lapse_due)
            if stop_sent_at is not None:
                timeout = SHUTDOWN_WAIT_SECONDS - (time.monotonic() - stop_sent_at)
                if timeout <= 0:
                    self._fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))
                    return
            for key, _ in self._sleep(selector, timeout) if not self._stop else selector.select(timeout):
                if key.data == -1:
                    self._drain_wake()
                    continue
                try:
                    msg = wire.recv_msg(sock)
                except (OSError, wire.PeerClosedError) as exc:
                    if stop_sent_at is not None:
                        self._fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))
                        return
                    raise PeerLostError(0, self._host_of(0), str(exc) or "connection closed") from None
                kind = msg[0]
                if kind == "L":
                    self._apply(msg[1])
                    self._active()
                elif kind == "S":
                    self._fail_all(HorovodInternalError(f"{SHUT_DOWN_MESSAGE} (Reason: {msg[1]}.)"))
                    return
                elif kind == "A":
                    raise HorovodInternalError(msg[1])
                elif kind == "D":
                    stall_inspector.log.error("%s", msg[1])

    def _send_control(self, sock: socket.socket, msg: list) -> None:
        try:
            with self._send_lock:
                wire.send_msg(sock, msg)
        except OSError as exc:
            raise PeerLostError(0, self._host_of(0), str(exc)) from None

    # ------------------------------------------------------------------ execution
    def _apply(self, items: List[list]) -> None:
        """Decode a response list against the cache state before it, update the cache, then execute it."""
        cache = self.cache
        decoded = []
        for item in items:
            kind = item[0]
            if kind == BATCH:
                batch = [cache.get(x) if isinstance(x, int) else TensorResponse.from_wire(x) for x in item[1]]
                decoded.append((BATCH, batch, item[1]))
            else:
                decoded.append((kind, item, None))
        for kind, batch, raw in decoded:
            if kind == BATCH and cache.enabled:
                for response, ref in zip(batch, raw):
                    if isinstance(ref, int):
                        cache.touch(ref)
                    else:
                        cache.put(response)
        for kind, payload, _ in decoded:
            if kind == BATCH:
                self._execute(payload)
            elif kind == ERROR:
                timeline = self.timeline
                for name in payload[1]:
                    if timeline is not None:
                        timeline.end_error(name, payload[2])
                    entry = self._pop(name)
                    if entry is not None:
                        entry.handle.set_error(HorovodInternalError(payload[2]))
                if timeline is not None:
                    timeline.flush_soon()
            elif kind == PARAMS:
                self._set_params(payload[1])
            elif kind == JOIN:
                entry = self._pop("join.noname")
                if entry is not None:
                    entry.handle.set_result(entry.index, payload[1])

    def _pop(self, name: str) -> Optional[Entry]:
        with self._lock:
            return self._table.pop(name, None)

    def _execute(self, batch: List[TensorResponse]) -> None:
        with self._lock:
            entries = [self._table.pop(r.name, None) for r in batch]
        timeline = self.timeline
        if self.autotuner is not None:
            self._done_names.extend(r.name for r in batch)
            self._done_bytes += sum(r.numel() * numpy_dtype(r.dtype).itemsize for r in batch)
        try:
            if timeline is None:
                self._run_batch(batch, entries)
            else:
                self._run_recorded(timeline, batch, entries)
        except BaseException as exc:
            # These entries already left the table, so the abort that follows cannot reach them: fail them here.
            error = HorovodInternalError(str(exc) if isinstance(exc, (PeerLostError, HorovodInternalError)) else
                                         f"{RequestType(batch[0].rtype).name} of tensor '{batch[0].name}' failed "
                                         f"on rank {self.rank}: {type(exc).__name__}: {exc}")
            for entry in entries:
                if entry is not None:
                    entry.handle.set_error(error)
            raise

    def _run_recorded(self, timeline: Timeline, batch: List[TensorResponse],
                      entries: List[Optional[Entry]]) -> None:
        """Run a batch while the data plane marks its activities on the timeline, then end each tensor's op."""
        executing(timeline, [r.name for r in batch])
        try:
            self._run_batch(batch, entries)
        finally:
            executing(None, [])
            now = time.perf_counter_ns()
            for response in batch:
                timeline.end_op(response.name, numpy_dtype(response.dtype).name, response.shape, now)
            timeline.flush_soon()               # a finished op shows up in the file at once

    def _run_batch(self, batch: List[TensorResponse], entries: List[Optional[Entry]]) -> None:
        first = batch[0]
        rtype = first.rtype
        backend = self.backend
        dtype = numpy_dtype(first.dtype)
        if rtype == RequestType.ALLREDUCE:
            op = first.reduce_op
            postscale = first.postscale
            if op == ReduceOp.AVERAGE:
                op = ReduceOp.SUM
                postscale = postscale / self.size
            inputs, outputs = [], []
            for response, entry in zip(batch, entries):
                if entry is None:           # this rank joined: contribute zeros
                    zeros = np.zeros(response.numel(), dtype)
                    inputs.append(zeros)
                    outputs.append(zeros)
                else:
                    inputs.append(entry.tensor.reshape(-1))
                    outputs.append(entry.output.reshape(-1))
            backend.allreduce(inputs, outputs, ReduceOp(op), first.prescale, postscale)
            for entry in entries:
                if entry is not None:
                    entry.handle.set_result(entry.index, entry.output)
        elif rtype == RequestType.ALLGATHER:
            entry = entries[0]
            row = int(np.prod(first.shape)) if first.shape else 1
            counts = [d * row for d in first.extra]
            out = (entry.allocate or _default_allocate)((sum(first.extra), *first.shape), dtype)
            with activity(backend.op_label("ALLGATHER", out.nbytes)):
                backend.allgatherv(entry.tensor.reshape(-1), out.reshape(-1), counts)
            entry.handle.set_result(entry.index, out)
        elif rtype == RequestType.BROADCAST:
            entry = entries[0]
            out = entry.output
            if out is not entry.tensor and self.rank == first.root:
                np.copyto(out, entry.tensor)
            with activity(backend.op_label("BCAST", out.nbytes)):
                backend.broadcast(out.reshape(-1), first.root)
            entry.handle.set_result(entry.index, out)
        elif rtype == RequestType.ALLTOALL:
            entry = entries[0]
            matrix = first.extra
            row = int(np.prod(first.shape)) if first.shape else 1
            received = [matrix[src][self.rank] for src in range(self.size)]
            out = (entry.allocate or _default_allocate)((sum(received), *first.shape), dtype)
            max_count = max(max(r) for r in matrix) * row
            with activity(backend.op_label("ALLTOALL", max_count * self.size * dtype.itemsize)):
                backend.alltoallv(entry.tensor.reshape(-1), [s * row for s in matrix[self.rank]], out.reshape(-1),
                                  [r * row for r in received], max_count=max_count)
            entry.handle.set_result(entry.index, (out, np.asarray(received, np.int32)))
        elif rtype == RequestType.REDUCESCATTER:
            entry = entries[0]
            shape = first.shape
            rows = [shape[0] // self.size + (1 if r < shape[0] % self.size else 0) for r in range(self.size)]
            row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            out = (entry.allocate or _default_allocate)((rows[self.rank], *shape[1:]), dtype)
            inp = entry.tensor.reshape(-1)
            if first.prescale != 1.0:
                scaled = np.empty_like(inp)
                scaled_copy(scaled, inp, first.prescale)
                inp = scaled
            op = first.reduce_op
            postscale = first.postscale
            if op == ReduceOp.AVERAGE:
                op, postscale = ReduceOp.SUM, postscale / self.size
            with activity(backend.op_label("REDUCESCATTER", inp.nbytes)):
                backend.reducescatter(inp, out.reshape(-1), [r * row for r in rows], ReduceOp(op))
            scale_inplace(out, postscale)
            entry.handle.set_result(entry.index, out)
        elif rtype == RequestType.BARRIER:
            for entry in entries:
                if entry is not None:
                    entry.handle.set_result(entry.index, None)
        else:
            raise HorovodInternalError(f"unsupported response type {rtype}")

    # ------------------------------------------------------------------ failure
    def _fail_all(self, error: HorovodInternalError) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = error
            entries = list(self._table.values())
            self._table.clear()
            self._queue.clear()
        for entry in entries:
            entry.handle.set_error(HorovodInternalError(str(error)))

    def _root_cause(self, own: str) -> str:
        """The reason to report for a lost peer: an abort message already on its way wins over our own view.

        When one rank dies, the ranks that notice first abort and close their sockets, so others may see *those*
        ranks' sockets close and would blame the wrong rank. Every aborting rank sends its reason on the control
        channel before closing, so we listen there briefly for a better-informed reason.
        """
        socks = dict(self.control)
        deadline = time.monotonic() + ABORT_REASON_WAIT_SECONDS
        selector = selectors.DefaultSelector()
        try:
            for peer, sock in socks.items():
                selector.register(sock, selectors.EVENT_READ, peer)
            while socks and time.monotonic() < deadline:
                for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
                    try:
                        msg = wire.recv_msg(key.fileobj)
                    except (OSError, ValueError, wire.PeerClosedError):
                        selector.unregister(key.fileobj)
                        socks.pop(key.data, None)
                        continue
                    if msg and msg[0] == "A":
                        return msg[1]
        finally:
            selector.close()
        return own

    def _abort(self, reason: str) -> None:
        log.error("rank %d: %s", self.rank, reason)
        try:
            if self.coordinator is not None:
                self._broadcast(["A", reason], best_effort=True)
            elif 0 in self.control:
                with self._send_lock:
                    wire.send_msg(self.control[0], ["A", reason])
        except Exception:
            pass
        self._fail_all(HorovodInternalError(reason))

    def _close(self) -> None:
        if self.autotuner is not None:
            self.autotuner.close()
        with self._lock:
            if self._dead is None:
                self._dead = HorovodInternalError(SHUT_DOWN_MESSAGE)
        for sock in (self._wake_r, self._wake_w):
            try:
                sock.close()
            except OSError:
                pass
        if self._on_close is not None:
            try:
                self._on_close()
            except Exception:
                log.debug("rank %d: error while closing the data plane", self.rank, exc_info=True)
