"""Handles: completion from another thread, errors, grouped parts, timeouts."""
import threading
import time

import pytest

from horovod.common.exceptions import HorovodInternalError
from horovod.core.engine.handles import Handle


def complete_later(fn, delay=0.05):
    thread = threading.Thread(target=lambda: (time.sleep(delay), fn()), daemon=True)
    thread.start()
    return thread


def test_poll_and_wait_for_a_result():
    h = Handle("allreduce.x")
    assert h.name == "allreduce.x" and not h.poll()
    h.set_result(0, "value")
    assert h.poll()
    assert h.wait() == "value"
    assert h.wait() == "value"                 # waiting again is fine
    assert h.poll()


def test_wait_blocks_until_another_thread_completes():
    h = Handle("t")
    thread = complete_later(lambda: h.set_result(0, 42), delay=0.2)
    start = time.monotonic()
    assert h.wait() == 42
    assert time.monotonic() - start >= 0.15
    thread.join()


def test_wait_timeout_names_the_operation():
    h = Handle("allgather.slow")
    with pytest.raises(TimeoutError, match="allgather.slow"):
        h.wait(timeout=0.05)
    h.set_result(0, 1)
    assert h.wait(timeout=0.05) == 1


def test_grouped_parts_complete_only_when_all_are_done():
    h = Handle("grouped", parts=3)
    h.set_result(2, "c")
    h.set_result(0, "a")
    assert not h.poll()
    with pytest.raises(TimeoutError):
        h.wait(timeout=0.01)
    h.set_result(1, "b")
    assert h.poll() and h.wait() == ["a", "b", "c"]


def test_internal_error_is_raised_as_horovod_internal_error_with_the_cause():
    h = Handle("t")
    original = HorovodInternalError("Mismatched shapes for tensor 't'")
    complete_later(lambda: h.set_error(original))
    with pytest.raises(HorovodInternalError, match="Mismatched shapes") as info:
        h.wait()
    assert isinstance(info.value, RuntimeError)
    assert info.value.__cause__ is original
    with pytest.raises(HorovodInternalError):     # every wait raises
        h.wait()


def test_other_errors_are_raised_as_they_are():
    h = Handle("t")
    h.set_error(ValueError("bad"))
    assert h.poll()
    with pytest.raises(ValueError, match="bad"):
        h.wait()


def test_first_error_wins_and_later_results_are_ignored():
    h = Handle("g", parts=2)
    h.set_result(0, "a")
    h.set_error(HorovodInternalError("first"))
    h.set_error(HorovodInternalError("second"))
    h.set_result(1, "b")
    with pytest.raises(HorovodInternalError, match="first"):
        h.wait()


def test_a_failed_part_completes_the_handle_only_when_every_part_finished():
    """A group whose one member failed (a mismatch) and whose other member is still running: the caller must not
    wake before the other member is done, or resubmitting the group under the same names finds it in flight."""
    h = Handle("g", parts=2)
    h.set_error(HorovodInternalError("mismatch in part 1"))
    assert not h.poll()
    with pytest.raises(TimeoutError):
        h.wait(timeout=0.01)
    h.set_result(0, "a")
    assert h.poll()
    with pytest.raises(HorovodInternalError, match="mismatch in part 1"):
        h.wait()


def test_an_error_after_completion_is_ignored():
    h = Handle("t")
    h.set_result(0, 5)
    h.set_error(HorovodInternalError("late"))
    assert h.wait() == 5


def test_finish_shapes_the_result():
    h = Handle("alltoall.x", finish=lambda results: results[0][0])
    h.set_result(0, ("output", "splits"))
    assert h.wait() == "output"
    g = Handle("g", parts=2, finish=lambda results: tuple(results))
    g.set_result(1, 2)
    g.set_result(0, 1)
    assert g.wait() == (1, 2)


def test_many_waiters_are_all_released():
    h = Handle("t")
    got = []
    threads = [threading.Thread(target=lambda: got.append(h.wait())) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    h.set_result(0, "done")
    for t in threads:
        t.join(5)
    assert got == ["done"] * 8
