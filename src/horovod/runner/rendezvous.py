"""The job's rendezvous server: an authenticated key-value store the ranks meet through.

It wraps :class:`horovod.common.kvstore.KVStoreServer` (HMAC challenge on every connection, msgpack frames; no
pickle from unauthenticated peers). The engine uses the scope ``rendezvous``; ``horovod.run`` uses ``runfunc``
and ``runfunc_result``.
"""
from __future__ import annotations

import logging
import threading
from typing import List, Optional

from horovod.common.kvstore import KVStoreServer
from horovod.common.wire import make_secret

from .common.util.hosts import SlotInfo

log = logging.getLogger(__name__)


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

    def start(self, host: str = "0.0.0.0", port: int = 0) -> int:
        """Start serving in a background thread and return the port."""
        if self._server is None:
            self._server = KVStoreServer(self.key, host=host, port=port)
            self._server.start()
            log.debug("rendezvous server listening on %s:%d", host, self._server.port)
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
