"""The data-plane watchdog checks a wait when it is due, not a whole interval later, and reports a helper thread's
wait as the engine thread's it works for (a ring sender's stalled send names the rank and the collective)."""
import contextlib
import threading
import time

from horovod.backends import peer_waits
from horovod.core.observers import watchdog


def _watchdog(warning_s: float, shutdown_s: float) -> watchdog.DataPlaneWatchdog:
    dog = watchdog.DataPlaneWatchdog()
    dog.settings.warning_s, dog.settings.shutdown_s = warning_s, shutdown_s
    dog.settings.interval = max(0.05, min(1.0, warning_s / 4))
    return dog


@contextlib.contextmanager
def _quiet_wait(quiet_s: float):
    """This thread waits on the board for rank 1, which has sent nothing for ``quiet_s``; yields (wait, now)."""
    wait = peer_waits.begin(1, "there", None, 1 << 20)
    now = time.monotonic()
    wait.since = wait.last = now - quiet_s
    try:
        yield wait, now
    finally:
        peer_waits.end(wait)


def test_the_next_check_comes_when_a_wait_reaches_its_warning_then_its_shutdown_time():
    dog = _watchdog(4.0, 6.0)
    with _quiet_wait(3.9) as (wait, now):
        assert dog.check(now) == []
        assert abs(dog.next_due - (now + 0.1)) < 1e-6
        assert abs(dog._sleep_s(now) - 0.1) < 1e-6         # not the interval (1 s): the warning is on time
        later = now + 0.1
        assert len(dog.check(later)) == 1                   # the warning
        assert abs(dog.next_due - (later + 2.0)) < 1e-6     # next: the shutdown time
        assert dog._sleep_s(later) == 1.0                   # far off: the interval bounds the sleep
        wait.last = later                                   # bytes came: quiet again
        dog.check(later)
        assert abs(dog.next_due - (later + 6.0)) < 1e-6     # reported already: only the shutdown is due
    dog.check(time.monotonic())
    assert dog.next_due == float("inf") and dog._sleep_s(time.monotonic()) == 1.0


def test_a_wait_due_now_is_checked_soon_but_the_thread_never_spins():
    dog = _watchdog(2.0, 0.0)
    with _quiet_wait(1.9999999) as (_, now):
        dog.check(now)
        assert dog._sleep_s(now) == watchdog.MIN_SLEEP_S


def test_a_helper_thread_s_waits_belong_to_the_thread_it_works_for():
    owner = threading.get_ident()
    made = {}

    def helper():
        made["own"] = peer_waits.PeerWait(1, "there", None, 8)
        with peer_waits.working_for(owner):
            made["for"] = peer_waits.begin(1, "there", None, 8)
            peer_waits.end(made["for"])
        made["after"] = peer_waits.PeerWait(1, "there", None, 8)
        made["ident"] = threading.get_ident()

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join(5)
    assert made["for"].owner == owner
    assert made["own"].owner == made["after"].owner == made["ident"] != owner
    assert made["ident"] not in peer_waits._owners


def test_a_started_helper_s_waits_belong_to_the_thread_that_started_it():
    made = {}

    def target():
        made["wait"] = peer_waits.begin(1, "there", None, 8)
        peer_waits.end(made["wait"])
        made["ident"] = threading.get_ident()

    thread = peer_waits.start_helper(target, "test-helper")
    thread.join(5)
    assert thread.daemon and thread.name == "test-helper"
    assert made["wait"].owner == threading.get_ident() != made["ident"]
