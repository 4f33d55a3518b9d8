"""The engine: one background thread per process that negotiates and executes collectives.

The user's threads enqueue :class:`Entry` objects and get handles back. The engine thread forwards each new
request to the coordinator (rank 0) as soon as it arrives; it sleeps in ``select`` when there is nothing to
do, and an enqueue wakes it. The coordinator emits ready work at once when nothing else is in flight, and
batches for up to one cycle time (``HOROVOD_CYCLE_TIME``) while other tensors are still arriving, so Tensor
Fusion has something to fuse while a lone op is never delayed. Every rank applies the coordinator's response
lists in the same order, which is what makes the data plane's collectives line up across ranks.

The parts, one module each: :mod:`.settings` (what it runs with), :mod:`.state` (its life cycle),
:mod:`.entry` (a submitted collective), :mod:`.control` (the control channel), :mod:`.loops` (the coordinator's
and the workers' loops), :mod:`.waits` (wait notices, for the deadlock detector), :mod:`.executors` (one per
collective, with :mod:`.layouts`), :mod:`.device_executors` and :mod:`.device_planes` (device buffers,
docs/gpu.md), :mod:`.fast_rounds` (small blocking collectives without the coordinator), :mod:`.carried`
(small blocking collectives whose data travels with the negotiation), :mod:`.handles`, :mod:`.output_pool`
(memory for new outputs), :mod:`.observer` (the hooks that the timeline, stall inspector and autotuner
implement), :mod:`.flight` (the flight record of recent collectives) and :mod:`.lifecycle` (who hears of engines
starting and stopping: the data-plane watchdog). No part imports this module: each one that works with
the engine names what it needs of it in a protocol (``executors.Executing``, ``loops.Looping``,
``waits.Noticing``, ``fast_rounds.Parking``), which :class:`Engine` satisfies. The engine thread publishes the
batch it runs (``running``) for the watchdog, and fails a stalled batch with the watchdog's report
(``stall_reason``).

Failure handling: a peer whose socket closes, or any error inside a collective, aborts the engine. Every
pending and future handle then fails with :class:`HorovodInternalError`, and this process's sockets close, so
that every other rank notices within milliseconds instead of hanging.
"""
from __future__ import annotations

import collections
import logging
import os
import selectors
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

from horovod.backends.base import Backend
from horovod.backends.comm import PeerLostError
from horovod.backends.shm import fast_area_bytes
from horovod.common.exceptions import SHUT_DOWN_MESSAGE, HorovodInternalError
from horovod.common.types import RequestType
from horovod.core.controller import Coordinator
from horovod.core.controller.messages import Tag, TensorResponse
from horovod.core.controller.response_cache import ResponseCache
from horovod.core.engine import carried, fast_rounds, flight, lifecycle, loops
from horovod.core.engine.control import ControlChannel
from horovod.core.engine.device_planes import DevicePlanes
from horovod.core.engine.entry import Entry
from horovod.core.engine.executors import run_batch
from horovod.core.engine.handles import Handle
from horovod.core.engine.observer import EngineObserver, Hooks
from horovod.core.engine.settings import EngineSettings
from horovod.core.engine.state import EngineState
from horovod.core.engine.waits import Note, WaitNotices

log = logging.getLogger(__name__)

DUPLICATE_NAME_MESSAGE = (
    "Requested to {op} a tensor with the same name as another tensor that is currently being processed "
    "(name: '{name}'). If you want to request another tensor, use a different tensor name, or wait for the "
    "first one to finish."
)
SHUTDOWN_WAIT_SECONDS = loops.SHUTDOWN_WAIT_SECONDS
ObserverT = TypeVar("ObserverT", bound=EngineObserver)
_RUNNING = EngineState.RUNNING      # a module global: a tenth of the enum class's attribute lookup (hot paths)


