"""The authenticated wire: the HMAC handshake in both directions, foreign protocols, msgpack framing."""
import os
import random
import select
import socket
import struct
import threading

import pytest

from horovod.common import wire

KEY = bytes.fromhex(wire.make_secret())
OTHER = bytes.fromhex(wire.make_secret())


def run_pair(server_fn, client_fn):
    """Run server_fn(sock) in a thread and client_fn(sock) here on a connected socket pair."""
    a, b = socket.socketpair()
    result = {}

    def serve():
        try:
            result["server"] = server_fn(a)
        except BaseException as exc:  # inspected by the test
            result["server_error"] = exc
        finally:
            a.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        try:
            result["client"] = client_fn(b)
        except BaseException as exc:  # inspected by the test
            result["client_error"] = exc
    finally:
        b.close()
        thread.join(10)
    assert not thread.is_alive()
    return result


def test_secret_helpers():
    secret = wire.make_secret()
    assert len(secret) == 64 and secret != wire.make_secret()
    assert wire.secret_from_env({wire.SECRET_ENV: secret}) == bytes.fromhex(secret)
    assert wire.secret_from_env({}) is None
    assert wire.SECRET_ENV == "_HOROVOD_SECRET_KEY"
    fp = wire.secret_fingerprint(bytes.fromhex(secret))
    assert len(fp) == 16 and secret[:16] not in fp and fp == wire.secret_fingerprint(bytes.fromhex(secret))


def test_handshake_with_the_right_key_carries_the_hello():
    result = run_pair(lambda s: wire.accept_handshake(s, KEY), lambda s: wire.connect_handshake(s, KEY, b"hi"))
    assert "server_error" not in result and "client_error" not in result, result
    assert result["server"] == b"hi"


def test_after_the_handshake_messages_flow_both_ways():
    def server(s):
        wire.accept_handshake(s, KEY)
        msg = wire.recv_msg(s)
        wire.send_msg(s, ["echo", msg])

    def client(s):
        wire.connect_handshake(s, KEY)
        wire.send_msg(s, {"a": [1, 2.5, None, b"\x00\xff"]})
        return wire.recv_msg(s)

    result = run_pair(server, client)
    assert result["client"] == ["echo", {"a": [1, 2.5, None, b"\x00\xff"]}]


def test_client_with_a_wrong_key_is_rejected_on_both_sides():
    result = run_pair(lambda s: wire.accept_handshake(s, KEY), lambda s: wire.connect_handshake(s, OTHER, b"x"))
    assert isinstance(result.get("server_error"), wire.AuthenticationError), result
    assert isinstance(result.get("client_error"), wire.AuthenticationError), result


def test_server_without_the_key_is_rejected_by_the_client():
    def impostor(s):
        # Speaks the protocol but cannot prove it knows the key: answers the challenge with random bytes.
        s.sendall(wire.MAGIC + os.urandom(wire.NONCE_BYTES))
        head = wire.recv_exact(s, struct.calcsize("<8s16sH"))
        _, _, hello_len = struct.unpack("<8s16sH", head)
        wire.recv_exact(s, hello_len + wire.MAC_BYTES)
        s.sendall(os.urandom(wire.MAC_BYTES))

    result = run_pair(impostor, lambda s: wire.connect_handshake(s, KEY, b"secret-bearing hello"))
    assert isinstance(result.get("client_error"), wire.AuthenticationError), result
    assert "server" in str(result["client_error"])


def test_server_with_a_different_key_is_rejected_by_the_client():
    result = run_pair(lambda s: wire.accept_handshake(s, OTHER), lambda s: wire.connect_handshake(s, KEY))
    assert isinstance(result.get("client_error"), wire.AuthenticationError)
    assert isinstance(result.get("server_error"), wire.AuthenticationError)


# Random bytes from a seeded generator: every pytest-xdist worker must collect the same parameters.
_NOISE = random.Random(20261129)


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 64,
    _NOISE.randbytes(4096),
    b"\x00" * 4096,
    wire.MAGIC + _NOISE.randbytes(16) + struct.pack("<H", 65535),     # right magic, oversized hello
], ids=["http", "noise", "zeros", "oversized-hello"])
def test_server_rejects_garbage_without_parsing_it(garbage):
    def attacker(s):
        try:
            s.sendall(garbage)
        except OSError:
            pass
        s.shutdown(socket.SHUT_WR)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass

    result = run_pair(lambda s: wire.accept_handshake(s, KEY, timeout=5), attacker)
    error = result.get("server_error")
    assert isinstance(error, (wire.AuthenticationError, wire.PeerClosedError)), result


def test_server_survives_a_client_that_hangs_up():
    result = run_pair(lambda s: wire.accept_handshake(s, KEY, timeout=5), lambda s: None)
    assert isinstance(result.get("server_error"), (wire.PeerClosedError, ConnectionError)), result


def test_server_times_out_a_silent_client():
    a, b = socket.socketpair()
    try:
        with pytest.raises(socket.timeout):
            wire.accept_handshake(a, KEY, timeout=0.2)
    finally:
        a.close()
        b.close()


