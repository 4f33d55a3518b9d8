"""``horovod.backends.mesh.build_mesh``: ranks in threads of one process connect to each other (same host: Unix
sockets; a host name of their own: TCP), stray connections are rejected, and a peer that does not connect within
``HOROVOD_GLOO_TIMEOUT_SECONDS`` fails the set-up with HorovodInternalError naming it."""
import os
import socket
import sys
import threading
import time

import pytest

from horovod.backends import mesh as mesh_module
from horovod.backends.mesh import build_mesh
from horovod.common.exceptions import HorovodInternalError
from horovod.common.topology import Topology
from tests.support.timing import SLACK_S

pytestmark = pytest.mark.timeout(60)

KEY = b"k" * 32


@pytest.fixture(autouse=True)
def _own_key(monkeypatch):
    """A key of each test's own: a rank's abstract Unix socket is named after the key's fingerprint, the
    generation, the host and the rank, so tests that reuse all four (rank 0 of host "h") would otherwise bind a
    name that the test before may still hold (CI saw EADDRINUSE once)."""
    monkeypatch.setattr(sys.modules[__name__], "KEY", os.urandom(32))


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

    with pytest.raises(HorovodInternalError, match=r"Rank 0 and rank\(s\) 1 did not connect within 2 s "
                                                   r"\(--gloo-timeout-seconds / HOROVOD_GLOO_TIMEOUT_SECONDS\)"):
        build_mesh(topo(0, 2, "h"), KEY, publish, 1, 20.0, "127.0.0.1", connect_timeout=2.0)
    assert "rank 0: rejected a connection" in caplog.text


def test_the_gloo_timeout_bounds_the_connections_not_the_start_timeout(monkeypatch):
    # Every rank reached the rendezvous, but rank 2 never connects: HOROVOD_GLOO_TIMEOUT_SECONDS (1 s) ends the
    # set-up on rank 0, long before the start timeout (60 s) would.
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "1")

    def publish(me, remaining):
        return [me, dict(me, rank=1), dict(me, rank=2)]

    started = time.monotonic()
    with pytest.raises(HorovodInternalError) as raised:
        build_mesh(topo(0, 3, "h"), KEY, publish, 1, 60.0, "127.0.0.1")
    assert time.monotonic() - started < 1.0 + SLACK_S
    message = str(raised.value)
    assert "rank(s) 1, 2 did not connect within 1 s" in message and "HOROVOD_GLOO_TIMEOUT_SECONDS" in message


def test_a_lower_rank_that_cannot_be_reached_is_named():
    # Rank 1 connects to rank 0 over TCP (another host name); nothing listens at rank 0's address any more.
    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()

    def publish(me, remaining):
        return [dict(me, rank=0, host="h0", port=port, uds="\0horovod-test-nobody"), me]

    with pytest.raises(HorovodInternalError, match=r"Rank 1 and rank\(s\) 0 did not connect within 1 s .*"
                                                   r"rank 0: could not connect to h0 at 127\.0\.0\.1:\d+ \(.*refused"):
        build_mesh(topo(1, 2, "h1"), KEY, publish, 1, 20.0, "127.0.0.1", connect_timeout=1.0)


@pytest.mark.parametrize("value,expected", [(None, 30.0), ("5", 5.0), ("0", 12.0)])
def test_the_connect_timeout_comes_from_the_knob(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("HOROVOD_GLOO_TIMEOUT_SECONDS", raising=False)
    else:
        monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", value)
    assert mesh_module.connect_timeout_from_config(12.0) == expected


def test_init_raises_horovod_internal_error_when_the_data_plane_cannot_be_set_up(monkeypatch):
    from horovod.core import basics, bootstrap

    def no_peer(topo, generation, mpi):
        raise HorovodInternalError("Rank 0 and rank(s) 1 did not connect within 1 s (--gloo-timeout-seconds / "
                                   "HOROVOD_GLOO_TIMEOUT_SECONDS)")

    monkeypatch.setattr(bootstrap.logging_setup, "configure", lambda rank: None)   # keep this process's logging
    monkeypatch.setattr(bootstrap, "_detect", lambda comm: (None, Topology(0, 2, 0, 2, 0, 1, "h", "test")))
    monkeypatch.setattr(bootstrap, "_start", no_peer)
    with pytest.raises(HorovodInternalError, match=r"Horovod initialization failed on rank 0 of 2: Rank 0 and "
                                                   r"rank\(s\) 1 did not connect .*HOROVOD_GLOO_TIMEOUT_SECONDS"):
        basics.init()


def test_each_rank_counts_the_ranks_on_its_machine():
    """Ranks under other host names (network namespaces, containers) on this kernel share its cores: the mesh
    counts them by the kernel's boot id, not by host name; a rank that published another machine is not
    counted."""
    board = Board(3)
    real = board.publish

    def publish(me, remaining):
        if me["rank"] == 2:
            me = dict(me, machine="another-kernel")
        return real(me, remaining)

    board.publish = publish
    meshes, errors = [None] * 3, []

    def run(rank):
        try:
            meshes[rank] = build_mesh(topo(rank, 3, f"host{rank}"), KEY, board.publish, 1, 20.0, "127.0.0.1")
        except BaseException as exc:   # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    try:
        assert [m.on_machine for m in meshes[:2]] == [2, 2]
        assert meshes[2].on_machine == 1
    finally:
        for m in meshes:
            m.close()
