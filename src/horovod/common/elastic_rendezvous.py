"""The conversation between an elastic job's workers and its driver, through the job's rendezvous store.

Both sides import this module (the driver in :mod:`horovod.runner.elastic.driver`, the workers in
:mod:`horovod.core.elastic_join`), so the scope names and message shapes live in one place. Everything goes over
the authenticated key-value store of :mod:`horovod.common.kvstore`; a worker opens no port for the driver.

- **Rounds.** The driver forms the job in numbered rounds. Each round assigns every slot (``host:local_rank``) a
  rank, size, local and cross rank. A worker that wants to join a round newer than ``after`` puts a request
  ``{"after": after, "nonce": n, "worker": id}`` under :data:`READY_SCOPE`, key ``<slot>``, and waits for the answer under
  :data:`ASSIGN_SCOPE`, key ``<slot>/<nonce>``: an assignment (with ``round``, and ``notices_from``, the first
  host notice that concerns the round), ``{"exit": why}`` when its slot
  is no longer part of the job (or the driver started a newer process on it, ``id`` being the one it gave each
  process it started), or ``{"end": why}`` when the job is over.
- **Abandoned rounds.** When a round breaks while it forms (a worker died before everyone connected), the driver
  puts :data:`ROUNDS_SCOPE` ``<round>.broken``; workers waiting for that round's peers give up at once.
- **Host notices.** When discovery changes the hosts, the driver puts ``[timestamp, HostUpdateResult]`` under
  :data:`NOTIFY_SCOPE`, keys ``0, 1, 2, ...``, and the next key in :data:`ROUNDS_SCOPE` ``notify_seq``. Each
  worker long-polls the next key (:func:`start_notification_poller`) and hands it to the notification manager.
- **Preemption.** A worker that receives SIGTERM from anyone but the driver (a spot instance about to be
  reclaimed) puts ``{"signal": "SIGTERM"}`` under :data:`LEAVE_SCOPE`, key ``<worker id>``
  (:func:`announce_leaving`), then leaves at its next commit. Before the driver signals workers itself (the job
  ends, a worker is stopped for not reporting), it puts :data:`STOP_SCOPE` ``<worker id>``, or ``*`` for all
  (:func:`mark_stopping`): a worker that finds it there takes the SIGTERM as an order to stop, not as a preemption.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from typing import Any, Dict, Iterable, Optional

from horovod.common import wire
from horovod.common.kvstore import KVStoreClient

log = logging.getLogger("horovod.elastic")  # a named channel: see horovod.common.logging_setup

READY_SCOPE = "elastic.ready"
ASSIGN_SCOPE = "elastic.assign"
ROUNDS_SCOPE = "elastic.rounds"
NOTIFY_SCOPE = "elastic.notify"
NOTIFY_SEQ_KEY = "notify_seq"
LEAVE_SCOPE = "elastic.leave"
STOP_SCOPE = "elastic.stop"
ALL_WORKERS = "*"
WORKER_ID_ENV = "HOROVOD_ELASTIC_WORKER_ID"     # which process the driver started on the slot
POLL_SECONDS = 30.0

_nonces = itertools.count()


def connect_from_env(timeout: Optional[float] = None) -> Optional[KVStoreClient]:
    """A connection to the driver's store when this process is a worker of an elastic job (``HOROVOD_ELASTIC``
    and the rendezvous address and secret set by ``horovodrun``), else None."""
    from horovod.common import config

    if not config.get("HOROVOD_ELASTIC"):
        return None
    addr = config.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = config.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    key = wire.secret_from_env()
    if not addr or not port or key is None:
        return None
    return KVStoreClient(addr, int(port), key,
                         timeout=config.get("HOROVOD_START_TIMEOUT") if timeout is None else timeout)


def slot_key(hostname: str, local_rank: int) -> str:
    """The identity of a worker's slot, stable across rounds: ``host:local_rank`` (upstream's key)."""
    return f"{hostname}:{local_rank}"


def broken_key(round_id: int) -> str:
    """The key under :data:`ROUNDS_SCOPE` that marks ``round_id`` as abandoned."""
    return f"{round_id}.broken"


def request_assignment(kv: KVStoreClient, slot: str, after: int) -> Dict[str, Any]:
    """Ask the driver for the first round after ``after`` that this slot takes part in, and wait for the answer.

    Waits as long as the driver takes (it may be waiting for hosts up to its elastic timeout); raises
    ConnectionError when the driver goes away.
    """
    nonce = f"{os.getpid()}.{next(_nonces)}"
    kv.put(READY_SCOPE, slot, wire.pack({"after": int(after), "nonce": nonce, "worker": os.environ.get(WORKER_ID_ENV)}))
    key = f"{slot}/{nonce}"
    while True:
        try:
            (value,) = kv.wait(ASSIGN_SCOPE, [key], POLL_SECONDS)
            break
        except TimeoutError:
            log.debug("still waiting for the elastic driver to form a round for %s", slot)
    kv.delete(ASSIGN_SCOPE, key)
    return wire.unpack(value)


def round_abandoned(kv: KVStoreClient, round_id: int) -> bool:
    """True when the driver gave up on ``round_id`` (a worker failed while it formed)."""
    return kv.get(ROUNDS_SCOPE, broken_key(round_id)) is not None


_joined = {"notices_from": None}


def note_round(answer: Dict[str, Any]) -> None:
    """Remember where the notices of the round this worker just joined start: a notice published while the worker
    was still starting up (before its poller ran) is meant for it too."""
    _joined["notices_from"] = answer.get("notices_from")


class NotificationPoller:
    """A worker's daemon thread that long-polls the driver's host notices and delivers them to ``deliver``.

    One per process, for the life of the process (it is not restarted at resets); it ends when the driver's
    store goes away or :meth:`stop` is called.
    """

    def __init__(self, kv: KVStoreClient, deliver) -> None:
        self._kv = kv
        self._deliver = deliver
        self._stopped = threading.Event()
        if _joined["notices_from"] is not None:
            self._next = int(_joined["notices_from"])    # notices since this worker's round was formed apply
        else:
            raw = kv.get(ROUNDS_SCOPE, NOTIFY_SEQ_KEY)
            self._next = int(raw.decode()) if raw else 0
        self._thread = threading.Thread(target=self._run, name="horovod-elastic-notices", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                (value,) = self._kv.wait(NOTIFY_SCOPE, [str(self._next)], POLL_SECONDS)
            except TimeoutError:
                continue
            except (ConnectionError, OSError) as exc:
                if not self._stopped.is_set():
                    log.debug("elastic notices: the driver's store went away (%s)", exc)
                return
            self._next += 1
            timestamp, update = wire.unpack(value)
            try:
                self._deliver(float(timestamp), int(update))
            except Exception:  # a listener's bug must not end the polling
                log.exception("elastic notices: a listener failed")

    def stop(self) -> None:
        self._stopped.set()
        self._kv.close()


def notice_count(store) -> int:
    """Driver side: how many notices were published so far (the sequence number of the next one)."""
    raw = store.get(ROUNDS_SCOPE, NOTIFY_SEQ_KEY)
    return int(raw.decode()) if raw else 0


def publish_notice(store, update: int, timestamp: Optional[float] = None) -> int:
    """Driver side: announce a change of hosts to every worker; returns the notice's sequence number."""
    seq = notice_count(store)
    store.put(NOTIFY_SCOPE, str(seq), wire.pack([time.time() if timestamp is None else timestamp, int(update)]))
    store.put(ROUNDS_SCOPE, NOTIFY_SEQ_KEY, str(seq + 1).encode())
    return seq


def driver_stops(kv: KVStoreClient, worker_id: str) -> bool:
    """Worker side: whether the driver is stopping this worker itself (:func:`mark_stopping`)."""
    return kv.get(STOP_SCOPE, ALL_WORKERS) is not None or kv.get(STOP_SCOPE, worker_id) is not None


def announce_leaving(kv: KVStoreClient, worker_id: str, signal_name: str = "SIGTERM") -> bool:
    """Worker side: tell the driver that this process leaves the job (it was preempted). False, and nothing is
    said, when the driver is stopping this worker itself (:func:`mark_stopping`): the signal came from it."""
    if driver_stops(kv, worker_id):
        return False
    kv.put(LEAVE_SCOPE, worker_id, wire.pack({"signal": signal_name}))
    return True


def mark_stopping(store, worker_ids: Optional[Iterable[str]] = None) -> None:
    """Driver side, before it signals workers: these workers (all when None) are stopped by the driver, so the
    SIGTERM they get is no preemption."""
    for worker_id in ([ALL_WORKERS] if worker_ids is None else worker_ids):
        store.put(STOP_SCOPE, worker_id, b"1")
