"""The authenticated rendezvous store: put/get/wait/timeouts, and intruders that must not disturb it."""
import logging
import os
import socket
import threading
import time

import pytest

from horovod.common import wire
from horovod.common.kvstore import KVStoreClient, KVStoreServer

KEY = bytes.fromhex(wire.make_secret())


@pytest.fixture
def server():
    srv = KVStoreServer(KEY, host="127.0.0.1")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    c = KVStoreClient("127.0.0.1", server.port, KEY, timeout=5)
    yield c
    c.close()


def test_put_get_delete_items(server, client):
    assert client.get("scope", "k") is None
    client.put("scope", "k", b"v1")
    assert client.get("scope", "k") == b"v1"
    client.put("scope", "k", b"v2")
    client.put("scope", "other", b"\x00" * 1000)
    assert client.get("scope", "k") == b"v2"
    assert client.get("another", "k") is None
    assert client.items("scope") == {"k": b"v2", "other": b"\x00" * 1000}
    client.delete("scope", "k")
    assert client.get("scope", "k") is None
    assert server.get("scope", "other") == b"\x00" * 1000        # the driver's local view
    server.put("scope", "local", b"x")
    assert client.get("scope", "local") == b"x"
    server.delete_scope("scope")
    assert client.items("scope") == {}


def test_wait_returns_once_every_key_exists(server, client):
    other = KVStoreClient("127.0.0.1", server.port, KEY, timeout=5)
    try:
        def later():
            time.sleep(0.2)
            other.put("mesh", "1", b"one")
            time.sleep(0.1)
            other.put("mesh", "2", b"two")

        client.put("mesh", "0", b"zero")
        thread = threading.Thread(target=later)
        start = time.monotonic()
        thread.start()
        values = client.wait("mesh", ["0", "1", "2"], timeout=10)
        elapsed = time.monotonic() - start
        thread.join()
        assert values == [b"zero", b"one", b"two"]
        assert 0.25 <= elapsed < 5
    finally:
        other.close()


def test_wait_timeout_names_the_missing_keys(client):
    client.put("mesh", "0", b"zero")
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        client.wait("mesh", ["0", "1", "7"], timeout=0.3)
    assert time.monotonic() - start < 3
    assert "1" in str(info.value) and "7" in str(info.value) and "mesh" in str(info.value)


def test_local_wait(server):
    ok, values = server.wait("s", ["a"], timeout=0.1)
    assert not ok and values == [None]
    server.put("s", "a", b"1")
    assert server.wait("s", ["a"], timeout=0.1) == (True, [b"1"])


def test_many_clients_at_once(server):
    def work(i):
        c = KVStoreClient("127.0.0.1", server.port, KEY, timeout=5)
        try:
            c.put("many", str(i), str(i).encode())
            assert c.wait("many", [str(j) for j in range(8)], timeout=10)[i] == str(i).encode()
        finally:
            c.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(server.items("many")) == 8


def test_wrong_key_is_refused(server):
    with pytest.raises(wire.AuthenticationError):
        KVStoreClient("127.0.0.1", server.port, bytes.fromhex(wire.make_secret()), timeout=5)


def test_garbage_and_foreign_protocols_do_not_disturb_the_server(server, caplog):
    caplog.set_level(logging.DEBUG, logger="horovod.common.kvstore")
    for garbage in (os.urandom(4096), b"GET /scope/key HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 32, b""):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            # The server may reject and reset the connection before we finish talking: that is the point, so
            # errors on this (intruder's) side are expected; what matters is that the server keeps serving.
            try:
                if garbage:
                    s.sendall(garbage)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(5)
                while s.recv(4096):
                    pass
            except OSError:
                pass
    good = KVStoreClient("127.0.0.1", server.port, KEY, timeout=5)
    try:
        good.put("s", "k", b"still here")
        assert good.get("s", "k") == b"still here"
    finally:
        good.close()
    assert server.items("scope") == {}                   # nothing an intruder sent was stored


def test_malformed_requests_from_an_authenticated_client_get_errors_not_crashes(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        wire.connect_handshake(sock, KEY)
        for bad in ({"not": "a list"}, [], [1, 2], ["put", "too", "few"], ["frobnicate", "x"]):
            wire.send_msg(sock, bad)
            reply = wire.recv_msg(sock)
            assert reply[0] == "error", (bad, reply)
        wire.send_msg(sock, ["put", "s", "k", b"ok"])
        assert wire.recv_msg(sock) == ["ok"]
    finally:
        sock.close()
    assert server.get("s", "k") == b"ok"


def test_unreachable_server_gives_a_connection_error_that_says_where():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                         # bound, never listening: connections are refused
        start = time.monotonic()
        with pytest.raises(ConnectionError) as info:
            KVStoreClient("127.0.0.1", port, KEY, timeout=0.5)
        assert time.monotonic() - start < 5
    assert f"127.0.0.1:{port}" in str(info.value)
