"""The plain-Python floor of the cross-host benchmark (benchmarks/workers/cross_host_floor.py): its star and
recursive doubling give every rank the sum, over real TCP connections on localhost (a loopback address per rank,
as each host has its own), one thread per rank."""
import socket

import numpy as np
import pytest

from benchmarks.workers import cross_host_floor
from tests.support.thread_ranks import on_threads


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("algorithm,size", [("star", 1), ("star", 3), ("star", 4), ("rd", 2), ("rd", 4)])
def test_every_rank_gets_the_sum(algorithm, size):
    port = _free_port()
    build = {"star": cross_host_floor.star, "rd": cross_host_floor.recursive_doubling}[algorithm]

    def rank_main(rank: int) -> list:
        peers = cross_host_floor.mesh(rank, [f"127.0.0.{r + 1}" for r in range(size)], port)
        x = np.arange(5, dtype=np.float32) + 10 * rank
        run = build(rank, size, peers, x)
        got = [run().copy() for _ in range(3)]
        for sock in peers.values():
            sock.close()
        return got

    results = on_threads(size, rank_main, 30)
    expected = sum(np.arange(5, dtype=np.float32) + 10 * r for r in range(size))
    for rank in range(size):
        for got in results[rank]:
            np.testing.assert_array_equal(got, expected)


def test_recursive_doubling_needs_a_power_of_two():
    with pytest.raises(SystemExit, match="power-of-two"):
        cross_host_floor.recursive_doubling(0, 3, {}, np.ones(1, np.float32))
