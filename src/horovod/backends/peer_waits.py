"""Where this process's threads wait for a peer in the data plane, right now.

Every blocking receive of the socket data planes (:meth:`horovod.backends.comm.Comm.recv_into`: the shm plane's
barriers, the tcp plane's rings and exchanges, both halves of the hierarchical plane), and every blocking call of
the MPI plane (which says neither which rank it waits for nor how far it got), records itself on the board
while it waits: which peer, over which socket, since when, how many bytes it expects and how many have come. The
data-plane watchdog (:mod:`horovod.core.engine.watchdog`) reads the board from its own thread to notice a peer
that stopped sending. A record costs one small object, a dict store and a pop per receive; its fields are
written by the waiting thread and only read by the watchdog (a torn read costs at most one tick's accuracy).
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple

_board: Dict[int, PeerWait] = {}     # thread ident -> that thread's current wait
_owners: Dict[int, int] = {}         # helper thread ident -> the thread it works for (a ring sender -> its engine)


ANY_PEER = -1       # an MPI call: MPI does not say which rank it waits for


class PeerWait:
    """One thread's blocking receive from one peer, or (``peer`` is :data:`ANY_PEER`) one blocking MPI call."""

    __slots__ = ("peer", "host", "sock", "since", "last", "done", "total", "call", "abort", "sending", "owner")

    def __init__(self, peer: int, host: str, sock: Optional[socket.socket], total: int, call: str = "",
                 abort: Optional[Callable[[], None]] = None, sending: bool = False) -> None:
        self.peer = peer                # the peer's global rank (ANY_PEER inside an MPI call)
        self.host = host                # the peer's host, as the mesh knows it
        self.sock = sock
        self.since = self.last = time.monotonic()     # the wait began; the last bytes came
        self.done = 0
        self.total = total
        self.call = call                # the MPI call waited in ("MPI_Allreduce"), else ""
        self.abort = abort              # how to end a wait that no socket can cut (MPI: abort the job)
        self.sending = sending          # a send to the peer that the kernel does not take (its buffer is full)
        ident = threading.get_ident()
        self.owner = _owners.get(ident, ident)      # the thread this wait is made for (see work_for)

    def quiet_for(self, now: float) -> float:
        """Seconds since the peer last sent anything to this wait, or (``sending``) since the kernel last took
        bytes of this send for it (or since it began)."""
        return now - max(self.since, self.last)


def begin(peer: int, host: str, sock: Optional[socket.socket], total: int, call: str = "",
          abort: Optional[Callable[[], None]] = None, sending: bool = False) -> PeerWait:
    """The calling thread starts waiting for ``total`` bytes from global rank ``peer`` (``sending``: for the kernel
    to take ``total`` bytes for it; or, with ``call``, inside that blocking MPI call, which ``abort`` can end)."""
    wait = PeerWait(peer, host, sock, total, call, abort, sending)
    _board[threading.get_ident()] = wait
    return wait


@contextlib.contextmanager
def working_for(owner: int) -> Iterator[None]:
    """Inside the block, the calling thread's waits are made for thread ``owner``: a helper that sends or receives
    for an engine thread, so that its stalls are reported with the engine's collective and rank."""
    ident = threading.get_ident()
    _owners[ident] = owner
    try:
        yield
    finally:
        _owners.pop(ident, None)


def start_helper(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread that runs ``target`` for the calling thread: the helper's waits are made for the
    caller (:func:`working_for`), so that its stalls are reported with the caller's collective and rank. A
    daemon, so that a helper stuck on a lost peer cannot hold the process at exit."""
    owner = threading.get_ident()

    def run() -> None:
        with working_for(owner):
            target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def hold(wait: PeerWait) -> PeerWait:
    """The calling thread now waits on ``wait``, made earlier (a send that a helper thread performs)."""
    _board[threading.get_ident()] = wait
    return wait


def end(wait: PeerWait) -> None:
    """The calling thread's wait is over (whatever its outcome)."""
    ident = threading.get_ident()
    if _board.get(ident) is wait:
        del _board[ident]


def snapshot() -> List[Tuple[int, PeerWait]]:
    """(thread ident, wait) for every thread waiting now."""
    return list(_board.items())


def peer_pid(wait: PeerWait) -> Optional[int]:
    """The peer's process id when it is on this host (its socket is a Unix socket: the kernel's credentials)."""
    sock = wait.sock
    if sock is None or getattr(socket, "SO_PEERCRED", None) is None:
        return None
    try:
        if sock.family != socket.AF_UNIX:
            return None
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    except OSError:
        return None
    pid = int.from_bytes(creds[:4], "little", signed=True)
    return pid if pid > 0 else None
