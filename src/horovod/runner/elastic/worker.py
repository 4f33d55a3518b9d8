"""Upstream's import path ``horovod.runner.elastic.worker``: the worker side of elastic notifications.

``HostUpdateResult``, ``WorkerNotificationManager`` and ``notification_manager`` live in
:mod:`horovod.common.elastic` (the shared ground, which the library's bindings use without the runner).

Upstream's driver pushes each host notice to a small server in every worker (``WorkerNotificationService``,
reached by a ``WorkerNotificationClient``). Here the driver puts the notice once into the job's rendezvous store
and every worker polls it (:mod:`horovod.common.elastic_rendezvous`); the two classes keep upstream's names and
methods on that channel.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from horovod.common.elastic import HostUpdateResult, WorkerNotificationManager, notification_manager
from horovod.common.elastic_rendezvous import NotificationPoller, publish_notice
from horovod.common.kvstore import KVStoreClient

__all__ = ["HostUpdateResult", "WorkerNotificationClient", "WorkerNotificationManager",
           "WorkerNotificationService", "notification_manager"]


class WorkerNotificationService:
    """A worker's receiver of the driver's host notices: each one goes to ``manager.handle_hosts_updated``.

    It polls the job's store at ``rendezvous_addr:rendezvous_port`` (default: ``HOROVOD_GLOO_RENDEZVOUS_ADDR`` /
    ``_PORT``, as horovodrun sets them) with ``key``, the job's secret. ``nic`` is upstream's argument; the store's
    address already says how to reach it. ValueError when no address is known.
    """

    NAME = "worker notification service"

    def __init__(self, key: bytes, nic: Optional[str], manager: WorkerNotificationManager,
                 rendezvous_addr: Optional[str] = None, rendezvous_port: Optional[int] = None,
                 timeout: float = 30.0) -> None:
        addr = rendezvous_addr or os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        port = rendezvous_port or os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
        if not addr or not port:
            raise ValueError("WorkerNotificationService needs the driver's store: pass rendezvous_addr and "
                             "rendezvous_port, or set HOROVOD_GLOO_RENDEZVOUS_ADDR and _PORT.")
        self._address = (addr, int(port))
        self._poller = NotificationPoller(
            KVStoreClient(addr, int(port), key, timeout=timeout),
            lambda timestamp, update: manager.handle_hosts_updated(timestamp, HostUpdateResult(update)))

    def addresses(self) -> Dict[str, List[Tuple[str, int]]]:
        """Where the notices come from (the driver's store), in upstream's ``{interface: [(addr, port)]}`` shape."""
        return {"rendezvous": [self._address]}

    def shutdown(self) -> None:
        """Stop polling."""
        self._poller.stop()


def _store_of(addresses: Any, key: Optional[bytes]) -> Tuple[Any, bool]:
    """(the store, whether this client opened a connection to it) for :class:`WorkerNotificationClient`."""
    store = getattr(addresses, "store", addresses)          # a RendezvousServer: its store
    if hasattr(store, "put") and hasattr(store, "get"):
        return store, False
    if isinstance(addresses, dict):                         # upstream's {interface: [(addr, port), ...]}
        addresses = next(addr for addrs in addresses.values() for addr in addrs)
    if key is None:
        raise ValueError("WorkerNotificationClient needs the job's secret to reach the store at "
                         f"{addresses!r}: pass key=.")
    addr, port = addresses
    return KVStoreClient(addr, int(port), key), True


class WorkerNotificationClient:
    """The driver's sender of host notices: :meth:`notify_hosts_updated` reaches every worker of the job.

    ``addresses`` is the job's store: the launcher's own (a ``RendezvousServer`` or its ``store``), or its
    ``(addr, port)`` (or upstream's ``{interface: [(addr, port)]}``), reached with ``key``, the job's secret.
    ``verbose`` and ``match_intf`` are upstream's arguments and change nothing.
    """

    def __init__(self, addresses: Any, key: Optional[bytes] = None, verbose: int = 0,
                 match_intf: bool = False) -> None:
        self._store, self._owned = _store_of(addresses, key)

    def notify_hosts_updated(self, timestamp: float, update_res: int) -> None:
        """Announce that the hosts changed (``update_res``, a :class:`HostUpdateResult`) at ``timestamp``."""
        publish_notice(self._store, int(update_res), timestamp)

    def close(self) -> None:
        """Close the connection this client opened (none for the launcher's own store)."""
        if self._owned:
            self._store.close()
