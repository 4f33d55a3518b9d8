"""Elastic training's worker side, shared by every binding: the state a job keeps across resets, and the loop
that restores it.

Upstream's model (contract §1.7): a training function runs under ``hvd.elastic.run``; a :class:`State` holds what
must survive a change of workers. ``commit()`` saves it (and checks whether the driver announced new or removed
hosts); when a collective fails (:class:`HorovodInternalError`) the loop restores the last commit, re-forms the
job and syncs the state from rank 0; when hosts were announced (:class:`HostsUpdatedInterrupt`) it re-forms without
restoring (nothing was lost).

Upstream keeps ``HostUpdateResult`` and the notification manager in ``horovod.runner.elastic.worker``, which its
``common/elastic.py`` imports; here the shared ground may not import the runner, so they live here and the
runner's module re-exports them.
"""
from __future__ import annotations

import copy
import enum
import functools
import logging
import queue
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, is_negotiation_error

log = logging.getLogger("horovod.elastic")


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
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        notification_manager.init()
        notification_manager.register_listener(state)
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
                    log.warning("a collective failed (%s): restoring the last commit and re-forming the job", exc)
                    state.restore()
                except HostsUpdatedInterrupt:
                    log.info("the driver announced a change of hosts: re-forming the job")
                reset()
                state.on_reset()
        finally:
            notification_manager.remove_listener(state)

    return wrapper
