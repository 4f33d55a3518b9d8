"""The elastic job's driver: finds hosts, starts workers, and re-forms the job when workers fail or hosts change.

The job runs in rounds (see :mod:`horovod.common.elastic_rendezvous` for the wire side). One event loop, in the
launcher's main thread, owns every decision; the other threads only post events to it:

- the discovery thread polls the hosts every :data:`DISCOVER_HOSTS_FREQUENCY_SECS` and posts changes;
- each worker's waiter posts its exit; the rendezvous store posts each worker's request for the next round.

A round re-forms when one of its workers asks for the next round (its collective failed, or it was told that
hosts changed) or fails. The driver then waits until every worker of the round has either asked or exited; a
worker that does neither within :data:`RESET_SETTLE_SECS` is stopped and counts as failed (upstream waits for
it forever, its issue #3014). Then, as upstream: any success ends the job, failed workers' hosts are
blacklisted, the reset limit is checked, the driver waits up to the elastic timeout for ``min_np`` slots, and
it publishes the next round: waiting workers get their new rank (older hosts keep the lower ranks), workers whose
slot is gone are told to exit, and new slots get new workers.

A worker that receives SIGTERM from outside (spot preemption) announces that it leaves; the driver publishes a
host notice, so that every rank re-forms at the next commit, and records the worker as LEFT when it exits: no
failure, no blacklisting, and its slot stays out of the job (:mod:`.preemption`). The driver's own SIGTERMs (the
job ends, an unresponsive worker is stopped) are announced in the store first, so workers do not take them for a
preemption.
"""
from __future__ import annotations

import dataclasses
import logging
import queue
import signal
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from horovod.common import config, wire
from horovod.common.elastic import HostUpdateResult
from horovod.common.elastic_rendezvous import (
    ASSIGN_SCOPE,
    LEAVE_SCOPE,
    READY_SCOPE,
    ROUNDS_SCOPE,
    broken_key,
    mark_stopping,
    notice_count,
    publish_notice,
    slot_key,
)
from horovod.runner.common.util.hosts import INVALID_SLOT_INFO, SlotInfo
from horovod.runner.process import (
    JobFailedError,
    JobInterruptedError,
    WorkerExit,
    WorkerProcess,
    install_stop_handlers,
    reap_leftovers,
    restore_signal_handlers,
    stop_workers,
)

from .discovery import DiscoveredHosts, HostDiscovery, HostManager
from .preemption import LeftSlots
from .registration import FAILURE, LEFT, READY, SUCCESS, Decision, WorkerStateRegistry

log = logging.getLogger("horovod.elastic")  # a named channel: see horovod.common.logging_setup

DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
ELASTIC_TIMEOUT_SECS = 600
RESET_SETTLE_SECS = 30.0
GRACE_SECONDS = 3.0

CreateWorker = Callable[[SlotInfo, "queue.SimpleQueue", str], WorkerProcess]


def _placement(plan: Dict[str, SlotInfo]) -> List[tuple]:
    """What an assignment decides for each slot, in rank order: equal placements need no re-forming."""
    return sorted((s.rank, s.size, slot, s.local_rank) for slot, s in plan.items())


