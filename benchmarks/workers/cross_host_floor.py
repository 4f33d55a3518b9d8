"""The floor of the cross-host benchmark's 4 KB allreduce: the same blocking call in plain Python, one thread per
host, over raw TCP (no library, no engine thread, no negotiation, no checks), so that what any Python implementation
pays on these hosts for a small allreduce (the kernel's TCP path, a scheduler wake-up per message) is measured
beside ours in the same run.

``star``: every rank sends its 4 KB to rank 0, which sums them in rank order and sends the sum back (what a
carried collective moves: 2(n-1) messages, two hops). ``rd``: recursive doubling, log2(n) exchanges with the peer
``rank ^ mask`` (n a power of two).

    python -m benchmarks.workers.cross_host_floor star|rd RANK SIZE ADDR0,ADDR1,... PORT [warmup iters batches calls]
"""
from __future__ import annotations

import socket
import struct
import sys
import time
from typing import Callable, Dict, List

import numpy as np

from benchmarks.workers.cross_host_timing import SMALL_BYTES, parse_args, per_batch, report

CONNECT_SECONDS = 60.0


def _receive(sock: socket.socket, nbytes: int) -> bytearray:
    buffer = bytearray(nbytes)
    view, got = memoryview(buffer), 0
    while got < nbytes:
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("a peer closed its connection")
        got += n
    return buffer


def mesh(rank: int, addresses: List[str], port: int) -> Dict[int, socket.socket]:
    """A TCP connection to every other rank (this rank dials the lower ranks, the higher ones dial it)."""
    listener = socket.create_server((addresses[rank], port), backlog=len(addresses))
    peers: Dict[int, socket.socket] = {}
    deadline = time.monotonic() + CONNECT_SECONDS
    for other in range(rank):
        while True:
            try:
                sock = socket.create_connection((addresses[other], port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        sock.sendall(struct.pack("!i", rank))
        peers[other] = sock
    for _ in range(len(addresses) - 1 - rank):
        sock, _ = listener.accept()
        peers[struct.unpack("!i", _receive(sock, 4))[0]] = sock
    listener.close()
    for sock in peers.values():
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return peers


def star(rank: int, size: int, peers: Dict[int, socket.socket], x: np.ndarray) -> Callable[[], np.ndarray]:
    """Gather to rank 0, sum in rank order, send the sum back."""
    nbytes = x.nbytes

    def run() -> np.ndarray:
        if rank != 0:
            peers[0].sendall(x)
            return np.frombuffer(_receive(peers[0], nbytes), x.dtype)
        total = x.copy()
        for other in range(1, size):
            total += np.frombuffer(_receive(peers[other], nbytes), x.dtype)
        for other in range(1, size):
            peers[other].sendall(total)
        return total
    return run


def recursive_doubling(rank: int, size: int, peers: Dict[int, socket.socket],
                       x: np.ndarray) -> Callable[[], np.ndarray]:
    """log2(size) exchanges of the running sum with the peer ``rank ^ mask``."""
    if size & (size - 1):
        raise SystemExit("rd needs a power-of-two number of ranks")

    def run() -> np.ndarray:
        total, mask = x.copy(), 1
        while mask < size:
            peer = peers[rank ^ mask]
            peer.sendall(total)
            total += np.frombuffer(_receive(peer, total.nbytes), total.dtype)
            mask <<= 1
        return total
    return run


def main(argv: List[str]) -> None:
    algorithm, rank, size, addresses, port = argv[0], int(argv[1]), int(argv[2]), argv[3].split(","), int(argv[4])
    args = parse_args(argv[5:])
    peers = mesh(rank, addresses[:size], port)
    x = np.ones(SMALL_BYTES // 4, np.float32)
    run = {"star": star, "rd": recursive_doubling}[algorithm](rank, size, peers, x)
    if not np.all(run() == size):
        raise SystemExit(f"rank {rank}: the {algorithm} allreduce gave a wrong sum")

    def barrier() -> None:
        star(rank, size, peers, np.zeros(1, np.float32))()

    small = per_batch(run, barrier, args["small_batches"], args["small_calls"])
    if rank == 0:
        report(f"python-{algorithm}", size, 1, [], small)
    for sock in peers.values():
        sock.close()


if __name__ == "__main__":
    main(sys.argv[1:])
