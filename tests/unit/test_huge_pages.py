"""Huge pages under the buffers that cross-memory copies move (horovod.backends.huge_pages): a large buffer is
collapsed the second time a direct copy publishes it (and asked again at the 4th, 8th...), and the kernel's
refusals make it stop asking.

The kernel's answer is real in the first test (this VM's kernel has MADV_COLLAPSE; /proc/self/smaps shows the
huge pages); the others count the calls through a stand-in for madvise.
"""
import ctypes
import errno
import mmap
import os
import re

import numpy as np
import pytest

from horovod.backends import cma, huge_pages, shm
from tests.unit import test_tcp_algorithms as algorithms
from tests.unit.test_tcp_algorithms import run_ranks

shm_group = algorithms.shm_group
MB = 1 << 20
PAGE = mmap.PAGESIZE
PROT_NONE = 0


@pytest.fixture
def fresh(monkeypatch):
    """A clean slate: nothing seen, no refusals, enabled unless a test says otherwise."""
    monkeypatch.setattr(huge_pages, "_seen", huge_pages.collections.OrderedDict())
    monkeypatch.setattr(huge_pages, "_refusals", 0)
    monkeypatch.setattr(huge_pages, "_enabled", None)
    monkeypatch.delenv("HOROVOD_HUGE_PAGES", raising=False)


@pytest.fixture
def asked(fresh, monkeypatch):
    """Replaces madvise: records each (start, length, advice) and answers 0, or ``answer["errno"]``."""
    calls, answer = [], {"errno": 0}

    def madvise(start, length, advice):
        calls.append((start, length, advice))
        if answer["errno"]:
            huge_pages.ctypes.set_errno(answer["errno"])
            return -1
        return 0

    monkeypatch.setattr(huge_pages, "_MADVISE", madvise)
    return calls, answer


