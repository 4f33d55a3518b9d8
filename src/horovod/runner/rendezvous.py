"""The job's rendezvous server: an authenticated key-value store the ranks meet through.

It wraps :class:`horovod.common.kvstore.KVStoreServer` (HMAC challenge on every connection, msgpack frames; no
pickle from unauthenticated peers). The engine uses the scope ``rendezvous``; ``horovod.run`` uses ``runfunc``
and ``runfunc_result``.

Upstream's servers take a request-handler class whose ``_get_value``/``_put_value`` answer each ``GET`` and
``PUT``; :class:`KVStoreHandler` and :class:`RendezvousHandler` are that hook here (the elastic driver's handler,
:func:`horovod.runner.elastic.rendezvous.create_rendezvous_handler`, computes a slot's rank and size on ``GET``).
"""
from __future__ import annotations

import logging
import threading
from typing import List, Optional, Type

from horovod.common.kvstore import KVStoreServer
from horovod.common.wire import make_secret

from .common.util.hosts import SlotInfo

log = logging.getLogger(__name__)


class KVStoreHandler:
    """How the job's store answers ``GET`` and ``PUT`` (upstream's handler of the KV store's HTTP requests).

    Subclass it, override :meth:`_get_value` / :meth:`_put_value` (calling the base for what they do not handle,
    as upstream's handlers do) and pass the class to :meth:`RendezvousServer.start`. Every get and put of the
    store, the launcher's own and the workers' over the authenticated wire, then goes through it; ``wait``,
    ``items`` and ``delete`` go to the store directly.
    """

    def __init__(self, store: KVStoreServer) -> None:
        self.store = store

    def _get_value(self, scope: str, key: str) -> Optional[bytes]:
        """The value at ``scope/key``, None when there is none."""
        return KVStoreServer.get(self.store, scope, key)

    def _put_value(self, scope: str, key: str, value: bytes) -> None:
        """Store ``value`` at ``scope/key`` (the store's watchers see it)."""
        KVStoreServer.put(self.store, scope, key, value)


class RendezvousHandler(KVStoreHandler):
    """The rendezvous server's handler (upstream's subclass of the KV store's, which adds ``DELETE``; our store
    always has it). The base for handlers given to :meth:`RendezvousServer.start`."""


class _Store(KVStoreServer):
    """The job's store: gets and puts go through ``handler`` once one is installed."""

    handler: Optional[KVStoreHandler] = None

    def get(self, scope: str, key: str) -> Optional[bytes]:
        handler = self.handler
        return super().get(scope, key) if handler is None else handler._get_value(scope, key)

    def put(self, scope: str, key: str, value: bytes) -> None:
        handler = self.handler
        if handler is None:
            super().put(scope, key, value)
        else:
            handler._put_value(scope, key, value)


class RendezvousServer:
    """Owns the job secret and the KV store server; ``start()`` binds a free port on all interfaces."""

    def __init__(self, verbose: int = 0, secret: Optional[str] = None) -> None:
        self.secret: str = secret or make_secret()
        self.verbose = verbose
        self._server: Optional[KVStoreServer] = None
        self.host_alloc_plan: List[SlotInfo] = []

    @property
    def key(self) -> bytes:
        """The secret as bytes (the HMAC key)."""
        return bytes.fromhex(self.secret)

    @property
    def store(self) -> KVStoreServer:
        """The running KV store (local put/get/items/wait for the launcher)."""
        if self._server is None:
            raise RuntimeError("the rendezvous server is not started; call start() first")
        return self._server

    @property
    def started(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._server is not None

    def start(self, handler_cls: Optional[Type[KVStoreHandler]] = None, host: str = "0.0.0.0", port: int = 0) -> int:
        """Start serving in a background thread (once) and return the port.

        ``handler_cls`` (upstream's argument) installs that handler on the store, also when it already runs.
        """
        if self._server is None:
            self._server = _Store(self.key, host=host, port=port)
            self._server.start()
            log.debug("rendezvous server listening on %s:%d", host, self._server.port)
        if handler_cls is not None:
            self._server.handler = handler_cls(self._server)
        return self._server.port

    @property
    def port(self) -> int:
        return self.store.port

    def init(self, host_alloc_plan: List[SlotInfo]) -> None:
        """Record the slot plan of the job (upstream API; the elastic driver will reuse it)."""
        self.host_alloc_plan = list(host_alloc_plan)

    def stop(self, wait: bool = False) -> None:
        """Stop serving and close the socket (idempotent).

        The server's accept loop notices a shutdown only at its next poll (up to 0.5 s), so by default the stop
        completes in a background thread and the launcher does not wait for it.
        """
        server, self._server = self._server, None
        if server is None:
            return
        if wait:
            server.stop()
        else:
            threading.Thread(target=server.stop, name="horovod-rendezvous-stop", daemon=True).start()

    def __enter__(self) -> RendezvousServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop(wait=True)
