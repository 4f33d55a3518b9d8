"""The authenticated key-value store that ranks rendezvous through.

The launcher runs a :class:`KVStoreServer`; workers use :class:`KVStoreClient` to publish their data-plane
addresses and to read everyone else's. The model is upstream's Gloo rendezvous store (``PUT``/``GET``/``DELETE``
of ``/<scope>/<key>``), carried over the authenticated wire instead of plain HTTP: every connection proves it
holds the job's secret before the server reads a request.
"""
from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from horovod.common import wire

log = logging.getLogger(__name__)


class KVStoreServer:
    """A threaded TCP server holding ``scope -> key -> bytes``; waits are served server-side."""

    def __init__(self, key: bytes, host: str = "0.0.0.0", port: int = 0) -> None:
        self._key = key
        self._data: Dict[str, Dict[str, bytes]] = {}
        self._cond = threading.Condition()
        store = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                store._serve(self.request, self.client_address)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((host, port), Handler)
        self._thread: Optional[threading.Thread] = None
        self._rejected = 0
        self._watchers: Dict[str, Callable[[str, bytes], None]] = {}

    def watch(self, scope: str, callback: Callable[[str, bytes], None]) -> None:
        """Call ``callback(key, value)`` after every put into ``scope`` (from the putting thread, outside the
        store's lock); the elastic driver learns of its workers' requests this way."""
        with self._cond:
            self._watchers[scope] = callback

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> int:
        """Serve in a daemon thread; returns the port."""
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="horovod-kvstore", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # Local access for the driver process.
    def put(self, scope: str, key: str, value: bytes) -> None:
        with self._cond:
            self._data.setdefault(scope, {})[key] = bytes(value)
            self._cond.notify_all()
            watcher = self._watchers.get(scope)
        if watcher is not None:
            watcher(key, bytes(value))

    def get(self, scope: str, key: str) -> Optional[bytes]:
        with self._cond:
            return self._data.get(scope, {}).get(key)

    def items(self, scope: str) -> Dict[str, bytes]:
        with self._cond:
            return dict(self._data.get(scope, {}))

    def delete_scope(self, scope: str) -> None:
        with self._cond:
            self._data.pop(scope, None)

    def delete(self, scope: str, key: str) -> None:
        with self._cond:
            self._data.get(scope, {}).pop(key, None)

    def wait(self, scope: str, keys: List[str], timeout: float) -> Tuple[bool, List[Optional[bytes]]]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                table = self._data.get(scope, {})
                if all(k in table for k in keys):
                    return True, [table[k] for k in keys]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False, [table.get(k) for k in keys]
                self._cond.wait(min(remaining, 1.0))

    def _serve(self, sock: socket.socket, addr) -> None:
        try:
            wire.accept_handshake(sock, self._key)
        except (OSError, wire.AuthenticationError) as exc:
            # Rate-limited: a port scanner must not flood the job's log.
            self._rejected += 1
            level = logging.WARNING if self._rejected <= 5 else logging.DEBUG
            log.log(level, "rendezvous: rejected a connection from %s: %s%s", addr[0], exc,
                    " (further rejections are logged at DEBUG)" if self._rejected == 5 else "")
            return
        try:
            while True:
                try:
                    msg = wire.recv_msg(sock)
                except (wire.PeerClosedError, ConnectionError):
                    return
                wire.send_msg(sock, self._dispatch(msg))
        except Exception as exc:  # a misbehaving client must never take the server down
            log.warning("rendezvous: dropped a client after an error: %s", exc)

    def _dispatch(self, msg) -> list:
        if not isinstance(msg, list) or not msg or not isinstance(msg[0], str):
            return ["error", "malformed request"]
        op = msg[0]
        if op == "put" and len(msg) == 4:
            self.put(str(msg[1]), str(msg[2]), msg[3])
            return ["ok"]
        if op == "get" and len(msg) == 3:
            value = self.get(str(msg[1]), str(msg[2]))
            return ["missing"] if value is None else ["ok", value]
        if op == "wait" and len(msg) == 4:
            ok, values = self.wait(str(msg[1]), [str(k) for k in msg[2]], float(msg[3]))
            return ["ok", values] if ok else ["timeout", [k for k, v in zip(msg[2], values) if v is None]]
        if op == "delete" and len(msg) == 3:
            self.delete(str(msg[1]), str(msg[2]))
            return ["ok"]
        if op == "items" and len(msg) == 2:
            return ["ok", self.items(str(msg[1]))]
        return ["error", f"unknown request {op!r}"]


class KVStoreClient:
    """A worker's connection to the rendezvous store (one persistent authenticated socket)."""

    def __init__(self, addr: str, port: int, key: bytes, timeout: float = 30.0) -> None:
        self._lock = threading.Lock()
        deadline = time.monotonic() + timeout
        last_error: Optional[Exception] = None
        while True:
            try:
                sock = socket.create_connection((addr, port), timeout=min(5.0, timeout))
                wire.tune_socket(sock)
                wire.connect_handshake(sock, key, b"kv")
                break
            except wire.AuthenticationError:
                raise
            except OSError as exc:
                last_error = exc
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"Could not reach the horovod rendezvous server at {addr}:{port} within {timeout:.0f}s "
                        f"({last_error}). Is the launcher still running, and is the address reachable from "
                        "this host (see --network-interfaces)?"
                    ) from exc
                time.sleep(0.1)
        self._sock = sock

    def _call(self, *msg):
        with self._lock:
            wire.send_msg(self._sock, list(msg))
            return wire.recv_msg(self._sock)

    def put(self, scope: str, key: str, value: bytes) -> None:
        self._call("put", scope, key, value)

    def get(self, scope: str, key: str) -> Optional[bytes]:
        reply = self._call("get", scope, key)
        return reply[1] if reply[0] == "ok" else None

    def wait(self, scope: str, keys: List[str], timeout: float) -> List[bytes]:
        """Block until every key exists; TimeoutError names the missing keys."""
        reply = self._call("wait", scope, list(keys), timeout)
        if reply[0] != "ok":
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {scope}/{reply[1]}")
        return reply[1]

    def delete(self, scope: str, key: str) -> None:
        self._call("delete", scope, key)

    def items(self, scope: str) -> Dict[str, bytes]:
        return self._call("items", scope)[1]

    def local_address(self) -> Optional[str]:
        """This end's IP address (the interface that reaches the store)."""
        try:
            return self._sock.getsockname()[0]
        except OSError:
            return None

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
