"""Cross-memory copies (horovod.backends.cma) and the shm plane's single-copy broadcast, in one process.

The ranks are threads of this process (as in test_tcp_algorithms.py), so the cross-memory calls target this
process's own pid: the kernel path, the probe and the agreement between ranks are real; the refusals a container
or Yama would give are simulated by replacing the system calls.
"""
import ctypes
import errno
import os
import threading

import numpy as np
import pytest

from horovod.backends import cma, shm
from horovod.backends.comm import PeerLostError
from tests.unit import test_tcp_algorithms as algorithms
from tests.unit.test_tcp_algorithms import run_ranks

shm_group = algorithms.shm_group      # the fixture ``shm_group(n, chunk)``: n ShmBackends joined in this process


@pytest.fixture
def copies(monkeypatch):
    """Counts the cross-memory reads and writes the code under test makes."""
    counts = {"read": 0, "write": 0}
    lock = threading.Lock()
    for name in counts:
        real = getattr(cma, name)

        def counted(*args, _real=real, _name=name):
            with lock:
                counts[_name] += 1
            return _real(*args)

        monkeypatch.setattr(cma, name, counted)
    return counts


# ------------------------------------------------------------------------------------------ cma
def test_read_and_write_copy_between_addresses():
    src = np.arange(3 * cma.STEP_BYTES // 8 + 5, dtype=np.int64)     # more than one system call's worth
    dst = np.zeros_like(src)
    cma.read(os.getpid(), cma.address(src), dst)
    np.testing.assert_array_equal(dst, src)
    back = np.zeros_like(src)
    cma.write(os.getpid(), cma.address(back), src[: src.size // 2])
    np.testing.assert_array_equal(back[: src.size // 2], src[: src.size // 2])
    assert not back[src.size // 2:].any()


@pytest.mark.parametrize("make", [
    lambda: np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    lambda: np.arange(24, dtype=np.float64)[6:],                       # a view that starts inside its base
    lambda: _read_only(np.arange(8, dtype=np.int64)),
    lambda: np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2],     # not contiguous
    lambda: np.zeros(0, np.float32),
], ids=["writable", "offset-view", "read-only", "strided", "empty"])
def test_address_is_where_the_first_element_lies(make):
    array = make()
    assert cma.address(array) == array.__array_interface__["data"][0]


def _read_only(array):
    array.flags.writeable = False
    return array


def test_threads_copying_at_once_do_not_mix_their_copies():
    """Each thread fills its own iovecs: a fast round's caller and the engine thread copy at the same time, and
    the system call runs without the GIL, so shared ones would send one thread's bytes to the other's array."""
    sources = [np.full(4096, value, np.uint8) for value in (1, 2, 3, 4)]
    wrong = []

    def copy(index):
        dst = np.zeros(4096, np.uint8)
        remote = cma.address(sources[index])
        for _ in range(2000):
            cma.read(os.getpid(), remote, dst)
            if not (dst == index + 1).all():
                wrong.append(index)
                return

    threads = [threading.Thread(target=copy, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


def test_probe_accepts_a_readable_peer():
    token = np.frombuffer(b"0123456789abcdef", np.uint8).copy()
    assert cma.probe(os.getpid(), cma.address(token), token.tobytes()) is None
    assert token.tobytes() == b"0123456789abcdef"                    # written back unchanged


def test_probe_names_a_missing_process():
    token = np.zeros(16, np.uint8)
    gone = _pid_of_an_exited_process()
    why = cma.probe(gone, cma.address(token), token.tobytes())
    assert why is not None and os.strerror(errno.ESRCH) in why


def test_probe_notices_other_bytes_than_the_peer_published():
    token = np.zeros(16, np.uint8)
    why = cma.probe(os.getpid(), cma.address(token), b"\1" * 16)
    assert why is not None and "PID namespaces" in why


@pytest.mark.parametrize("code", [errno.EPERM, errno.ENOSYS])
def test_probe_reports_a_refusal(monkeypatch, code):
    _refuse(monkeypatch, code)
    token = np.zeros(16, np.uint8)
    why = cma.probe(os.getpid(), cma.address(token), token.tobytes())
    assert why is not None and os.strerror(code) in why
    with pytest.raises(cma.CrossMemoryError):
        cma.read(os.getpid(), cma.address(token), np.zeros(16, np.uint8))


def _refuse(monkeypatch, code):
    """Make both system calls fail as a kernel that forbids them would."""
    def refused(*args):
        ctypes.set_errno(code)
        return -1

    monkeypatch.setattr(cma, "_CALLS", (refused, refused))


def _pid_of_an_exited_process():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


# ------------------------------------------------------------------------------------ broadcast
def _broadcast_all(backends, n, dtype, root, contiguous=True):
    """Broadcast ``n`` elements from ``root``; returns what every rank holds afterwards."""
    want = (np.arange(n) % 251 + 1).astype(dtype)

    def body(r):
        if r == root:
            full = np.repeat(want, 1 if contiguous else 2)
        else:
            full = np.zeros(n if contiguous else 2 * n, dtype)      # 0 never occurs in ``want``
        buf = full if contiguous else full[::2]
        backends[r].broadcast(buf, root)
        if not contiguous:
            assert (full[1::2] == (0 if r != root else want)).all(), "wrote between the strided elements"
        return buf.copy()

    return want, run_ranks(len(backends), body)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_large_broadcast_copies_once_from_every_root(shm_group, copies, size):
    backends = shm_group(size)
    assert all(b.direct for b in backends)
    n = shm.DIRECT_BROADCAST_BYTES // 4 + 12_345                    # above the threshold, not whole pages
    for root in range(size):
        want, got = _broadcast_all(backends, n, np.float32, root)
        for r, out in enumerate(got):
            np.testing.assert_array_equal(out, want, err_msg=f"root {root}, rank {r}")
    assert copies["read"] == size * (size - 1)                      # each peer read its part, every time
    assert copies["write"] == size * (size - 1)                     # the root wrote its part into each peer


@pytest.mark.parametrize("n", [1, 1023, 4096, 3 * 4096 + 1, 300_001])
@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.int64, np.complex128])
def test_direct_broadcast_any_length_and_dtype(shm_group, monkeypatch, copies, n, dtype):
    monkeypatch.setattr(shm, "DIRECT_BROADCAST_BYTES", 1)            # every size takes the single-copy path
    backends = shm_group(3)
    want, got = _broadcast_all(backends, n, dtype, root=1)
    for out in got:
        np.testing.assert_array_equal(out, want)
    assert copies["read"] == 2


@pytest.mark.parametrize("root", [0, 1])
def test_direct_broadcast_of_a_strided_buffer(shm_group, monkeypatch, copies, root):
    monkeypatch.setattr(shm, "DIRECT_BROADCAST_BYTES", 1)
    backends = shm_group(2)
    want, got = _broadcast_all(backends, 100_003, np.int32, root, contiguous=False)
    for out in got:
        np.testing.assert_array_equal(out, want)
    assert copies["read"] == 1


def test_small_broadcasts_keep_the_slots(shm_group, copies):
    backends = shm_group(2)
    want, got = _broadcast_all(backends, 1000, np.float32, root=0)
    for out in got:
        np.testing.assert_array_equal(out, want)
    assert copies == {"read": 0, "write": 0}


# ------------------------------------------------------------------------------------------ fallback
def test_one_refusing_rank_sends_every_rank_to_the_slots(shm_group, monkeypatch, copies):
    real, calls, lock = cma.probe, [], threading.Lock()

    def refuse_once(*args):
        with lock:
            calls.append(args)
            first = len(calls) == 1
        return "cross-memory copy refused: Operation not permitted" if first else real(*args)

    monkeypatch.setattr(cma, "probe", refuse_once)
    backends = shm_group(3)
    assert not any(b.direct for b in backends)
    _check_large_broadcast(backends)
    assert copies == {"read": 0, "write": 0}


def test_refused_system_calls_send_every_rank_to_the_slots(shm_group, monkeypatch, caplog):
    _refuse(monkeypatch, errno.EPERM)
    with caplog.at_level("DEBUG", logger="horovod.backends.shm"):
        backends = shm_group(2)
    assert not any(b.direct for b in backends)
    assert "copy through the shared slots" in caplog.text and os.strerror(errno.EPERM) in caplog.text
    _check_large_broadcast(backends)


def test_the_knob_turns_cross_memory_copies_off(shm_group, monkeypatch, copies, caplog):
    monkeypatch.setenv("HOROVOD_SHM_CROSS_MEMORY", "0")
    with caplog.at_level("DEBUG", logger="horovod.backends.shm"):
        backends = shm_group(2)
    assert not any(b.direct for b in backends)
    assert "HOROVOD_SHM_CROSS_MEMORY=0" in caplog.text
    _check_large_broadcast(backends)
    assert copies == {"read": 0, "write": 0}


def test_the_chosen_path_is_logged(shm_group, caplog):
    with caplog.at_level("DEBUG", logger="horovod.backends.shm"):
        backends = shm_group(2)
    assert all(b.direct for b in backends)
    assert "copy once" in caplog.text


def _check_large_broadcast(backends):
    for root in range(len(backends)):
        want, got = _broadcast_all(backends, shm.DIRECT_BROADCAST_BYTES // 4 + 777, np.float32, root)
        for out in got:
            np.testing.assert_array_equal(out, want)


def test_other_collectives_still_work_after_direct_broadcasts(shm_group):
    """The header records sit after the slots: a direct broadcast must not disturb slot-path collectives."""
    backends = shm_group(2, chunk=256 * 1024)
    n = shm.DIRECT_BROADCAST_BYTES // 4 + 1

    def body(r):
        buf = np.full(n, float(r))
        backends[r].broadcast(buf, 1)
        small = np.full(10, r + 1.0)
        backends[r].broadcast(small, 0)
        gathered = np.empty(n + 3)
        backends[r].allgatherv(np.full(n if r == 0 else 3, r + 5.0), gathered, [n, 3])
        total = np.full(100_000, r + 1.0)
        backends[r].allreduce_buffer(total, shm.ReduceOp.SUM)
        return buf, small, gathered, total

    for buf, small, gathered, total in run_ranks(2, body):
        assert (buf == 1.0).all() and (small == 1.0).all() and (total == 3.0).all()
        assert (gathered[:n] == 5.0).all() and (gathered[n:] == 6.0).all()


def test_a_failed_cross_memory_copy_names_the_lost_peer(shm_group, monkeypatch):
    backends = shm_group(2)

    def gone(pid, remote, array):
        raise cma.CrossMemoryError(errno.ESRCH, f"cross-memory copy with process {pid} failed: No such process")

    monkeypatch.setattr(cma, "read", gone)
    monkeypatch.setattr(cma, "write", gone)
    n = shm.DIRECT_BROADCAST_BYTES // 4 + 1

    def body(r):
        with pytest.raises(PeerLostError) as info:
            backends[r].broadcast(np.zeros(n, np.float32), 0)
        return info.value.global_rank

    assert run_ranks(2, body) == [1, 0]           # the root lost its peer, the peer lost the root


# ------------------------------------------------------------------------------- direct allreduce
def _allreduce_all(backends, inputs, op, layout, prescale=1.0, postscale=1.0):
    """Every rank allreduces its copy of ``inputs[rank]``: into a new array ("apart"), into itself ("in-place")
    or into every other element of a larger one ("strided-output"); returns what each rank got."""
    def body(r):
        x = inputs[r].copy()
        if layout == "in-place":
            out = x
        elif layout == "strided-output":
            full = np.zeros(2 * x.size, x.dtype)
            out = full[::2]
        else:
            out = np.zeros_like(x)
        backends[r].allreduce([x], [out], op, prescale, postscale)
        if layout == "strided-output":
            assert not full[1::2].any(), "wrote between the strided elements"
        return out.copy()

    return run_ranks(len(backends), body)


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("layout", ["apart", "in-place", "strided-output"])
@pytest.mark.parametrize("prescale", [1.0, 0.5])
def test_direct_allreduce_gives_the_chunked_paths_bits(shm_group, monkeypatch, copies, size, layout, prescale):
    """float64 sums whose rounding shows any change of order; pieces of an odd number of bytes (none a whole
    number of elements, the last short); in place, the third and fourth ranks' own pieces must survive their
    outputs; scale factors as the chunked path applies them."""
    monkeypatch.setattr(shm, "DIRECT_PIECE_BYTES", 20_003)
    n = 100_003
    inputs = [np.random.default_rng(r).standard_normal(n) for r in range(size)]
    monkeypatch.setattr(shm, "DIRECT_ALLREDUCE_BYTES", 1)
    direct = _allreduce_all(shm_group(size), inputs, algorithms.ReduceOp.SUM, layout, prescale, 3.0)
    reads, writes = copies["read"], copies["write"]
    monkeypatch.setattr(shm, "DIRECT_ALLREDUCE_BYTES", 1 << 62)
    chunked = _allreduce_all(shm_group(size), inputs, algorithms.ReduceOp.SUM, layout, prescale, 3.0)
    assert copies == {"read": reads, "write": writes}         # the chunked path made no cross-memory copy
    per_piece = 20_003 // 8
    pieces = sum(-(-(hi - lo) // per_piece) for lo, hi in (shm._segment(n, size, r, 8) for r in range(size)))
    assert reads == writes == (size - 1) * pieces               # each piece read from and written to every peer
    np.testing.assert_allclose(direct[0], 3.0 * prescale * sum(inputs))
    for got, want in zip(direct, chunked):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["MIN", "MAX", "PRODUCT"])
def test_direct_allreduce_of_integers_with_every_op(shm_group, monkeypatch, op):
    monkeypatch.setattr(shm, "DIRECT_ALLREDUCE_BYTES", 1)
    size = 3
    inputs = [algorithms.data(r, 70_001, np.int32) for r in range(size)]
    for got in _allreduce_all(shm_group(size), inputs, algorithms.ReduceOp[op], "apart"):
        np.testing.assert_array_equal(got, algorithms.REF[algorithms.ReduceOp[op]](inputs))


def test_fused_tensors_and_small_ones_keep_the_slots(shm_group, copies):
    backends = shm_group(2)
    n = shm.DIRECT_ALLREDUCE_BYTES // 4 + 1

    def body(r):
        a, b = np.full(n, r + 1.0, np.float32), np.full(n, 1.0, np.float32)
        backends[r].allreduce([a, b], [a, b], algorithms.ReduceOp.SUM)       # a fused batch of two
        small = np.full(1000, 2.0, np.float32)
        backends[r].allreduce([small], [small], algorithms.ReduceOp.SUM)
        return a[0], b[-1], small[0]

    assert run_ranks(2, body) == [(3.0, 2.0, 4.0)] * 2
    assert copies == {"read": 0, "write": 0}


# ------------------------------------------------------------------------------- direct allgather
@pytest.mark.parametrize("size", [2, 3, 4])
def test_allgather_in_the_window_reads_each_peer_once(shm_group, copies, size):
    """Uneven blocks (one rank's empty), a dtype that is not 4 bytes wide: every rank gets every block, by one
    cross-memory read per non-empty peer block."""
    backends = shm_group(size)
    lo = shm.DIRECT_ALLGATHER_BYTES[0]
    counts = [lo // 8 // (size - 1) + 1001 * r for r in range(size)]
    counts[1] = 0
    inputs = [np.arange(counts[r], dtype=np.float64) * (r + 1) - r for r in range(size)]
    want = np.concatenate(inputs)
    assert shm.DIRECT_ALLGATHER_BYTES[0] <= want.nbytes <= shm.DIRECT_ALLGATHER_BYTES[1]

    def body(r):
        out = np.full(sum(counts), np.nan)
        backends[r].allgatherv(inputs[r], out, counts)
        return out

    for out in run_ranks(size, body):
        np.testing.assert_array_equal(out, want)
    # each rank reads every non-empty peer block once; rank 1's empty block is read by nobody
    assert copies["read"] == (size - 1) ** 2 and copies["write"] == 0


def _check_two_rank_allgather(backends, n):
    def body(r):
        out = np.empty(2 * n)
        backends[r].allgatherv(np.full(n, r + 1.0), out, [n, n])
        return out

    for out in run_ranks(2, body):
        assert (out[:n] == 1.0).all() and (out[n:] == 2.0).all()


def test_allgather_outside_the_window_stays_on_the_slots(shm_group, copies):
    backends = shm_group(2, chunk=256 * 1024)
    _check_two_rank_allgather(backends, shm.DIRECT_ALLGATHER_BYTES[0] // 8 // 2 - 100)
    _check_two_rank_allgather(backends, shm.DIRECT_ALLGATHER_BYTES[1] // 8 // 2 + 100)
    assert copies == {"read": 0, "write": 0}


def test_allgather_in_the_window_keeps_the_slots_without_cross_memory(shm_group, monkeypatch, copies):
    monkeypatch.setenv("HOROVOD_SHM_CROSS_MEMORY", "0")
    _check_two_rank_allgather(shm_group(2), shm.DIRECT_ALLGATHER_BYTES[0] // 8)
    assert copies == {"read": 0, "write": 0}
