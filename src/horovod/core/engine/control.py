"""The control channel: the small messages between the coordinator (rank 0) and each worker.

Messages are lists (see :mod:`horovod.common.wire`) whose first element, a
:class:`horovod.core.controller.messages.Tag`, says what they are: requests, waits and their end, fast-round
parks, a rank's exit, response lists, shutdown, deadlock reports and aborts.
"""
from __future__ import annotations

import selectors
import socket
import threading
import time
from typing import Dict, List, Optional

from horovod.backends.comm import PeerLostError
from horovod.common import wire
from horovod.core.controller.messages import Tag

ABORT_REASON_WAIT_SECONDS = 0.5


class ControlChannel:
    """This rank's control sockets: to every worker on rank 0, to the coordinator on the others."""

    def __init__(self, rank: int, socks: Dict[int, socket.socket], hosts: Optional[List[str]], size: int,
                 ranks: Optional[List[int]] = None) -> None:
        self.rank = rank            # this rank's position in its process set; peers are positions too
        self.socks = socks
        self.hosts = list(hosts) if hosts else ["localhost"] * size
        self.ranks = list(ranks) if ranks is not None else list(range(size))     # position -> global rank
        self.send_lock = threading.Lock()   # a worker's user threads and engine thread both send
        # The only readers of the sockets (each keeps a message's beginning until the rest arrives).
        self.readers = {peer: wire.FrameReader(sock) for peer, sock in socks.items()}

    def host_of(self, peer: int) -> str:
        return self.hosts[peer] if 0 <= peer < len(self.hosts) else "?"

    def global_rank(self, peer: int) -> int:
        return self.ranks[peer] if 0 <= peer < len(self.ranks) else peer

    def lost(self, peer: int, exc: BaseException) -> PeerLostError:
        return PeerLostError(self.global_rank(peer), self.host_of(peer), str(exc) or "connection closed")

    def broadcast(self, msg: list, best_effort: bool = False) -> None:
        """Send ``msg`` to every worker; with ``best_effort`` (shutdown, abort) skip peers that are gone."""
        payload = wire.pack(msg)
        frame = len(payload).to_bytes(4, "little") + payload
        for peer, sock in self.socks.items():
            try:
                sock.sendall(frame)
            except OSError as exc:
                if not best_effort:
                    raise self.lost(peer, exc) from None

    def receive(self, peer: int) -> List[list]:
        """The messages from ``peer`` that have arrived (call when its socket is readable; see
        :class:`horovod.common.wire.FrameReader`); PeerLostError when the peer is gone."""
        try:
            return self.readers[peer].read()
        except OSError as exc:
            raise self.lost(peer, exc) from None

    def send_to_coordinator(self, msg: list) -> None:
        """A worker's message to rank 0; PeerLostError when rank 0 is gone."""
        try:
            with self.send_lock:
                wire.send_msg(self.socks[0], msg)
        except OSError as exc:
            raise self.lost(0, exc) from None

    def send_abort(self, reason: str) -> None:
        """Tell the others this rank aborts, and why (best effort: some may be gone)."""
        try:
            if self.rank == 0:
                self.broadcast([Tag.ABORT, reason], best_effort=True)
            elif 0 in self.socks:
                with self.send_lock:
                    wire.send_msg(self.socks[0], [Tag.ABORT, reason])
        except Exception:
            pass

    def root_cause(self, own: str, lost_rank: Optional[int] = None) -> str:
        """The reason to report for a lost peer: an abort message already on its way wins over our own view.

        When one rank dies, the ranks that notice first abort and close their sockets, so others may see *those*
        ranks' sockets close and would blame the wrong rank. Every aborting rank sends its reason on the control
        channel before closing, so we listen there briefly for a better-informed reason. The wait ends early
        when the lost rank's own control socket (``lost_rank``, a global rank) closes with no reason before the
        close: that rank died, so our own view is the root cause and nobody will send a better one.
        """
        socks = dict(self.socks)
        lost = self.ranks.index(lost_rank) if lost_rank in self.ranks else None
        deadline = time.monotonic() + ABORT_REASON_WAIT_SECONDS
        selector = selectors.DefaultSelector()
        try:
            for peer, sock in socks.items():
                selector.register(sock, selectors.EVENT_READ, peer)
            while socks and time.monotonic() < deadline:
                lost_closed = False
                for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
                    try:
                        messages = self.readers[key.data].read()
                    except (OSError, ValueError):
                        lost_closed = lost_closed or key.data == lost
                        selector.unregister(key.fileobj)
                        socks.pop(key.data, None)
                        continue
                    for msg in messages:
                        if msg and msg[0] == Tag.ABORT:
                            return msg[1]       # a reason that arrived with the close still wins
                if lost_closed:
                    return own
        finally:
            selector.close()
        return own
