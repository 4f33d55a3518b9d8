"""Point-to-point messaging over the authenticated peer mesh, and the group views that algorithms use.

A :class:`Comm` is an ordered group of ranks (the whole job, the ranks on this host, or one rank per host) with a
connected socket to each member. Sends and receives go straight between the caller's numpy buffers and the
kernel (``sendall``/``recv_into`` on memoryviews, no intermediate copies, GIL released). Any socket failure
becomes :class:`PeerLostError` naming the global rank and host that went away.
"""
from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import Future
from typing import Optional, Sequence

import numpy as np

from horovod.backends import peer_waits
from horovod.common import wire

# Messages up to this size are sent before receiving without a helper thread: the kernel socket buffers
# (which data sockets enlarge) absorb them, so two peers that both send first cannot deadlock.
INLINE_SEND_BYTES = 64 * 1024
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
SEND_PIECE_BYTES = 1024 * 1024      # a helper thread's large send goes in pieces this big, each one's progress told


class PeerLostError(ConnectionError):
    """A peer's connection failed while an operation needed it."""

    def __init__(self, global_rank: int, host: str, detail: str) -> None:
        super().__init__(
            f"Rank {global_rank} (host {host}) closed its connection unexpectedly ({detail}): it exited, crashed "
            "or was killed. See that rank's output for the root cause."
        )
        self.global_rank = global_rank
        self.host = host


def as_bytes(arr: np.ndarray) -> memoryview:
    """A flat byte view of a contiguous array (no copy)."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def enlarge_buffers(sock: socket.socket) -> None:
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:
            pass


class _Sender:
    """One background thread that performs large sends while the caller receives (full-duplex exchange)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._job = None
        self._thread: Optional[threading.Thread] = None

    def submit(self, sock: socket.socket, view: memoryview, wait: peer_waits.PeerWait) -> Future:
        """Send ``view`` on ``sock`` from the helper thread, telling ``wait`` how far it got."""
        future: Future = Future()
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="horovod-sender", daemon=True)
                self._thread.start()
            self._job = (sock, view, wait, future)
            self._cond.notify()
        return future

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._job is None:
                    self._cond.wait()
                job, self._job = self._job, None
            if job is StopIteration:
                return
            sock, view, wait, future = job
            try:
                _send_all(sock, view, wait)
                future.set_result(None)
            except BaseException as exc:  # handed to the waiting caller
                future.set_exception(exc)

    def close(self) -> None:
        with self._cond:
            if self._thread is not None:
                self._job = StopIteration
                self._cond.notify()


def _send_all(sock: socket.socket, view: memoryview, wait: peer_waits.PeerWait) -> None:
    """``sendall``, telling ``wait`` each time the kernel takes more bytes: a peer that stops receiving (or a
    link that is cut) leaves the send without progress, which the data-plane watchdog reports as it does a
    silent receive."""
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    sent, n = 0, len(view)
    while sent < n:
        # A blocking send returns only once all it was given is queued: pieces let the progress show.
        k = sock.send(view[sent:sent + SEND_PIECE_BYTES])
        sent += k
        wait.done += k
        wait.last = time.monotonic()


def _recv_exact(sock: socket.socket, view: memoryview, wait: peer_waits.PeerWait) -> None:
    """Fill ``view`` from the socket, telling ``wait`` (the data-plane watchdog's view of it) how far it got."""
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise wire.PeerClosedError("connection closed by peer")
        got += k
        wait.done += k
        wait.last = time.monotonic()


class Comm:
    """A group of ranks with a socket to each member; ``rank``/``size`` are positions within the group."""

    def __init__(self, rank: int, global_ranks: Sequence[int], socks: Sequence[Optional[socket.socket]],
                 hosts: Sequence[str], sender: Optional[_Sender] = None) -> None:
        self.rank = rank
        self.size = len(global_ranks)
        self.global_ranks = list(global_ranks)
        self.socks = list(socks)
        self.hosts = list(hosts)
        self._sender = sender or _Sender()
        self.spin_s = 0.0

    def set_spin(self, microseconds: float) -> None:
        """Poll a receive this long (GIL released between polls) before blocking in the kernel."""
        self.spin_s = max(0.0, microseconds) / 1e6

    def sub(self, members: Sequence[int]) -> Comm:
        """The sub-group made of group positions ``members`` (this rank must be one of them)."""
        members = list(members)
        sub = Comm(members.index(self.rank), [self.global_ranks[m] for m in members],
                   [self.socks[m] for m in members], [self.hosts[m] for m in members], self._sender)
        sub.spin_s = self.spin_s
        return sub

    def _lost(self, peer: int, exc: BaseException) -> PeerLostError:
        return PeerLostError(self.global_ranks[peer], self.hosts[peer], str(exc) or type(exc).__name__)

    def send(self, peer: int, data) -> None:
        sock = self.socks[peer]
        nbytes = getattr(data, "nbytes", None) or len(data)
        wait = peer_waits.begin(self.global_ranks[peer], self.hosts[peer], sock, nbytes, sending=True)
        try:
            sock.sendall(data)
        except OSError as exc:
            raise self._lost(peer, exc) from None
        finally:
            peer_waits.end(wait)

    def recv_into(self, peer: int, view: memoryview) -> None:
        sock = self.socks[peer]
        wait = peer_waits.begin(self.global_ranks[peer], self.hosts[peer], sock, len(view))
        try:
            if self.spin_s:
                # A peer in the same collective usually answers within microseconds: poll briefly so that
                # neither side pays a scheduler wake-up, then block.
                got, n = 0, len(view)
                deadline = time.perf_counter() + self.spin_s
                while got < n:
                    try:
                        k = sock.recv_into(view[got:], n - got, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        if time.perf_counter() > deadline:
                            break
                        continue
                    if k == 0:
                        raise wire.PeerClosedError("connection closed by peer")
                    got += k
                if got == n:
                    return
                view = view[got:]
                wait.done = got
            _recv_exact(sock, view, wait)
        except (OSError, wire.PeerClosedError) as exc:
            raise self._lost(peer, exc) from None
        finally:
            peer_waits.end(wait)

    def sendrecv(self, dst: int, send_view: memoryview, src: int, recv_view: memoryview) -> None:
        """Send to ``dst`` while receiving from ``src``; safe for any sizes."""
        if len(send_view) <= INLINE_SEND_BYTES:
            self.send(dst, send_view)
            self.recv_into(src, recv_view)
            return
        sending = peer_waits.PeerWait(self.global_ranks[dst], self.hosts[dst], self.socks[dst], len(send_view),
                                      sending=True)
        future = self._sender.submit(self.socks[dst], send_view, sending)
        try:
            self.recv_into(src, recv_view)
        except BaseException:
            # The collective is lost: end the send too rather than wait for it (behind a dead host it would block
            # until TCP gives up), and report the receive's failure, which came first.
            try:
                self.socks[dst].shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                future.result()
            except OSError:
                pass
            raise
        if not future.done():
            # This rank now waits for its own send: the watchdog sees it (and can cut it) as it sees a receive.
            peer_waits.hold(sending)
        try:
            future.result()
        except OSError as exc:
            raise self._lost(dst, exc) from None
        finally:
            peer_waits.end(sending)

    def barrier(self) -> None:
        """Dissemination barrier: ceil(log2(size)) rounds of one-byte exchanges."""
        token = bytearray(1)
        view = memoryview(token)
        step = 1
        while step < self.size:
            self.send((self.rank + step) % self.size, b"\0")
            self.recv_into((self.rank - step) % self.size, view)
            step <<= 1

    def close(self) -> None:
        self._sender.close()

