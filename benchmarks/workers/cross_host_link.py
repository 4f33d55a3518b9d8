"""The shaped link's own ceiling: one TCP stream of raw bytes from one namespace host to another.

    python -m benchmarks.workers.cross_host_link serve PORT NBYTES     (prints RESULT with the receive rate)
    python -m benchmarks.workers.cross_host_link send ADDRESS PORT NBYTES
"""
from __future__ import annotations

import json
import socket
import sys
import time

CHUNK = 1 << 20


def serve(port: int, nbytes: int) -> None:
    """Accept one connection, read ``nbytes`` and print the rate from the first byte to the last."""
    with socket.create_server(("", port)) as server:
        conn, _ = server.accept()
        with conn:
            view = memoryview(bytearray(CHUNK))
            got = conn.recv_into(view)
            start = time.perf_counter()
            while got < nbytes:
                k = conn.recv_into(view)
                if k == 0:
                    break
                got += k
            seconds = time.perf_counter() - start
            conn.sendall(b"k")
    print("RESULT " + json.dumps({"bytes": got, "seconds": seconds}), flush=True)


def send(address: str, port: int, nbytes: int) -> None:
    """Connect (retrying while the server starts), send ``nbytes``, wait for the server's acknowledgement."""
    deadline = time.monotonic() + 20
    while True:
        try:
            conn = socket.create_connection((address, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with conn:
        conn.settimeout(None)
        block = bytes(CHUNK)
        sent = 0
        while sent < nbytes:
            conn.sendall(block)
            sent += CHUNK
        conn.recv(1)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
