"""A send that the peer stops taking is on the data-plane watchdog's board, as a silent receive is: a rank whose
link was cut while it sent (its receive already done) is reported and can be cut loose, instead of waiting until
TCP gives up (80 s and more)."""
import socket
import threading
import time

import numpy as np

from horovod.backends import peer_waits
from horovod.backends.comm import Comm, PeerLostError
from horovod.core.observers import watchdog


def _pair_comm():
    """A two-member Comm over a socketpair, seen from member 0; the other end (never read here) is returned."""
    a, b = socket.socketpair()
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    return Comm(0, [0, 7], [None, a], ["here", "there"]), a, b


def _board_wait(thread: threading.Thread, deadline_s: float = 5.0) -> peer_waits.PeerWait:
    """The thread's send wait, once on the board. Its receive (which completes at once) is on the board for a
    moment first: a busy machine let a snapshot catch it (once in a full run), so a receive's wait is passed by."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        wait = dict(peer_waits.snapshot()).get(thread.ident)
        if wait is not None and wait.sending:
            return wait
        time.sleep(0.01)
    raise AssertionError("the blocked send never appeared on the board")


def test_a_blocked_sendrecv_waits_on_its_send_where_the_watchdog_sees_and_cuts_it():
    comm, a, b = _pair_comm()
    payload = np.ones(8 << 20, np.uint8)            # far more than the socket buffers hold
    received = np.zeros(16, np.uint8)
    b.sendall(received.tobytes())                   # the receive completes at once; the send cannot
    errors = []

    def run():
        try:
            comm.sendrecv(1, memoryview(payload), 1, memoryview(received))
        except PeerLostError as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        wait = _board_wait(worker)
        assert wait.sending and wait.peer == 7 and wait.done < wait.total == payload.nbytes
        time.sleep(0.3)
        settings = watchdog._Settings()
        settings.warning_s, settings.shutdown_s = 0.1, 0.2
        report = watchdog.describe(None, wait, time.monotonic(), settings, ending=True)
        assert "could send nothing more to rank 7" in report, report
        assert f"of {payload.nbytes / (1 << 20):.2f} MiB to rank 7" in report, report
        watchdog._end(None, wait, report)               # what the watchdog does at the shutdown time
        worker.join(5)
        assert not worker.is_alive(), "cutting the socket must end the send"
        assert errors and "Rank 7 (host there)" in str(errors[0])
        assert worker.ident not in dict(peer_waits.snapshot())
    finally:
        a.close()
        b.close()
        comm.close()


def test_a_send_that_completes_leaves_nothing_on_the_board():
    comm, a, b = _pair_comm()
    try:
        comm.send(1, memoryview(np.arange(16, dtype=np.float32)))
        assert len(b.recv(64, socket.MSG_WAITALL)) == 64 and dict(peer_waits.snapshot()).get(threading.get_ident()) is None
    finally:
        a.close()
        b.close()
        comm.close()