class Engine:
    """The background thread, its queue and the table of in-flight entries of one process."""

    def __init__(self, rank: int, size: int, backend: Backend, control: Dict[int, socket.socket],
                 settings: Optional[EngineSettings] = None, on_close: Optional[Callable[[], None]] = None,
                 observers: Sequence[EngineObserver] = (), ranks: Optional[Sequence[int]] = None,
                 process_set_id: int = 0) -> None:
        self.rank = rank            # positions within this engine's process set ...
        self.size = size
        self.ranks = list(ranks) if ranks is not None else list(range(size))     # ... and their global ranks
        self.global_rank = self.ranks[rank]
        self.process_set_id = process_set_id
        self.backend = backend
        self.devices = DevicePlanes(rank, size, backend)      # device buffers' planes, made on first use
        self.settings = settings = settings if settings is not None else EngineSettings()
        self.control = ControlChannel(rank, control, settings.hosts, size, self.ranks)
        self.cache = ResponseCache(settings.cache_capacity)
        self.hold_s = settings.hold_seconds()
        self.coordinator = (Coordinator(size, self.cache, settings.fusion_threshold, settings.disable_group_fusion,
                                        self.ranks)
                            if rank == 0 else None)
        self._on_close = on_close
        self.lock = threading.Lock()
        self.queue: collections.deque[Entry] = collections.deque()
        self.table: Dict[str, Entry] = {}
        self.fast = self._fast_rounds(backend)
        self.flight_ring = (flight.FlightRing(settings.flight_recorder_size, process_set_id, self.ranks, rank,
                                              flight.plane_namer(backend))
                            if settings.flight_recorder_size > 0 else None)
        self.fast_entries: Tuple[Entry, ...] = ()     # this rank's open fast round's op (a group's members), if any
        self.carried_ops = 0            # carried collectives completed here (carried.py; tests and benchmarks read it)
        self.parks: List[loops.Park] = []    # rank 0's fast waits for its engine thread to tell the coordinator
        self.sleeping = False
        self.spin_s = max(0.0, settings.spin_us) / 1e6
        self.last_activity = 0.0
        self.woke_waiter = False        # the response list just run completed a handle that a thread waits on
        self.waits = WaitNotices(self, settings.wait_lapse_s)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.state = EngineState.RUNNING
        self.error: Optional[HorovodInternalError] = None     # why it stopped, once STOPPED
        # The batch the engine thread is running and since when (the data-plane watchdog reads it), and the
        # watchdog's report when it ended a stalled collective (the failure then carries it).
        self.running: Optional[Tuple[List[TensorResponse], float]] = None
        self.stall_reason: Optional[str] = None
        self._orphans: List[Entry] = []       # a failed batch's entries, for the abort to fail with its reason
        self.hooks = Hooks()
        for observer in observers:
            self.add_observer(observer)
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name="horovod-engine" + (f"-ps{process_set_id}" if process_set_id else ""))

    # ------------------------------------------------------------------ user side
    def start(self) -> Engine:
        self._thread.start()
        lifecycle.tell(self, True)
        return self

    @property
    def thread_ident(self) -> Optional[int]:
        """The engine thread's identifier (None before it starts)."""
        return self._thread.ident

    @property
    def alive(self) -> bool:
        return self.state is not EngineState.STOPPED and self._thread.is_alive()

    @property
    def observers(self) -> Sequence[EngineObserver]:
        return self.hooks.all

    @property
    def cycle_s(self) -> float:
        """The negotiation cycle time in seconds (the autotuner may change it)."""
        return max(0.0, self.settings.cycle_time_ms) / 1000.0

    def add_observer(self, observer: EngineObserver) -> None:
        """Have ``observer`` watch this engine from its next step on (any thread)."""
        observer.attach(self.coordinator)
        self.hooks = Hooks.of((*self.hooks.all, observer))

    def remove_observer(self, observer: EngineObserver) -> None:
        """Stop ``observer`` watching (a no-op when it does not); the caller closes it."""
        if observer in self.hooks.all:
            self.hooks = Hooks.of(o for o in self.hooks.all if o is not observer)
            observer.detach(self.coordinator)

    def find_observer(self, kind: Type[ObserverT]) -> Optional[ObserverT]:
        """The first observer of class ``kind`` watching this engine, if any."""
        return next((o for o in self.hooks.all if isinstance(o, kind)), None)

    def _fast_rounds(self, backend: Backend) -> Optional[fast_rounds.FastRounds]:
        """Fast rounds when every rank of the set shares this host's segment (see fast_rounds.py), and for a set
        of one rank (a private area: every round matches at once). An area too small for the set's ranks (a
        one-rank plane under a larger set, as the engine's tests make) gives none."""
        area = getattr(backend, "fast_area", None)
        if area is None or not self.settings.fast_rounds or not fast_rounds.supported():
            return None
        made = area()
        if made.nbytes < fast_area_bytes(self.size):
            return None
        pids = getattr(backend, "cross_memory_pids", lambda: None)()
        return fast_rounds.FastRounds(made, self.rank, self.size, self.ranks, pids)

    def enqueue(self, entries: List[Entry]) -> None:
        """Submit entries (all or none); ValueError for a name already in flight on this rank."""
        self._admit(entries, post=True)

    def submit_blocking(self, entry: Entry) -> None:
        """Submit one collective whose caller waits for it right away (a blocking call, never an async one).

        A small allreduce may then run as a fast round: agreed and reduced through shared memory, its handle
        complete when this returns. Otherwise, or when the round does not match, it goes the usual way.
        """
        fast = self.fast
        key = None
        if fast is not None and entry.tensor is not None and not self.hooks.batch:
            key = fast.key(entry.request, entry.tensor.nbytes)
        if key is None:
            if fast is None and entry.tensor is not None:
                entry.carried = (carried.carries(entry.request, entry.tensor.nbytes, self.size,
                                                 self.settings.coordinator_carry_bytes)
                                 and carried.sends_input(entry.request, self.global_rank))
            self._admit([entry], post=True, waited=True)
            return
        self._fast_round((entry,), key, None)

    def submit_blocking_group(self, entries: List[Entry]) -> None:
        """Submit a grouped allreduce whose caller waits for it right away (one submission, all or none).

        Small host tensors together may then run as one grouped fast round (fast_rounds.py); otherwise, or when
        the round does not match, the group goes the usual way.
        """
        fast = self.fast
        key = None
        if fast is not None and not self.hooks.batch and all(e.tensor is not None for e in entries):
            key = fast.group_key(entries)
        if key is None:
            self._admit(entries, post=True, waited=True)
            return
        self._fast_round(tuple(entries), key, entries)

    def _fast_round(self, entries: Tuple[Entry, ...], key: bytes, members: Optional[List[Entry]]) -> None:
        """Run ``entries`` (one op, or a group's ``members``) as a fast round of ``key`` when this rank is idle,
        else, or when the round does not match, through the coordinator; their handle is complete on return."""
        fast, entry = self.fast, entries[0]
        with self.lock:
            # Idle: everything this rank submitted before was emitted by the coordinator, so every peer has
            # submitted it too (fast_rounds.py says why a round then always closes).
            if (self.state is not _RUNNING or self.table or self.queue or self.fast_entries
                    or not fast.can_post_fast()):
                k = 0
            else:
                k = fast.post_fast(entry, key) if members is None else fast.post_fast_group(members, key)
                self.fast_entries = entries
                if self.flight_ring is not None:
                    self.flight_ring.submit(entries, time.time())
        if not k:
            self._admit(list(entries), post=True, waited=True)
            return
        fast.ring()
        try:
            matched = fast.resolve(k, key, entry, self, members)
        except HorovodInternalError as exc:
            with self.lock:
                self.fast_entries = ()
            flight.failed(entries, time.time(), str(exc))
            for failed in entries:             # each part of a group's handle finishes
                failed.handle.set_error(exc)
            return
        if matched:
            with self.lock:
                self.fast_entries = ()
            now = time.time()
            for done in entries:
                flight.fast_round(done.flight, now)
                done.handle.set_result(done.index, done.output)
            return
        self._admit(list(entries), post=False, waited=True)      # the round did not match: the coordinator decides

    def _admit(self, entries: List[Entry], post: bool, waited: bool = False) -> None:
        """Put entries in the table and send their requests; ``post``: record the submission for the fast
        rounds (False for an op whose fast round did not match: it was recorded then). ``waited``: a blocking
        call, whose caller waits on the handle at once: a worker's request then carries the wait notice that
        the wait would send next (:mod:`horovod.core.engine.waits`), one message instead of two."""
        fast = self.fast
        with self.lock:
            if self.state is EngineState.STOPPED:
                if not post:
                    self.fast_entries = ()
                    flight.failed(entries, time.time(), str(self.error))
                for entry in entries:
                    entry.handle.set_error(HorovodInternalError(str(self.error)))
                return
            names = set()
            pending = self.fast_entries if post else ()
            for entry in entries:
                name = entry.name
                if name in self.table or name in names or any(p.name == name for p in pending):
                    op = RequestType(entry.request.rtype).name.lower()
                    raise ValueError(DUPLICATE_NAME_MESSAGE.format(op=op, name=name))
                names.add(name)
            if fast is not None:
                if post:
                    fast.post_slow(seal=entries[0].request.rtype == RequestType.JOIN)
                else:
                    self.fast_entries = ()
            if post and self.flight_ring is not None:
                self.flight_ring.submit(entries, time.time())
            # A blocking call's answer is due within a round trip: the engine thread polls until it comes
            # (woken, if asleep, once the request is sent), so that no wake-up lies on the answer's path.
            poll = waited and self.spin_s > 0
            if poll:
                self.active()
            notice = self.waits.notice
            for entry in entries:
                self.table[entry.name] = entry
                entry.handle.names.append(entry.name)
                entry.handle.on_wait = notice
            on_rank_0 = self.coordinator is not None
            if on_rank_0:
                self.queue.extend(entries)
                self.wake_if_sleeping()
        if post and fast is not None:
            fast.ring()            # a peer waiting on its fast round may now see this record
        if on_rank_0:
            return
        # A worker forwards requests to the coordinator from the calling thread: no engine wake-up on the
        # critical path. The send happens outside the table lock, so that a full socket buffer can never block
        # the engine thread (which needs the lock to execute). A send failure means the coordinator is gone:
        # the engine thread sees the closed socket and fails every entry, these included.
        message = [Tag.REQUESTS, [e.request for e in entries]]
        if waited:
            message.append(self.waits.notice_with_requests(entries[0].handle))
            if entries[0].carried:
                message.append([carried.payload(entries[0].tensor)])
        try:
            self.control.send_to_coordinator(message)
        except PeerLostError:
            log.debug("rank %d: could not forward requests; the engine will report it", self.global_rank)
        if poll:
            with self.lock:         # after the send: a polling engine thread contends for the GIL with it
                self.wake_if_sleeping()

    def park(self, entry: Entry, since: float) -> None:
        """Tell the coordinator that this rank has waited on ``entry``'s fast round since ``since`` (monotonic
        time), so that its stall inspector counts the tensor as submitted by this rank and not by the others."""
        self._tell_parked(True, entry.name, time.monotonic() - since)

    def unpark(self, entry: Entry) -> None:
        """The fast round that :meth:`park` reported has closed."""
        self._tell_parked(False, entry.name, 0.0)

    def _tell_parked(self, parked: bool, name: str, waited: float) -> None:
        if self.coordinator is not None:
            with self.lock:
                self.parks.append((parked, name, waited))
                self.wake_if_sleeping()
            return
        try:
            self.control.send_to_coordinator([Tag.PARKED, name, waited] if parked else [Tag.UNPARKED, name])
        except PeerLostError:
            pass                        # the engine thread reports the lost coordinator

    def in_flight(self) -> List[str]:
        """The names of the collectives submitted on this rank and not completed yet."""
        with self.lock:
            return list(self.table)

    def queued(self, handle: Handle) -> bool:
        """True while ``handle``'s tensors wait in this rank's table (not yet emitted by the coordinator)."""
        names = handle.names
        entry = self.table.get(names[0]) if names else None
        return entry is not None and entry.handle is handle

    def wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def wake_if_sleeping(self) -> None:
        """Wake the engine thread if it sleeps in the kernel (call with the engine lock held)."""
        if self.sleeping:
            self.sleeping = False
            self.wake()

    def shutdown(self) -> None:
        """Stop the engine: tell the coordinator (or, on rank 0, everyone) and wait for the thread."""
        with self.lock:
            if self.state is EngineState.RUNNING:
                self.state = EngineState.STOPPING
            self.wake()
        self._thread.join(SHUTDOWN_WAIT_SECONDS + 5.0)
        if self._thread.is_alive():
            log.warning("rank %d: the engine thread did not stop in time; abandoning it", self.global_rank)
            self.fail_all(HorovodInternalError(SHUT_DOWN_MESSAGE))

    @property
    def stopping(self) -> bool:
        """True once a shutdown was asked for (or the engine stopped)."""
        return self.state is not EngineState.RUNNING

    # ---------------------------------------------------------------- engine side
    def _main(self) -> None:
        if self.settings.affinity is not None:
            try:
                os.sched_setaffinity(0, {self.settings.affinity})   # 0 = the calling thread on Linux
            except (OSError, AttributeError) as exc:
                log.warning("rank %d: could not pin the engine thread to core %s: %s", self.global_rank,
                            self.settings.affinity, exc)
        try:
            if self.coordinator is not None:
                loops.coordinator_loop(self)
            else:
                loops.worker_loop(self)
        except PeerLostError as exc:
            self._aborting()
            self._abort(self.stall_reason or self.control.root_cause(str(exc), exc.global_rank))
        except HorovodInternalError as exc:
            self._aborting()
            self._abort(str(exc))
        except Exception as exc:
            self._aborting()
            log.exception("rank %d: the Horovod engine failed", self.global_rank)
            self._abort(f"Horovod background thread failed on rank {self.global_rank}: {type(exc).__name__}: "
                        f"{exc}")
        finally:
            self._close()

    def take_local(self) -> Tuple[List[Entry], List[Note], List[loops.Park]]:
        """Rank 0's new entries, wait notices and fast-round parks, taken in one grab (engine thread)."""
        with self.lock:
            entries = list(self.queue)
            self.queue.clear()
            notes = self.waits.take_notes()
            parks, self.parks = self.parks, []
        return entries, notes, parks

    def expire_waits(self) -> Optional[float]:
        """Take back lapsed wait notices (waits.py); seconds until the next lapse is due (None: none pending)."""
        return self.waits.expire() if self.waits.lapsed else None

    def sleep(self, selector: selectors.BaseSelector, timeout: Optional[float]) -> loops.Events:
        """Wait for the next event: poll briefly after real work (see ``active``), then block in the kernel."""
        now = time.perf_counter()
        while now < self.last_activity + self.spin_s:     # re-read: a blocking call sent meanwhile extends it
            if self.queue or self.state is not _RUNNING or self.waits.notes or self.parks:
                return []
            events = selector.select(0)
            if events:
                return events
            if timeout is not None and timeout <= 0:
                return []
            now = time.perf_counter()
        with self.lock:
            if self.queue or self.state is not _RUNNING or self.waits.notes or self.parks:
                return []
            self.sleeping = True
        events = selector.select(timeout)
        self.sleeping = False
        return events

    def active(self) -> None:
        """Something happened after which an answer is due soon (a collective ran, a rank waits, this rank sent a
        blocking call's request): poll a while, counted from now; a poll under way is extended.

        Merely receiving a request is not such a thing: while gradients stream in during backward, polling after
        each one would only take CPU from the computation.
        """
        self.last_activity = time.perf_counter()

    def answered(self) -> None:
        """A response list ran: poll for the next (``active``), unless it completed a handle that a thread was
        blocked on. That thread now needs the GIL, which a polling engine thread holds between nearly every pair
        of polls; its next blocking call starts the poll again (``_admit``)."""
        if self.woke_waiter:
            self.woke_waiter = False
            self.last_activity = 0.0
        else:
            self.active()

    def drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def register_wake(self, selector: selectors.BaseSelector) -> None:
        selector.register(self._wake_r, selectors.EVENT_READ, -1)

    def set_params(self, params: dict) -> None:
        """Apply tunables decided by rank 0's autotuner (every rank, at the same point of the stream)."""
        settings = self.settings
        if "cycle_time_ms" in params:
            settings.cycle_time_ms = float(params["cycle_time_ms"])
            self.hold_s = settings.hold_seconds()
        if "fusion_threshold" in params and self.coordinator is not None:
            self.coordinator.fusion_threshold = settings.align_threshold(int(params["fusion_threshold"]))
        if "cache_enabled" in params:
            wanted = settings.cache_capacity if params["cache_enabled"] else 0
            if wanted != self.cache.capacity:
                self.cache.set_capacity(wanted)

    # ------------------------------------------------------------------ execution
    def apply(self, items: List[list]) -> None:
        """Decode a response list against the cache state before it, update the cache, then execute it."""
        cache = self.cache
        arrived = time.time() if self.flight_ring is not None else None     # negotiated, for the flight record
        decoded = []
        for item in items:
            kind = item[0]
            if kind == Tag.BATCH:
                batch = [cache.get(x) if isinstance(x, int) else TensorResponse.from_wire(x) for x in item[1]]
                decoded.append((Tag.BATCH, batch, item[1]))
            elif kind == Tag.CARRIED:
                decoded.append((kind, [TensorResponse.from_wire(item[1])], item[2]))
            else:
                decoded.append((kind, item, None))
        for kind, batch, raw in decoded:
            if kind == Tag.BATCH and cache.enabled:
                for response, ref in zip(batch, raw):
                    if isinstance(ref, int):
                        cache.touch(ref)
                    else:
                        cache.put(response)
        for kind, payload, result in decoded:
            if kind == Tag.BATCH:
                self._execute(payload, arrived)
            elif kind == Tag.CARRIED:
                self._execute(payload, arrived, result)
            elif kind == Tag.ERROR:
                self._fail_names(payload[1], payload[2])
            elif kind == Tag.PARAMS:
                self.set_params(payload[1])
            elif kind == Tag.JOINED:
                entry = self._pop("join.noname")
                if entry is not None:
                    flight.completed((entry,), arrived, time.time())
                    entry.handle.set_result(entry.index, payload[1])

    def _fail_names(self, names: List[str], message: str) -> None:
        """The coordinator failed these tensors (their requests disagree across ranks, for example)."""
        for observer in self.hooks.error:
            observer.on_error(names, message)
        for name in names:
            entry = self._pop(name)
            if entry is not None:
                flight.failed((entry,), time.time(), message)
                entry.handle.set_error(HorovodInternalError(message))

    def _pop(self, name: str) -> Optional[Entry]:
        with self.lock:
            return self.table.pop(name, None)

    def _execute(self, batch: List[TensorResponse], arrived: Optional[float] = None,
                 carried_result: Optional[bytes] = None) -> None:
        """Run one batch on this rank (``carried_result``: complete a carried collective with rank 0's result)."""
        with self.lock:
            entries = [self.table.pop(r.name, None) for r in batch]
        observers = self.hooks.batch
        if self.flight_ring is not None:
            flight.started(entries, arrived, time.time())
        self.running = (batch, time.monotonic())
        self.backend.progress = 0
        try:
            if not observers:
                self._run(batch, entries, carried_result)
            else:
                self._run_observed(observers, batch, entries, carried_result)
        except BaseException as exc:
            if isinstance(exc, PeerLostError) and self.stall_reason is None:
                # A lost peer: the abort that follows learns the root cause (another rank's reason may be on its
                # way, see ControlChannel.root_cause) and fails these entries with it.
                self._orphans.extend(e for e in entries if e is not None)
                raise
            # These entries already left the table, so the abort that follows cannot reach them: fail them here.
            error = HorovodInternalError(self.stall_reason or (
                str(exc) if isinstance(exc, (PeerLostError, HorovodInternalError)) else
                f"{RequestType(batch[0].rtype).name} of tensor '{batch[0].name}' failed on rank "
                f"{self.global_rank}: {type(exc).__name__}: {exc}"))
            flight.failed(entries, time.time(), str(error))
            for entry in entries:
                if entry is not None:
                    entry.handle.set_error(error)
            raise
        else:
            if self.flight_ring is not None:
                flight.done(entries, time.time())
            if self.spin_s and any(e is not None and e.handle.waiters for e in entries):
                self.woke_waiter = True     # see answered() (a wait that ended with the result leaves the count)
        finally:
            self.running = None

    def _run(self, batch: List[TensorResponse], entries: List[Optional[Entry]],
             carried_result: Optional[bytes]) -> None:
        if carried_result is None:
            run_batch(self, batch, entries)
        else:
            carried.finish(batch, entries, carried_result)
            self.carried_ops += 1

    def _run_observed(self, observers: Sequence[EngineObserver], batch: List[TensorResponse],
                      entries: List[Optional[Entry]], carried_result: Optional[bytes]) -> None:
        """Run a batch between the observers' start and end hooks."""
        names = [r.name for r in batch]
        for observer in observers:
            observer.on_batch_start(names)
        try:
            self._run(batch, entries, carried_result)
        finally:
            now = time.perf_counter_ns()
            for observer in observers:
                observer.on_batch_end(batch, now)

    # ------------------------------------------------------------------ failure
    def fail_all(self, error: HorovodInternalError) -> None:
        """Stop for ``error``: every pending and later handle fails with it."""
        with self.lock:
            if self.state is not EngineState.STOPPED:
                self.state, self.error = EngineState.STOPPED, error
            entries = self._orphans + list(self.table.values())
            self._orphans = []
            self.table.clear()
            self.queue.clear()
        flight.failed(entries, time.time(), str(error))
        for entry in entries:
            entry.handle.set_error(HorovodInternalError(str(error)))

    def _aborting(self) -> None:
        with self.lock:
            if self.state is not EngineState.STOPPED:
                self.state = EngineState.ABORTING

    def _abort(self, reason: str) -> None:
        log.error("rank %d: %s", self.global_rank, reason)
        self.control.send_abort(reason)
        self.incident("abort", reason)
        self.fail_all(HorovodInternalError(reason))

    def incident(self, kind: str, message: str) -> None:
        """Tell the observers (the flight recorder) that the job is in trouble, before any handle fails: "abort" (its
        pending collectives are marked failed first) or "report" (a stall or deadlock report). Engine thread."""
        if kind == "abort":
            with self.lock:
                pending = [*self._orphans, *self.table.values(), *self.fast_entries]
            flight.failed(pending, time.time(), message)
        for observer in self.hooks.incident:
            try:
                observer.on_incident(kind, message)
            except Exception:
                log.debug("rank %d: an engine observer failed on an incident", self.global_rank, exc_info=True)

    def _close_fast_rounds(self) -> None:
        """Drop the fast rounds' views of the shared segment once no caller is inside a round (a waiter sees the
        engine stopped within ``fast_rounds.SLICE_SECONDS``); a round still open keeps them, and the mapping."""
        fast = self.fast
        if fast is None:
            return
        deadline = time.monotonic() + 4 * fast_rounds.SLICE_SECONDS
        while self.fast_entries and time.monotonic() < deadline:
            time.sleep(fast_rounds.SLICE_SECONDS / 5)
        with self.lock:
            if not self.fast_entries:
                self.fast = None
                fast.close()

    def _close(self) -> None:
        lifecycle.tell(self, False)
        for observer in self.hooks.all:
            try:
                observer.close()
            except Exception:
                log.debug("rank %d: an engine observer failed to close", self.global_rank, exc_info=True)
        with self.lock:
            if self.state is not EngineState.STOPPED:
                self.state, self.error = EngineState.STOPPED, HorovodInternalError(SHUT_DOWN_MESSAGE)
        if self.flight_ring is not None:
            self.flight_ring.close()
        for sock in (self._wake_r, self._wake_w):
            try:
                sock.close()
            except OSError:
                pass
        self._close_fast_rounds()
        self.devices.close()
        if self._on_close is not None:
            try:
                self._on_close()
            except Exception:
                log.debug("rank %d: error while closing the data plane", self.global_rank, exc_info=True)