class ElasticDriver:
    """Runs one elastic job: ``run(num_proc, create_worker)`` returns when it finished, raises when it failed.

    ``rendezvous`` is the job's started :class:`horovod.runner.rendezvous.RendezvousServer`; ``discovery`` says
    which hosts exist; ``timeout`` bounds each wait for ``min_num_proc`` slots (default: ``HOROVOD_ELASTIC_TIMEOUT``,
    else :data:`ELASTIC_TIMEOUT_SECS`).
    """

    def __init__(self, rendezvous, discovery: HostDiscovery, min_num_proc: int, max_num_proc: Optional[int] = None,
                 timeout: Optional[float] = None, reset_limit: Optional[int] = None,
                 cooldown_range: Optional[Tuple[int, int]] = None, verbose: int = 0) -> None:
        if not getattr(rendezvous, "started", True):     # upstream makes the driver before it starts the server
            rendezvous.start()
        self._store = rendezvous.store
        self._host_manager = HostManager(discovery, cooldown_range)
        self._cooldown_range = cooldown_range
        self._hosts_lock = threading.Lock()
        self._registry = WorkerStateRegistry(self._host_manager, reset_limit)
        self._min_np = min_num_proc
        self._max_np = max_num_proc
        if timeout is None:
            timeout = config.get("HOROVOD_ELASTIC_TIMEOUT") if config.is_set("HOROVOD_ELASTIC_TIMEOUT") \
                else ELASTIC_TIMEOUT_SECS
        self._timeout = float(timeout)
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self._round = -1
        self._notices_from = 0
        self._assignment: Dict[str, SlotInfo] = {}      # slot -> its place in the current round
        self._workers: Dict[str, WorkerProcess] = {}    # slot -> its running process
        self._worker_ids: Dict[str, str] = {}           # slot -> the id of the process started for it last
        self._started = 0
        self._waiting: Dict[str, dict] = {}             # slot -> its unanswered request for a round
        self._exits: Dict[str, WorkerExit] = {}         # slot -> how it failed, in the current round
        self._leaving: Dict[str, str] = {}              # slot -> the signal its worker announced leaving on
        self._left = LeftSlots()                        # slots kept out of the job after their worker left
        self._reforming_since: Optional[float] = None
        self._finishing = False
        self._stop_signal: Optional[int] = None
        self._shutdown = threading.Event()
        self._create_worker: Optional[CreateWorker] = None
        self._discovery_thread: Optional[threading.Thread] = None
        self._view: dict = {"size": 0, "hosts": [], "elastic": None}    # for the live page (see monitor_view)
        self._store.watch(READY_SCOPE, lambda key, value: self.events.put(("ready", key, value)))
        self._store.watch(LEAVE_SCOPE, lambda key, value: self.events.put(("leave", key, value)))

    # ------------------------------------------------------------------ public API

    @property
    def round(self) -> int:
        """The current round (0 for the first; one more at every reset)."""
        return self._round

    @property
    def reset_count(self) -> int:
        return self._registry.reset_count

    def world_size(self) -> int:
        return len(self._assignment)

    @property
    def host_assignments(self) -> Dict[str, List[SlotInfo]]:
        """The current round's slots by host (upstream's property)."""
        by_host: Dict[str, List[SlotInfo]] = {}
        for info in sorted(self._assignment.values(), key=lambda s: s.rank):
            by_host.setdefault(info.hostname, []).append(info)
        return by_host

    def get_slot_info(self, host: str, slot: int) -> SlotInfo:
        """The current round's place (rank, size, ...) of slot ``slot`` of ``host``, or ``INVALID_SLOT_INFO`` when
        that slot takes no part in it (upstream's query; a worker learns its own place from its request for a
        round)."""
        return self._assignment.get(slot_key(host, slot), INVALID_SLOT_INFO)

    def monitor_view(self) -> dict:
        """The job's layout for the live page (``horovod.runner.monitor``), from any thread: the current round's
        size, the host of each rank, and the round, its members and whether it re-forms; and the pid of each
        rank whose worker this launcher started on its own host (what the page says of a rank without a beat)."""
        view, assignment, pids = self._view, self._assignment, {}
        for slot, worker in list(self._workers.items()):        # a copy: the driver's thread changes the dict
            info = assignment.get(slot)
            if info is not None and worker.spec.local:
                pids[info.rank] = worker.proc.pid
        return {**view, "local_pids": pids} if pids else view

    def _publish_view(self) -> None:
        """Replace the live page's view (one assignment: a reader in another thread sees the old or the new)."""
        members = sorted(self._assignment.items(), key=lambda item: item[1].rank)
        self._view = {"size": len(members), "hosts": [info.hostname for _, info in members], "elastic": {
            "round": self._round, "reforming": self._reforming_since is not None, "resets": self.reset_count,
            "min_np": self._min_np, "max_np": self._max_np,
            "members": [{"rank": info.rank, "host": info.hostname, "slot": slot} for slot, info in members]}}

    def run(self, num_proc: int, create_worker: CreateWorker, min_hosts: int = 1) -> List[SlotInfo]:
        """Start the job once ``num_proc`` slots exist and run it to its end; returns the last round's slots in rank
        order. Raises JobFailedError, RuntimeError (reset limit, elastic timeout, bad discovery),
        JobInterruptedError or KeyboardInterrupt; no worker is left running in any case."""
        self._create_worker = create_worker
        previous = install_stop_handlers(self._on_signal)
        try:
            self._first_discovery()
            self._form_round(self.wait_for_available_slots(num_proc, min_hosts))
            while not self._loop_once():
                pass
            return sorted(self._assignment.values(), key=lambda s: s.rank)
        finally:
            restore_signal_handlers(previous)
            self.stop()

    def stop(self) -> None:
        """Stop discovery and every worker still running (idempotent)."""
        self._shutdown.set()
        workers = list(self._workers.values())
        self._workers.clear()
        if workers:
            mark_stopping(self._store)      # the SIGTERM that follows is no preemption
        stop_workers(workers, GRACE_SECONDS)
        reap_leftovers(workers)
        for worker in workers:
            worker.close()
        if self._discovery_thread is not None and self._discovery_thread is not threading.current_thread():
            self._discovery_thread.join(timeout=5.0)

    def wait_for_available_slots(self, min_num_proc: int, min_hosts: int = 1) -> DiscoveredHosts:
        """The current hosts once they have ``min_num_proc`` slots on ``min_hosts`` hosts; RuntimeError after the
        elastic timeout."""
        deadline = time.monotonic() + self._timeout
        announced = False
        while True:
            current = self._current_hosts()
            slots, hosts = self._left.count_usable(current), len(current.available_hosts)
            if slots >= min_num_proc and hosts >= min_hosts:
                return current
            self._check_signal()
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    "Timed out waiting for minimum number of slots to become available. Please check that you "
                    f"have enough resources to run at least {min_num_proc} Horovod processes. Waited "
                    f"{self._timeout:.0f} s (--elastic-timeout, HOROVOD_ELASTIC_TIMEOUT) with {slots} usable slots "
                    f"on {hosts} hosts ({current}){self._blacklisted_note(current)}; check what the host discovery "
                    "reports, or lower --min-np.")
            if not announced:
                log.info("waiting for %d slots on %d host(s): %d available now%s", min_num_proc, min_hosts, slots,
                         self._blacklisted_note(current))
                announced = True
            time.sleep(0.1)

    def _blacklisted_note(self, current: DiscoveredHosts) -> str:
        """Which hosts the discovery lists but the job may not use (blacklisted after a worker failed there), and
        for how long; "" when none."""
        out = [host for host in current.host_slots if host not in current.available_hosts]
        if not out:
            return ""
        until = ("until its cooldown ends (--blacklist-cooldown-range)" if self._cooldown_range else
                 "for the rest of the job (without --blacklist-cooldown-range a blacklisted host never comes back)")
        return f"; blacklisted after a worker failed there, {until}: {', '.join(out)}"

    # ------------------------------------------------------------------ discovery

    def _current_hosts(self) -> DiscoveredHosts:
        """The discovery's latest answer; preempted slots of hosts it no longer lists are forgotten."""
        with self._hosts_lock:
            current = self._host_manager.current_hosts
        self._left.forget_missing(current.host_slots)
        return current

    def _first_discovery(self) -> None:
        """Ask the discovery once before starting anything: a failure here is a misconfiguration, so it ends the
        job at once (later failures are retried)."""
        try:
            with self._hosts_lock:
                self._host_manager.update_available_hosts()
        except Exception as exc:
            raise RuntimeError(f"Host discovery failed on its first call, so the job cannot start: {exc}") from exc
        self._discovery_thread = threading.Thread(target=self._discover, name="horovod-elastic-discovery",
                                                  daemon=True)
        self._discovery_thread.start()

    def _discover(self) -> None:
        # The module's constants are read at every use, so that tests can patch them.
        while not self._shutdown.wait(DISCOVER_HOSTS_FREQUENCY_SECS):
            try:
                with self._hosts_lock:
                    update = self._host_manager.update_available_hosts()
            except Exception as exc:
                log.warning("host discovery failed (retrying in %.0f s): %s", DISCOVER_HOSTS_FREQUENCY_SECS, exc)
                continue
            if update != HostUpdateResult.no_update:
                self.events.put(("hosts", update))

    def _on_hosts(self, update: HostUpdateResult) -> None:
        """Tell the workers that the hosts changed, when that changes the assignment (rank 0 decides when to
        re-form, at its next commit). While a round re-forms there is nothing to tell: it uses the new hosts."""
        current = self._current_hosts()
        if self._round < 0 or self._reforming_since is not None or self._finishing:
            return
        upcoming = self._plan(current) if self._left.count_usable(current) >= self._min_np else {}
        if _placement(upcoming) == _placement(self._assignment):
            log.debug("hosts changed (%s) without changing the assignment: no notice", update)
            return
        publish_notice(self._store, int(update))
        log.info("hosts changed (%s): the workers were notified (%s)", HostUpdateResult(update).name, current)

    # ------------------------------------------------------------------ the event loop

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = signum
        self.events.put(("signal", signum))

    def _check_signal(self) -> None:
        if self._stop_signal == signal.SIGINT:
            raise KeyboardInterrupt
        if self._stop_signal is not None:
            raise JobInterruptedError(self._stop_signal)

    def _loop_once(self) -> bool:
        """Handle one event (or a tick); True once the job has finished successfully."""
        try:
            event = self.events.get(timeout=0.5)
        except queue.Empty:
            event = ("tick",)
        kind = event[0]
        if kind == "signal":
            self._check_signal()
        elif kind == "ready":
            self._on_ready(event[1], wire.unpack(event[2]))
        elif kind == "leave":
            self._on_leave(event[1], wire.unpack(event[2]))
        elif kind == "exit":
            self._on_exit(event[1])
        elif kind == "hosts":
            self._on_hosts(event[1])
        return self._advance()

    def _on_ready(self, slot: str, request: dict) -> None:
        """A worker asks for a round after ``request["after"]``."""
        if self._finishing:
            self._answer(slot, request, {"end": "The elastic job is over: other workers finished, so there is no "
                                                "next round. Every worker must run the same number of steps."})
            return
        if request.get("worker") != self._worker_ids.get(slot):
            # A process this driver no longer runs on the slot: one whose ssh session died with its host's link
            # while it lived on; a newer process has the slot now.
            self._answer(slot, request, {"exit": "a newer worker took its slot"})
            return
        if slot in self._leaving:
            self._answer(slot, request, {"exit": f"it was preempted ({self._leaving[slot]})"})
            return
        member = slot in self._assignment
        if member and request["after"] < self._round and self._reforming_since is None:
            self._answer(slot, request, self._assignment_of(slot))      # a new worker joins the current round
            return
        if not member:
            self._answer(slot, request, {"exit": "its slot is not part of the job any more"})
            return
        self._waiting[slot] = request
        self._registry.record(slot, READY)
        self._begin_reform(f"{slot} (rank {self._assignment[slot].rank}) left round {self._round}")

    def _on_exit(self, worker: WorkerProcess) -> None:
        slot = next((key for key, w in self._workers.items() if w is worker), None)
        if slot is None:
            return
        del self._workers[slot]
        self._waiting.pop(slot, None)
        worker.close()
        if slot not in self._assignment:
            self._leaving.pop(slot, None)
            log.debug("%s exited after leaving the job", slot)
            return
        if slot in self._leaving:
            self._on_left(slot, worker.proc.returncode)
            return
        if worker.proc.returncode == 0:
            self._registry.record(slot, SUCCESS)
            self._finishing = True
            return
        info = worker.exit_info()
        self._exits[slot] = info
        self._registry.record(slot, FAILURE)
        log.warning("worker %s (rank %d) failed: %s", slot, self._assignment[slot].rank, info.status)
        if not self._finishing:
            self._begin_reform(f"{slot} failed ({info.status})")

    def _on_leave(self, worker_id: str, message: dict) -> None:
        """A worker announced that it leaves the job: it received SIGTERM, and not from this driver (a spot
        instance about to be reclaimed). Every rank is told to re-form at its next commit, through a host notice;
        the worker leaves then (or answers its next request for a round with an exit)."""
        slot = next((key for key, known in self._worker_ids.items() if known == worker_id), None)
        if slot is None or slot not in self._workers or slot in self._leaving or slot not in self._assignment:
            log.debug("ignoring a departure from %s: not a running worker of the job", worker_id)
            return
        signal_name = str(message.get("signal", "SIGTERM"))
        self._leaving[slot] = signal_name
        self._left.add(slot)
        log.info("worker %s (rank %d) received %s: it leaves the job at its next commit", slot,
                 self._assignment[slot].rank, signal_name)
        if slot in self._waiting:
            self._answer(slot, self._waiting[slot], {"exit": f"it was preempted ({signal_name})"})
        elif self._reforming_since is None and not self._finishing:
            publish_notice(self._store, int(HostUpdateResult.removed))

    def _on_left(self, slot: str, returncode: Optional[int]) -> None:
        """A worker that announced its departure is gone: LEFT, neither a failure nor a success."""
        signal_name = self._leaving.pop(slot)
        self._registry.record(slot, LEFT)
        info = self._assignment[slot]
        remaining = sum(1 for key in self._assignment if self._registry.state(key) not in (LEFT, FAILURE))
        log.info("rank %d on host %s was preempted (%s) and left the job; continuing with %d worker%s", info.rank,
                 info.hostname, signal_name, remaining, "" if remaining == 1 else "s")
        if returncode:
            log.debug("%s exited with status %s after it announced its departure", slot, returncode)
        if not self._finishing:
            self._begin_reform(f"{slot} was preempted")

    def _begin_reform(self, reason: str) -> None:
        if self._reforming_since is not None:
            return
        log.info("round %d is over: %s; re-forming the job", self._round, reason)
        self._reforming_since = time.monotonic()
        self._store.put(ROUNDS_SCOPE, broken_key(self._round), b"1")   # peers still forming it give up
        self._publish_view()

    def _advance(self) -> bool:
        """Move the job on once the current round's workers are all accounted for; True when it finished."""
        if self._finishing:
            for slot, request in list(self._waiting.items()):
                self._on_ready(slot, request)
            if any(self._registry.state(slot) in (None, READY) for slot in self._assignment):
                return False
            return self._finish()
        if self._reforming_since is None:
            return False
        if not self._registry.all_recorded():
            if time.monotonic() - self._reforming_since < RESET_SETTLE_SECS:
                return False
            self._stop_unresponsive(RESET_SETTLE_SECS)
        decision = self._registry.decide()
        if decision is Decision.FINISH:
            self._finishing = True
            return self._advance()
        if decision is Decision.FAIL:
            raise JobFailedError(self._first_failure())
        if decision is Decision.RESET_LIMIT:
            raise RuntimeError(self._registry.reset_limit_message())
        if decision is Decision.ALL_LEFT:
            raise RuntimeError(f"Every worker of round {self._round} was preempted and left the job, so no worker "
                               "holds the training state: start the job again (from your last checkpoint).")
        self._form_round(self.wait_for_available_slots(self._min_np))
        return False

    def _finish(self) -> bool:
        failed = self._registry.get(FAILURE)
        if failed:
            raise JobFailedError(self._first_failure())
        log.info("the elastic job finished after %d reset(s) in round %d", self.reset_count, self._round)
        return True

    def _first_failure(self) -> WorkerExit:
        failures = [self._exits[slot] for slot in self._registry.get(FAILURE) if slot in self._exits]
        return min(failures, key=lambda f: f.rank)

    def _stop_unresponsive(self, waited: float) -> None:
        """Stop the round's workers that neither asked for the next round nor exited; they count as failed (a
        worker that announced its departure still counts as left)."""
        unrecorded = self._registry.unrecorded()
        mark_stopping(self._store, [self._worker_ids[slot] for slot in unrecorded if slot in self._worker_ids])
        for slot in unrecorded:
            worker = self._workers.pop(slot, None)
            if slot in self._leaving:
                if worker is not None:
                    stop_workers([worker], GRACE_SECONDS)
                    reap_leftovers([worker])
                    worker.close()
                self._on_left(slot, None if worker is None else worker.proc.returncode)
                continue
            log.warning("worker %s did not leave round %d within %.0f s of its failure: stopping it and "
                        "blacklisting its host", slot, self._round, waited)
            if worker is not None:
                stop_workers([worker], GRACE_SECONDS)
                reap_leftovers([worker])
                worker.close()
                info = worker.exit_info()
            else:
                info = WorkerExit(self._assignment[slot].rank, self._assignment[slot].hostname, -1, slot, [])
            info.last_lines.append(f"(stopped by the elastic driver: no report within {waited:.0f} s of the "
                                   f"failure that ended round {self._round})")
            self._exits[slot] = info
            self._registry.record(slot, FAILURE)

    # ------------------------------------------------------------------ rounds

    def _plan(self, current: DiscoveredHosts) -> Dict[str, SlotInfo]:
        """The places of a round on ``current``'s hosts, keyed by slot (slots that left are kept out)."""
        return self._left.plan(current, self._min_np, self._max_np)

    def _form_round(self, current: DiscoveredHosts) -> None:
        """Publish the next round: answer the waiting workers, start workers on the new slots."""
        plan = self._plan(current)
        if self._assignment:
            previous = {s.hostname for s in self._assignment.values()}
            if not previous & {s.hostname for s in plan.values()}:
                raise RuntimeError("No hosts from previous set remaining, unable to broadcast state.")
        self._round += 1
        self._notices_from = notice_count(self._store)
        self._assignment = plan
        self._registry.reset({key: s.hostname for key, s in self._assignment.items()})
        self._reforming_since = None
        self._exits = {}
        for slot, request in list(self._waiting.items()):
            self._answer(slot, request, self._assignment_of(slot) if slot in self._assignment
                         else {"exit": "its host was removed from the job"})
        for key, info in self._assignment.items():
            if key not in self._workers:
                self._started += 1
                self._worker_ids[key] = f"{key}#{self._started}"
                # The new worker's slot key comes from its local rank: give it the slot's index (its place in the
                # round, which differs once a slot of the host left, comes from its request for a round).
                start = dataclasses.replace(info, local_rank=LeftSlots.slot_index(key))
                self._workers[key] = self._create_worker(start, self.events, self._worker_ids[key])
        for stale in range(max(0, self._round - 8), self._round - 1):
            self._store.delete_scope(f"mesh.{stale}")
        self._publish_view()
        hosts = len({s.hostname for s in plan.values()})
        log.info("round %d: %d workers on %d host(s): %s", self._round, len(plan), hosts,
                 ", ".join(f"{s.hostname}[{LeftSlots.slot_index(key)}]=rank {s.rank}" for key, s in plan.items()))

    def _assignment_of(self, slot: str) -> dict:
        info = self._assignment[slot]
        return {"round": self._round, "rank": info.rank, "size": info.size, "local_rank": info.local_rank,
                "local_size": info.local_size, "cross_rank": info.cross_rank, "cross_size": info.cross_size,
                "notices_from": self._notices_from}

    def _answer(self, slot: str, request: dict, answer: dict) -> None:
        self._store.put(ASSIGN_SCOPE, f"{slot}/{request['nonce']}", wire.pack(answer))
        self._waiting.pop(slot, None)