def test_client_rejects_a_foreign_server():
    def http_server(s):
        s.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    result = run_pair(http_server, lambda s: wire.connect_handshake(s, KEY))
    assert isinstance(result.get("client_error"), (wire.AuthenticationError, wire.PeerClosedError)), result


def test_hello_size_limit():
    a, b = socket.socketpair()
    try:
        with pytest.raises(ValueError):
            wire.connect_handshake(a, KEY, b"x" * (wire.MAX_HELLO_BYTES + 1))
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("obj", [
    None, 0, -1, 2**63 - 1, 1.5, "text", "ünïcode", b"\x00\x01", [], [1, [2, [3]]], {"k": "v"}, {1: "int key"},
    ["R", [["allreduce.x", 0, 7, [2, 3], 1, 1.0, 1.0, -1, "", 0, None]]],
    b"\x07" * (1 << 20),
])
def test_msgpack_round_trip(obj):
    assert wire.unpack(wire.pack(obj)) == obj
    a, b = socket.socketpair()
    try:
        sender = threading.Thread(target=wire.send_msg, args=(a, obj))
        sender.start()
        assert wire.recv_msg(b) == obj
        sender.join()
    finally:
        a.close()
        b.close()


def test_many_frames_in_a_row_keep_their_boundaries():
    a, b = socket.socketpair()
    try:
        msgs = [["m", i, b"x" * i] for i in range(200)]
        for m in msgs:
            wire.send_msg(a, m)
        assert [wire.recv_msg(b) for _ in msgs] == msgs
    finally:
        a.close()
        b.close()


def test_peer_closing_mid_frame_raises_peer_closed():
    a, b = socket.socketpair()
    try:
        a.sendall(struct.pack("<I", 100) + b"only part")
        a.close()
        with pytest.raises(wire.PeerClosedError):
            wire.recv_msg(b)
    finally:
        b.close()


def test_recv_into_exact_fills_a_view():
    a, b = socket.socketpair()
    try:
        buf = bytearray(10)
        a.sendall(b"01234")
        a.sendall(b"56789")
        wire.recv_into_exact(b, memoryview(buf))
        assert bytes(buf) == b"0123456789"
    finally:
        a.close()
        b.close()


def test_tune_socket_is_harmless_on_unix_and_tcp_sockets():
    a, b = socket.socketpair()
    wire.tune_socket(a)
    a.close()
    b.close()
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        wire.tune_socket(client)
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        client.close()
        conn.close()


# ------------------------------------------------------------------ buffered reading (the control channel's)
def _reader_pair():
    a, b = socket.socketpair()
    return wire.FrameReader(a), a, b


def _frame(obj) -> bytes:
    payload = wire.pack(obj)
    return len(payload).to_bytes(4, "little") + payload


def test_a_frame_reader_returns_every_whole_message_one_receive_brings():
    reader, a, b = _reader_pair()
    try:
        b.sendall(_frame(["R", [1]]) + _frame(["W", ["x"]]) + _frame([1, 2, 3]))
        assert reader.read() == [["R", [1]], ["W", ["x"]], [1, 2, 3]]
    finally:
        a.close()
        b.close()


def test_a_frame_reader_keeps_a_message_that_arrives_in_pieces_until_its_end():
    reader, a, b = _reader_pair()
    try:
        data = _frame(["first", "x" * 300]) + _frame(["second"])
        got = []
        for i in range(len(data)):                  # one byte per receive: the header split too
            b.sendall(data[i:i + 1])
            got.extend(reader.read())
            if i < len(data) - len(_frame(["second"])) - 1:
                assert got == [], i
        assert got == [["first", "x" * 300], ["second"]]
    finally:
        a.close()
        b.close()


def test_a_frame_reader_takes_a_frame_larger_than_its_receives():
    reader, a, b = _reader_pair()
    big = ["blob", bytes(range(256)) * 2048]            # 512 KiB: more than one receive's 64 KiB
    sender = threading.Thread(target=b.sendall, args=(_frame(big) + _frame(["after"]),))
    sender.start()
    try:
        got = []
        while len(got) < 2:
            select.select([a], [], [], 10)
            got.extend(reader.read())
        assert got == [big, ["after"]]
    finally:
        sender.join(10)
        a.close()
        b.close()


def test_a_frame_reader_refuses_an_oversized_frame_and_reports_a_close():
    reader, a, b = _reader_pair()
    try:
        b.sendall((wire.MAX_FRAME_BYTES + 1).to_bytes(4, "little"))
        with pytest.raises(ConnectionError, match="exceeds the limit"):
            reader.read()
    finally:
        a.close()
        b.close()
    reader, a, b = _reader_pair()
    try:
        b.sendall(_frame(["last"])[:5])
        b.close()
        assert reader.read() == []                      # the frame's beginning: kept
        with pytest.raises(wire.PeerClosedError):
            reader.read()                               # then the close
    finally:
        a.close()