def small_pages(nbytes):
    """An array in 4 KB pages (numpy asks for huge pages on its own from 4 MB: not here)."""
    from numpy._core import multiarray

    before = multiarray._get_madvise_hugepage()
    multiarray._set_madvise_hugepage(False)
    try:
        return np.ones(nbytes // 4, np.float32)
    finally:
        multiarray._set_madvise_hugepage(before)


def huge_kb(address, nbytes):
    """AnonHugePages (KB) of the mappings that overlap [address, address + nbytes), from /proc/self/smaps."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                inside = int(m.group(1), 16) < address + nbytes and address < int(m.group(2), 16)
            elif inside and line.startswith("AnonHugePages:"):
                total += int(line.split()[1])
    return total


def test_whole_pages_are_the_aligned_2mb_pages_inside_the_buffer():
    H = huge_pages.HUGE_PAGE
    assert huge_pages.whole_pages(H, 2 * H) == (H, 3 * H)
    assert huge_pages.whole_pages(H + 1, 3 * H) == (2 * H, 4 * H)
    assert huge_pages.whole_pages(H + 1, H) is None


@pytest.fixture
def mapping():
    """``make(nbytes)``: float32 ones in a mapping of their own between two inaccessible pages, so that the kernel
    cannot merge it with a neighbour and /proc/self/smaps shows its pages alone; unmapped afterwards."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    made = []

    def make(nbytes):
        total = nbytes + 2 * PAGE
        base = libc.mmap(None, total, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        assert base not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        made.append((base, total))
        assert libc.mprotect(base, PAGE, PROT_NONE) == 0
        assert libc.mprotect(base + PAGE + nbytes, PAGE, PROT_NONE) == 0
        array = np.ctypeslib.as_array((ctypes.c_float * (nbytes // 4)).from_address(base + PAGE))
        array[:] = 1.0
        return array

    yield make
    for base, total in made:
        libc.munmap(base, total)


def test_a_buffer_seen_twice_is_collapsed_by_the_kernel(fresh, mapping):
    array = mapping(16 * MB)
    at = cma.address(array)
    if huge_kb(at, array.nbytes):
        pytest.skip("this kernel gives huge pages unasked (transparent_hugepage=always): no change to see")
    huge_pages.prefer(array, at)
    assert huge_kb(at, array.nbytes) == 0                   # seen once: maybe a buffer for one call only
    huge_pages.prefer(array, at)
    if huge_pages._refusals:
        pytest.skip("this kernel does not collapse pages on request (MADV_COLLAPSE needs Linux 6.1)")
    start, end = huge_pages.whole_pages(at, array.nbytes)
    assert huge_kb(at, array.nbytes) == (end - start) // 1024, "the whole 2 MB pages were not collapsed"
    np.testing.assert_array_equal(array, 1.0)                 # the contents are the same


def test_a_range_is_asked_at_its_2nd_4th_8th_sighting_and_small_ones_never(asked):
    calls, _ = asked
    big, small = small_pages(8 * MB), np.ones(MB // 4, np.float32)
    asked_at = []
    for sighting in range(1, 41):
        before = len(calls)
        huge_pages.prefer(big, cma.address(big))
        huge_pages.prefer(small, cma.address(small))
        asked_at += [sighting] * (len(calls) - before)
    assert asked_at == [2, 4, 8, 16, 32]
    start, end = huge_pages.whole_pages(cma.address(big), big.nbytes)
    assert set(calls) == {(start, end - start, huge_pages.MADV_COLLAPSE)}


def test_permission_errors_stop_it_at_once_and_other_refusals_after_a_run(asked):
    calls, answer = asked
    arrays = [small_pages(6 * MB) for _ in range(huge_pages.MAX_REFUSALS + 2)]

    def twice(a):           # the second sighting asks
        huge_pages.prefer(a, cma.address(a))
        huge_pages.prefer(a, cma.address(a))

    answer["errno"] = errno.EAGAIN
    for a in arrays[:huge_pages.MAX_REFUSALS - 1]:
        twice(a)
    assert len(calls) == huge_pages.MAX_REFUSALS - 1 and huge_pages.enabled()
    answer["errno"] = 0                                         # one success: the run starts again
    twice(arrays[huge_pages.MAX_REFUSALS - 1])
    assert huge_pages._refusals == 0
    answer["errno"] = errno.EAGAIN
    for a in arrays[:huge_pages.MAX_REFUSALS]:                  # their 3rd and 4th sightings: asked again at the 4th
        twice(a)
    assert len(calls) == 2 * huge_pages.MAX_REFUSALS and not huge_pages.enabled()
    twice(arrays[-1])
    assert len(calls) == 2 * huge_pages.MAX_REFUSALS            # stopped asking


def test_a_permission_error_stops_it_at_once(asked):
    calls, answer = asked
    answer["errno"] = errno.EPERM
    arrays = [small_pages(6 * MB) for _ in range(2)]
    for a in arrays:
        huge_pages.prefer(a, cma.address(a))
        huge_pages.prefer(a, cma.address(a))
    assert len(calls) == 1 and not huge_pages.enabled()


def test_the_knob_turns_it_off(asked, monkeypatch):
    calls, _ = asked
    monkeypatch.setenv("HOROVOD_HUGE_PAGES", "0")
    big = small_pages(8 * MB)
    for _ in range(3):
        huge_pages.prefer(big, cma.address(big))
    assert calls == []


@pytest.mark.parametrize("in_place", [True, False])
def test_a_direct_allreduce_asks_for_its_input_and_output_from_their_second_op(shm_group, asked, in_place):
    """Two ranks (threads), an allreduce of one 8 MB tensor (direct): the first op asks nothing; the second asks
    once per distinct buffer of each rank (an output that is the input counts once); the third nothing, the
    fourth again."""
    calls, _ = asked
    backends = shm_group(2)
    assert all(b.direct for b in backends)
    tensors = [small_pages(shm.DIRECT_ALLREDUCE_BYTES * 2) for _ in range(2)]
    outputs = tensors if in_place else [small_pages(shm.DIRECT_ALLREDUCE_BYTES * 2) for _ in range(2)]

    def op(r):
        backends[r].allreduce([tensors[r]], [outputs[r]], algorithms.ReduceOp.MAX)

    per_op = []
    for _ in range(4):
        before = len(calls)
        run_ranks(2, op)
        per_op.append(len(calls) - before)
    buffers = 2 if in_place else 4
    assert per_op == [0, buffers, 0, buffers], per_op
    buffers = {huge_pages.whole_pages(cma.address(a), a.nbytes)[0] for a in [*tensors, *outputs]}
    assert {start for start, _, _ in calls} == buffers
