"""The authenticated wire: a mutual HMAC challenge on connect, then length-prefixed msgpack frames.

Every listening socket of the project (rendezvous, control, data) runs :func:`accept_handshake` before it reads
anything else, so a peer without the per-job secret cannot make a server parse a single message, and nothing
is ever unpickled from an unauthenticated peer. The secret travels from the launcher to the workers in the
environment variable ``_HOROVOD_SECRET_KEY`` (upstream's name), never on a command line or in a log.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct
from typing import Any, List, Optional

import msgpack

SECRET_ENV = "_HOROVOD_SECRET_KEY"
MAGIC = b"HVDPY\x00\x01\x00"
NONCE_BYTES = 16
MAC_BYTES = 32
MAX_HELLO_BYTES = 4096
MAX_FRAME_BYTES = 1 << 31
_HEADER = struct.Struct("<I")
_HELLO_HEAD = struct.Struct("<8s16sH")


class AuthenticationError(ConnectionError):
    """The peer did not prove it holds the job's secret (or spoke another protocol)."""


class PeerClosedError(ConnectionError):
    """The peer closed its connection (it exited, crashed or was killed)."""


def make_secret() -> str:
    """A fresh random per-job secret, as the hex string that goes into the workers' environment."""
    return secrets.token_hex(32)


def secret_from_env(env: Optional[dict] = None) -> Optional[bytes]:
    """The job's secret from the environment, or None when this process was not started by a launcher."""
    value = (os.environ if env is None else env).get(SECRET_ENV)
    return bytes.fromhex(value) if value else None


def secret_fingerprint(key: bytes) -> str:
    """A short, non-reversible name for the job derived from its secret (for shm segment names)."""
    return hashlib.sha256(b"horovod-job-id" + key).hexdigest()[:16]


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Read exactly ``n`` bytes; PeerClosedError when the peer closes first."""
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf))
    return buf


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from the socket (zero-copy into the caller's buffer)."""
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerClosedError("connection closed by peer")
        got += k


def accept_handshake(sock: socket.socket, key: bytes, timeout: float = 10.0) -> bytes:
    """Server side: challenge the client and return the hello it authenticated.

    Raises AuthenticationError on a wrong secret, a foreign protocol or garbage, without parsing any of it.
    """
    sock.settimeout(timeout)
    nonce_s = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(MAGIC + nonce_s)
    head = recv_exact(sock, _HELLO_HEAD.size)
    magic, nonce_c, hello_len = _HELLO_HEAD.unpack(head)
    if magic != MAGIC:
        raise AuthenticationError("peer does not speak the horovod wire protocol")
    if hello_len > MAX_HELLO_BYTES:
        raise AuthenticationError("oversized hello")
    hello = bytes(recv_exact(sock, hello_len))
    mac = bytes(recv_exact(sock, MAC_BYTES))
    if not hmac.compare_digest(mac, _mac(key, b"C", nonce_s, nonce_c, hello)):
        raise AuthenticationError("peer failed the secret-key challenge")
    sock.sendall(_mac(key, b"S", nonce_c, nonce_s))
    sock.settimeout(None)
    return hello


def connect_handshake(sock: socket.socket, key: bytes, hello: bytes = b"", timeout: float = 10.0) -> None:
    """Client side: answer the server's challenge and check that the server knows the secret too."""
    if len(hello) > MAX_HELLO_BYTES:
        raise ValueError("hello too long")
    sock.settimeout(timeout)
    head = recv_exact(sock, len(MAGIC) + NONCE_BYTES)
    if bytes(head[: len(MAGIC)]) != MAGIC:
        raise AuthenticationError("server does not speak the horovod wire protocol")
    nonce_s = bytes(head[len(MAGIC):])
    nonce_c = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(_HELLO_HEAD.pack(MAGIC, nonce_c, len(hello)) + hello + _mac(key, b"C", nonce_s, nonce_c, hello))
    try:
        reply = bytes(recv_exact(sock, MAC_BYTES))
    except PeerClosedError:
        raise AuthenticationError("server rejected our secret key (is _HOROVOD_SECRET_KEY the job's?)") from None
    if not hmac.compare_digest(reply, _mac(key, b"S", nonce_c, nonce_s)):
        raise AuthenticationError("server failed the secret-key challenge")
    sock.settimeout(None)


