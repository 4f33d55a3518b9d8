"""``horovod.backends.mesh.build_mesh``: ranks in threads of one process connect to each other (same host: Unix
sockets; a host name of their own: TCP), stray connections are rejected, and a missing peer is a timeout."""
import socket
import threading

import pytest

from horovod.backends.mesh import build_mesh
from horovod.common.topology import Topology

pytestmark = pytest.mark.timeout(60)

KEY = b"k" * 32


class Board:
    """An in-process ``publish``: every rank's address, once all ``size`` have put theirs."""

    def __init__(self, size):
        self.infos = [None] * size
        self.ready = threading.Barrier(size)

    def publish(self, me, remaining):
        self.infos[me["rank"]] = me
        self.ready.wait(remaining)
        return list(self.infos)


def topo(rank, size, hostname):
    return Topology(rank, size, 0, 1, rank, size, hostname, "test")


def build_all(size, hostnames, generation=1, timeout=20.0, before=None):
    board = Board(size)
    meshes, errors = [None] * size, []

    def run(rank):
        try:
            meshes[rank] = build_mesh(topo(rank, size, hostnames[rank]), KEY, board.publish, generation, timeout,
                                      "127.0.0.1")
        except BaseException as exc:   # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return meshes, errors


def echo_ok(a, b):
    a.sendall(b"ping")
    return b.recv(4) == b"ping"


@pytest.mark.parametrize("hostnames", [["h", "h", "h"], ["h0", "h1", "h2"]], ids=["unix", "tcp"])
def test_three_ranks_connect(hostnames):
    meshes, errors = build_all(3, hostnames)
    assert not errors
    try:
        for m in meshes:
            assert m.hosts == hostnames and m.listeners == []
            assert sorted(m.control) == ([1, 2] if m.rank == 0 else [0])
            assert [s is None for s in m.data] == [r == m.rank for r in range(3)]
            assert all(s.gettimeout() is None for s in list(m.control.values()) + [s for s in m.data if s])
        assert echo_ok(meshes[0].data[2], meshes[2].data[0]) and echo_ok(meshes[2].control[0], meshes[0].control[2])
    finally:
        for m in meshes:
            m.close()


def test_stray_connection_is_rejected_and_a_missing_peer_times_out(caplog):
    # One rank of two: nobody connects but a stranger with no handshake, so the acceptor rejects it and times out.
    def publish(me, remaining):
        stray = socket.create_connection(("127.0.0.1", me["port"]))
        stray.sendall(b"hello?" * 20)
        stray.shutdown(socket.SHUT_WR)
        return [me, dict(me, rank=1)]

    with pytest.raises(TimeoutError, match=r"Rank\(s\) \[1\] did not connect to rank 0 within 2s"):
        build_mesh(topo(0, 2, "h"), KEY, publish, 1, 2.0, "127.0.0.1")
    assert "rank 0: rejected a connection" in caplog.text
