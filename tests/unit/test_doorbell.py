"""The futex doorbell (backends/doorbell.py): a ring wakes a sleeper, a stale count returns at once, a timeout
ends the sleep, and a word it cannot use is refused."""
import mmap
import threading
import time

import numpy as np
import pytest

from horovod.backends import doorbell
from tests.support.timing import SLACK_S

pytestmark = pytest.mark.skipif(not doorbell.available(), reason="doorbells need the Linux futex system call")


def _shared_word():
    area = mmap.mmap(-1, 4096)              # anonymous MAP_SHARED, as the shm segment is
    return np.frombuffer(area, np.uint32)[:1]


def test_a_ring_wakes_a_sleeper_in_another_thread():
    bell = doorbell.Doorbell(_shared_word())
    seen = bell.value()
    woke = []
    sleeper = threading.Thread(target=lambda: (bell.sleep(seen, 60.0), woke.append(time.monotonic())), daemon=True)
    sleeper.start()
    time.sleep(0.1)
    rang = time.monotonic()
    bell.ring()
    sleeper.join(SLACK_S + 1.0)
    assert woke and woke[0] - rang < SLACK_S, "the ring did not wake the sleeper"   # its timeout is 60 s
    assert bell.value() == (seen + 1) & 0xFFFFFFFF


def test_a_stale_count_returns_at_once_and_a_timeout_ends_the_sleep():
    bell = doorbell.Doorbell(_shared_word())
    seen = bell.value()
    bell.ring()
    start = time.monotonic()
    bell.sleep(seen, 60.0)                  # the word changed since it was read: no sleep
    assert time.monotonic() - start < SLACK_S
    start = time.monotonic()
    bell.sleep(bell.value(), 0.05)
    assert 0.04 <= time.monotonic() - start < 0.05 + SLACK_S


def test_the_count_wraps_and_high_counts_still_sleep():
    word = _shared_word()
    word[0] = 0xFFFFFFFF
    bell = doorbell.Doorbell(word)
    start = time.monotonic()
    bell.sleep(bell.value(), 0.05)          # compared as the kernel's signed int
    assert time.monotonic() - start >= 0.04
    bell.ring()
    assert bell.value() == 0


def test_a_word_that_is_not_one_aligned_uint32_is_refused():
    with pytest.raises(ValueError, match="one aligned uint32 word"):
        doorbell.Doorbell(np.zeros(2, np.uint32))
    with pytest.raises(ValueError, match="one aligned uint32 word"):
        doorbell.Doorbell(np.zeros(1, np.uint64))