def pack(obj: Any) -> bytes:
    """Encode a control message (msgpack, binary-safe)."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data) -> Any:
    """Decode a control message produced by :func:`pack`."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def send_msg(sock: socket.socket, obj: Any) -> None:
    """Send one framed control message."""
    payload = pack(obj)
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def recv_msg(sock: socket.socket) -> Any:
    """Receive one framed control message (only ever called on an authenticated socket)."""
    (n,) = _HEADER.unpack(recv_exact(sock, _HEADER.size))
    if n > MAX_FRAME_BYTES:
        raise ConnectionError(f"frame of {n} bytes exceeds the limit")
    return unpack(recv_exact(sock, n))


class FrameReader:
    """Buffered reading of framed control messages from one socket: every whole message that one receive brings.

    :func:`recv_msg` costs two system calls per message, and a loop that reads one message per wake-up of its
    selector pays a whole pass of the loop for each. The coordinator hears from every worker for every
    collective (a request, often a wait notice after it), so it reads what has arrived at once and acts on each
    message. Only a :class:`FrameReader` may read its socket once it has read from it (it keeps a frame's
    beginning until the rest arrives).
    """

    CHUNK_BYTES = 1 << 16
    MAX_CHUNK_BYTES = 1 << 24        # a large frame's rest comes in receives of at most this

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()
        self._need = _HEADER.size       # bytes the next whole message needs in the buffer

    def read(self) -> List[Any]:
        """Receive what has arrived (call when the socket is readable: one receive, which then does not block)
        and return the messages it completed, in order: none when a message's rest is still on its way.
        PeerClosedError when the peer closed; ConnectionError for a frame beyond MAX_FRAME_BYTES."""
        buffer = self._buffer
        chunk = self.sock.recv(min(max(self.CHUNK_BYTES, self._need - len(buffer)), self.MAX_CHUNK_BYTES))
        if not chunk:
            raise PeerClosedError("connection closed by peer")
        buffer += chunk
        messages = []
        at, end = 0, len(buffer)
        while end - at >= _HEADER.size:
            (n,) = _HEADER.unpack_from(buffer, at)
            if n > MAX_FRAME_BYTES:
                raise ConnectionError(f"frame of {n} bytes exceeds the limit")
            if end - at - _HEADER.size < n:
                self._need = _HEADER.size + n
                break
            at += _HEADER.size
            messages.append(unpack(buffer[at:at + n]))
            at += n
        else:
            self._need = _HEADER.size
        if at:
            del buffer[:at]
        return messages


ELASTIC_PEER_TIMEOUT_MS = 4000
STATIC_PEER_TIMEOUT_MS = 60000


def peer_timeout_ms() -> int:
    """How long sent data may stay unacknowledged before the connection counts as lost (``TCP_USER_TIMEOUT``).

    Linux applies it to a zero window too: a peer that is alive but has not read for that long is dropped. An
    elastic job recovers from a wrong verdict with a reset, so it detects a silent host in 4 s; a fixed-size job
    would end, so it waits a minute, which a live peer inside a collective never needs.
    """
    from horovod.common import config

    return ELASTIC_PEER_TIMEOUT_MS if config.get("HOROVOD_ELASTIC") else STATIC_PEER_TIMEOUT_MS


def tune_socket(sock: socket.socket) -> None:
    """Low latency and fast dead-peer detection on a connected TCP socket (no-op for Unix sockets)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        # Keepalive finds a silent peer (host down, link cut) after about 4 s when nothing is in flight; the user
        # timeout does the same when sent data stays unacknowledged, so a survivor blocked in a send to a cut
        # host never waits out TCP's 15-minute retransmission limit.
        for opt, value in (("TCP_KEEPIDLE", 1), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3),
                           ("TCP_USER_TIMEOUT", peer_timeout_ms())):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
