"""Elastic training's worker side, shared by every binding: the state a job keeps across resets, and the loop
that restores it.

Upstream's model (contract §1.7): a training function runs under ``hvd.elastic.run``; a :class:`State` holds what
must survive a change of workers. ``commit()`` saves it (and checks whether the driver announced new or removed
hosts); when a collective fails (:class:`HorovodInternalError`) the loop restores the last commit, re-forms the
job and syncs the state from rank 0; when hosts were announced (:class:`HostsUpdatedInterrupt`) it re-forms without
restoring (nothing was lost). A worker that receives SIGTERM (spot preemption) leaves the job at its next commit
and exits with status 0 (:class:`Preemption`).

Upstream keeps ``HostUpdateResult`` and the notification manager in ``horovod.runner.elastic.worker``, which its
``common/elastic.py`` imports; here the shared ground may not import the runner, so they live here and the
runner's module re-exports them.
"""
from __future__ import annotations

import copy
import enum
import functools
import logging
import os
import queue
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, NoReturn, Optional, Set, Tuple

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, is_negotiation_error

log = logging.getLogger("horovod.elastic")  # a named channel: see horovod.common.logging_setup


class HostUpdateResult(enum.IntFlag):
    """What changed in the set of hosts (upstream's flags; ``mixed`` = both)."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class HostsListener:
    """What the notification manager calls when the driver announces a change of hosts."""

    def on_hosts_updated(self, timestamp: float, update_res: HostUpdateResult) -> None:
        raise NotImplementedError


class WorkerNotificationManager:
    """Delivers the driver's host-update notices to the registered states of this worker.

    ``init()`` starts the worker's notification endpoint when the job runs elastically (the driver's rendezvous
    tells where to register); outside an elastic job it does nothing, so ``hvd.elastic.run`` also works in a
    fixed job. ``handle_hosts_updated`` is what the endpoint calls.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: Set[HostsListener] = set()
        self._started = False
        self.starter: Optional[Callable[[WorkerNotificationManager], None]] = None
        self.poller: Optional[Any] = None

    def init(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            (self.starter or _poll_driver_notices)(self)

    def register_listener(self, listener: HostsListener) -> None:
        with self._lock:
            self._listeners.add(listener)

    def remove_listener(self, listener: HostsListener) -> None:
        with self._lock:
            self._listeners.discard(listener)

    def handle_hosts_updated(self, timestamp: float, update_res: HostUpdateResult) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.on_hosts_updated(timestamp, update_res)


def _poll_driver_notices(manager: WorkerNotificationManager) -> None:
    """The default endpoint: in a worker of an elastic ``horovodrun`` job, a thread that long-polls the driver's
    notices (:class:`horovod.common.elastic_rendezvous.NotificationPoller`); elsewhere nothing."""
    from horovod.common import elastic_rendezvous

    kv = elastic_rendezvous.connect_from_env()
    if kv is not None:
        manager.poller = elastic_rendezvous.NotificationPoller(
            kv, lambda timestamp, update: manager.handle_hosts_updated(timestamp, HostUpdateResult(update)))


notification_manager = WorkerNotificationManager()

PREEMPTION_GRACE_SECS = 20.0    # the longest a preempted worker waits for a commit before it leaves anyway
PREEMPTION_REPLY_SECS = 2.0     # how long the SIGTERM handler waits for the driver's store
PREEMPTION_NOTICE_SECS = 5.0    # after this, a preempted worker leaves at a commit even if the job did not re-form


class Preemption:
    """What a worker of an elastic ``horovodrun`` job does on SIGTERM: a spot instance about to be reclaimed.

    ``hvd.elastic.run`` installs the handler (in the main thread, when the program does not handle SIGTERM
    itself). On SIGTERM the worker asks the driver's store whether the driver is stopping it (the job ends, or the
    worker is stopped for not reporting) or finds the launcher gone: then it dies of the signal as it always did.
    Otherwise it announces that it leaves (:func:`horovod.common.elastic_rendezvous.announce_leaving`). The driver
    tells every rank through a host notice, so that all of them re-form at the next commit, where this worker
    exits with status 0 instead (:meth:`leave`); the driver counts it as left, not failed. Should the job not
    re-form within :data:`PREEMPTION_NOTICE_SECS`, it leaves at the next commit after that anyway (its peers see
    a failed collective, restore that commit and re-form); without a commit within :data:`PREEMPTION_GRACE_SECS`,
    it abandons its step and exits 0.
    """

    def __init__(self) -> None:
        self.leaving = threading.Event()
        self._installed = False
        self._previous: Any = None
        self._signalled = False
        self._kv: Any = None
        self._worker_id = ""
        self._parent = -1
        self._announced_at = 0.0

    def install(self) -> None:
        """Handle SIGTERM as a preemption, when this process is an elastic worker started by ``horovodrun``."""
        from horovod.common import config, elastic_rendezvous

        worker_id = os.environ.get(elastic_rendezvous.WORKER_ID_ENV)
        if self._installed or not worker_id or not config.get("HOROVOD_ELASTIC") \
                or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            log.debug("the program handles SIGTERM itself: no preemption handling")
            return
        try:
            kv = elastic_rendezvous.connect_from_env(timeout=5 * PREEMPTION_REPLY_SECS)
        except (OSError, ConnectionError) as exc:
            log.debug("no preemption handling: the driver's store is unreachable (%s)", exc)
            return
        if kv is None:
            return
        kv._sock.settimeout(PREEMPTION_REPLY_SECS)      # a cut link must not hold the handler up
        self._kv, self._worker_id, self._parent = kv, worker_id, os.getppid()
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True

    def uninstall(self) -> None:
        """Put the previous SIGTERM handler back (a worker that is leaving keeps this one to its end)."""
        if not self._installed or self._signalled:
            return
        signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
        self._kv.close()
        self._kv, self._installed = None, False

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._signalled:             # a second SIGTERM: from the driver, it ends the worker now
            if self._driver_stops():
                self._die()
            return
        self._signalled = True
        if not self._announce():        # the driver stops this worker, or is gone: die of the signal as before
            self._die()
            return
        self._announced_at = time.monotonic()
        self.leaving.set()
        log.warning("received SIGTERM (preemption): the driver was told; this worker leaves the job at its next "
                    "commit (within %.0f s)", PREEMPTION_GRACE_SECS)
        threading.Thread(target=self._deadline, name="horovod-elastic-preempted", daemon=True).start()

    @staticmethod
    def _die() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _announce(self) -> bool:
        """Tell the driver that this worker leaves; False when the SIGTERM was no preemption."""
        from horovod.common import elastic_rendezvous

        if os.getppid() != self._parent:    # the launcher died (PR_SET_PDEATHSIG sent this SIGTERM)
            return False
        try:
            return elastic_rendezvous.announce_leaving(self._kv, self._worker_id)
        except Exception as exc:  # the driver's store is gone or unreachable: nobody to tell
            log.debug("could not tell the driver about the SIGTERM: %s", exc)
            return False

    def _driver_stops(self) -> bool:
        from horovod.common import elastic_rendezvous

        try:
            return os.getppid() != self._parent or elastic_rendezvous.driver_stops(self._kv, self._worker_id)
        except Exception:  # the driver's store is gone: nobody waits for this worker any more
            return True

    def _deadline(self) -> None:
        time.sleep(PREEMPTION_GRACE_SECS)
        log.warning("no commit within %.0f s of SIGTERM: abandoning the current step and leaving the job now",
                    PREEMPTION_GRACE_SECS)
        _flush_output()
        os._exit(0)

    def due(self) -> bool:
        """At a commit that did not re-form the job: True when a worker that announced its departure should leave
        now rather than wait longer for the others to re-form without it."""
        return self.leaving.is_set() and time.monotonic() - self._announced_at >= PREEMPTION_NOTICE_SECS

    @staticmethod
    def leave(how: str) -> NoReturn:
        """Leave the job: exit with status 0 (the driver records the worker as left)."""
        log.warning("preempted (SIGTERM): this worker leaves the elastic job %s; it exits with status 0", how)
        raise SystemExit(0)


def _flush_output() -> None:
    for handler in logging.getLogger("horovod").handlers + logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # flushing is best effort before os._exit
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


preemption = Preemption()


class State(HostsListener):
    """State kept in memory across resets (upstream's ``horovod.common.elastic.State``).

    ``bcast_object(obj)`` broadcasts a picklable object from rank 0; ``get_rank()`` returns this worker's rank.
    Subclasses implement :meth:`save`, :meth:`restore` and :meth:`sync`, and may implement :meth:`reset`.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue[Tuple[float, HostUpdateResult]] = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks: List[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Functions to call after every reset (for example, to rescale the learning rate to the new size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """After the job re-formed: forget pending host notices, reset, then run the callbacks."""
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: HostUpdateResult) -> None:
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Save the state (in host memory) and check for announced host changes (see
        :meth:`check_host_updates`). Commits copy data: commit every few steps rather than every step."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` on every rank at once if the driver announced a change of hosts.

        Rank 0's view is broadcast (only rank 0 is notified), so every rank takes the same decision at the same
        step. ``skip_sync`` is true when hosts were only removed: the survivors' state is already in sync.
        """
        last = prev = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, result = self._host_messages.get()
            if timestamp > last:
                last = timestamp
                update |= result
        prev, self._last_updated_timestamp, update = self._bcast_object((prev, last, update))
        if self._last_updated_timestamp > prev:
            raise HostsUpdatedInterrupt(HostUpdateResult(update) == HostUpdateResult.removed)
        if preemption.due():
            preemption.leave("at this commit, although the others were not told to re-form (they will find it gone)")

    def save(self) -> None:
        """Save the state to host memory."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Put back the last committed state, undoing uncommitted changes."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Make every rank's state rank 0's."""
        raise NotImplementedError()

    def reset(self) -> None:
        """Adjust to the new job after a reset, before the sync (nothing by default)."""


class ObjectState(State):
    """State made of plain picklable Python objects, given as keyword arguments and exposed as attributes."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any) -> None:
        self._saved_state: Dict[str, Any] = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        # Copies, unlike upstream: a list or dict in the state that the program changes in place after a commit
        # would otherwise change the commit too, and a restore would not undo anything.
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


def run_fn(func: Callable[..., Any], reset: Callable[[], None]) -> Callable[..., Any]:
    """The body of ``hvd.elastic.run``: run ``func(state, ...)`` until it returns, re-forming the job after
    every failure or announced change of hosts (``reset`` shuts Horovod down and initializes it again).

    After every reset the state is synced from the new rank 0, also when hosts were only removed (upstream
    skips the sync then). Upstream's skip let survivors and workers started in the same round disagree about
    whether to sync, and the job hung (its issue #3494); the survivors' states are equal, so the sync changes
    nothing for them and costs one broadcast per reset.

    While ``func`` runs, SIGTERM is a preemption (:class:`Preemption`): the worker leaves at the next reset instead
    of re-forming, and exits with status 0.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        notification_manager.init()
        notification_manager.register_listener(state)
        preemption.install()
        try:
            while True:
                try:
                    state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError as exc:
                    if is_negotiation_error(exc):
                        log.error("the ranks disagree about a collective, which re-forming the job cannot fix: %s",
                                  exc)
                        raise
                    if preemption.leaving.is_set():
                        preemption.leave(f"after a failed collective ({exc})")
                    log.warning("a collective failed (%s): restoring the last commit and re-forming the job", exc)
                    state.restore()
                except HostsUpdatedInterrupt:
                    if preemption.leaving.is_set():
                        preemption.leave("at this commit, where the others re-form without it")
                    log.info("the driver announced a change of hosts: re-forming the job")
                reset()
                state.on_reset()
        finally:
            notification_manager.remove_listener(state)
            preemption.uninstall()

    return wrapper
