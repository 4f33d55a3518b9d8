"""The raw pieces a small op is made of, timed alone: for ``benchmarks/small_op_breakdown.py``.

- a one-byte round trip between two processes over a Unix socket and over TCP loopback (TCP_NODELAY), both
  sides blocking in ``recv`` (what the control channel and the shm plane's barrier do);
- the same with the receiver polling (``MSG_DONTWAIT`` in a loop, what ``HOROVOD_SPIN_MICROSECONDS`` does);
- a hand-off between two threads of one process and back: a ``threading.Lock`` released by the other thread
  (what completing a handle costs), a ``threading.Event``, a ``Condition``, and a byte on a socketpair woken out
  of ``select`` (what waking the engine thread costs).

Prints one JSON object: piece -> sorted one-way latencies in ns (a round trip halved).
"""
from __future__ import annotations

import argparse
import json
import os
import select
import socket
import threading
import time
from typing import Callable, Dict, List, Tuple

_ns = time.perf_counter_ns


def _echo(sock: socket.socket, n: int, poll: bool) -> None:
    buf = bytearray(1)
    for _ in range(n):
        _recv(sock, buf, poll)
        sock.sendall(b"\0")


def _recv(sock: socket.socket, buf: bytearray, poll: bool) -> None:
    if not poll:
        sock.recv_into(buf, 1)
        return
    while True:
        try:
            if sock.recv_into(buf, 1, socket.MSG_DONTWAIT):
                return
        except BlockingIOError:
            pass


def _ping(sock: socket.socket, n: int, poll: bool) -> List[int]:
    buf = bytearray(1)
    out = []
    for _ in range(n):
        t0 = _ns()
        sock.sendall(b"\0")
        _recv(sock, buf, poll)
        out.append((_ns() - t0) // 2)
    return out


def _pair(kind: str) -> Tuple[socket.socket, socket.socket]:
    if kind == "unix":
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    listener.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def process_round_trip(kind: str, n: int, poll: bool) -> List[int]:
    """One-way latency between two processes over a ``kind`` ("unix" or "tcp") socket."""
    a, b = _pair(kind)
    pid = os.fork()
    if pid == 0:
        a.close()
        _echo(b, n + n // 10, poll)
        os._exit(0)
    b.close()
    _ping(a, n // 10, poll)
    out = _ping(a, n, poll)
    os.waitpid(pid, 0)
    a.close()
    return out


def thread_round_trip(make: Callable[[], Tuple[Callable[[], None], Callable[[], None]]], n: int) -> List[int]:
    """One-way hand-off latency between two threads: ``make()`` gives (signal, wait) for one direction."""
    there_signal, there_wait = make()
    back_signal, back_wait = make()

    def peer() -> None:
        for _ in range(n + n // 10):
            there_wait()
            back_signal()

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    out = []
    for i in range(n + n // 10):
        t0 = _ns()
        there_signal()
        back_wait()
        if i >= n // 10:
            out.append((_ns() - t0) // 2)
    thread.join()
    return out


def _lock_pair():
    lock = threading.Lock()
    lock.acquire()
    return lock.release, lock.acquire


def _event_pair():
    event = threading.Event()

    def wait() -> None:
        event.wait()
        event.clear()
    return event.set, wait


def _condition_pair():
    cond = threading.Condition()
    state = [0]

    def signal() -> None:
        with cond:
            state[0] += 1
            cond.notify()

    def wait() -> None:
        with cond:
            while not state[0]:
                cond.wait()
            state[0] -= 1
    return signal, wait


def _socket_select_pair():
    r, w = socket.socketpair()
    r.setblocking(False)

    def wait() -> None:
        select.select([r], [], [])
        r.recv(4096)
    return lambda: w.send(b"\0"), wait


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20000)
    args = parser.parse_args()
    n = args.iters
    result: Dict[str, List[int]] = {}
    for kind in ("unix", "tcp"):
        result[f"process {kind} socket, blocking recv"] = process_round_trip(kind, n, poll=False)
        result[f"process {kind} socket, polling recv"] = process_round_trip(kind, n, poll=True)
    for label, make in (("thread Lock release", _lock_pair), ("thread Event", _event_pair),
                        ("thread Condition", _condition_pair), ("thread socketpair + select", _socket_select_pair)):
        result[label] = thread_round_trip(make, n)
    print(json.dumps({k: sorted(v) for k, v in result.items()}))


if __name__ == "__main__":
    main()
