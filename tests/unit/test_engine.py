"""The engine of a one-rank job, driven directly: execution, failures inside the data plane, shutdown; and a
worker rank's wait notices, against a fake coordinator on the other end of its control socket."""
import select
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from horovod.backends.local import LocalBackend
from horovod.common import wire
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.controller import Coordinator
from horovod.core.controller.messages import Tag, TensorResponse, make_request
from horovod.core.controller.response_cache import ResponseCache
from horovod.core.engine import Engine, Entry, fast_rounds, loops, waits
from horovod.core.engine.handles import Handle, several_threads
from horovod.core.engine.settings import EngineSettings
from horovod.core.engine.state import EngineState
from tests.support.timing import SLACK_S


class FailingBackend(LocalBackend):
    """Fails the first allreduce (as a data plane that lost a peer or hit a bug would)."""

    def allreduce_buffer(self, buf, op):
        raise RuntimeError("the data plane broke")


class BlockingBackend(LocalBackend):
    def __init__(self):
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def allreduce_buffer(self, buf, op):
        self.entered.set()
        self.release.wait(10)


SMALL = dict(cache_capacity=16, fusion_threshold=1 << 20, cycle_time_ms=1.0)


def make_engine(backend=None, **settings):
    return Engine(0, 1, backend or LocalBackend(), {}, EngineSettings(**SMALL, **settings)).start()


def submit(engine, name, tensor, rtype=RequestType.ALLREDUCE, **kw):
    handle = Handle(name)
    request = make_request(name, rtype, DataType.FLOAT32, tensor.shape, ReduceOp.SUM, **kw)
    engine.enqueue([Entry(request, tensor, np.empty_like(tensor), handle)])
    return handle


def test_allreduce_and_the_cache_path():
    engine = make_engine()
    try:
        for step in range(3):
            out = submit(engine, "x", np.full(4, step, np.float32)).wait(timeout=10)
            np.testing.assert_array_equal(out, np.full(4, step))
        assert engine.cache.lookup("x") is not None
    finally:
        engine.shutdown()


@pytest.mark.skipif(not fast_rounds.supported(), reason="fast rounds need a futex and x86-64")
def test_a_blocking_collective_of_one_rank_completes_on_the_callers_thread():
    """A set of one rank has fast rounds of its own (a private area): a blocking call is complete when
    ``submit_blocking`` returns, with the scale factors applied and nothing sent to the engine thread; a
    rank of a larger set whose plane has no room for its peers (the wait-notice tests' worker) has none."""
    engine = make_engine()
    try:
        assert engine.fast is not None
        x = np.arange(6, dtype=np.float32).reshape(3, 2)
        cases = [(RequestType.ALLREDUCE, dict(prescale=0.5, postscale=3.0), x * 1.5),
                 (RequestType.ALLGATHER, {}, x), (RequestType.BROADCAST, dict(root=0), x),
                 (RequestType.REDUCESCATTER, dict(postscale=2.0), x * 2)]
        for i, (rtype, kw, expected) in enumerate(cases):
            handle = Handle(f"one.{i}")
            request = make_request(f"one.{i}", rtype, DataType.FLOAT32, x.shape, ReduceOp.SUM, **kw)
            output = np.empty_like(x) if rtype in (RequestType.ALLREDUCE, RequestType.BROADCAST) else None
            engine.submit_blocking(Entry(request, x, output, handle))
            assert handle.poll(), RequestType(rtype).name
            np.testing.assert_array_equal(handle.wait(timeout=0), expected)
        assert engine.fast.matched == len(cases)
        np.testing.assert_array_equal(x, np.arange(6, dtype=np.float32).reshape(3, 2))     # inputs untouched
    finally:
        engine.shutdown()
    ours, theirs = socket.socketpair()
    try:
        assert Engine(1, 2, LocalBackend(), {0: ours}, EngineSettings(**SMALL)).fast is None
    finally:
        ours.close()
        theirs.close()


def test_duplicate_name_in_one_submission_is_refused():
    engine = make_engine()
    try:
        t = np.ones(2, np.float32)
        entries = [Entry(make_request("d", RequestType.ALLREDUCE, DataType.FLOAT32, [2]), t, t.copy(), Handle("d"))
                   for _ in range(2)]
        with pytest.raises(ValueError, match="'d'"):
            engine.enqueue(entries)
        assert submit(engine, "d", t).wait(timeout=10) is not None     # nothing of the refused batch stayed
    finally:
        engine.shutdown()


def test_a_data_plane_failure_fails_the_handle_instead_of_hanging():
    engine = make_engine(FailingBackend())
    try:
        handle = submit(engine, "boom", np.ones(3, np.float32))
        with pytest.raises(HorovodInternalError, match="data plane broke"):
            handle.wait(timeout=5)
        # Later submissions fail at once too.
        with pytest.raises(HorovodInternalError):
            submit(engine, "after", np.ones(3, np.float32)).wait(timeout=10)
        assert not engine.alive
    finally:
        engine.shutdown()


class RecordingStates(LocalBackend):
    """Notes the engine's state while a collective runs, and fails it."""

    def __init__(self):
        super().__init__()
        self.engine = None

    def allreduce_buffer(self, buf, op):
        raise RuntimeError(f"failed while {self.engine.state.name}")


def test_the_state_moves_forward_running_aborting_stopped_with_the_reason():
    backend = RecordingStates()
    engine = make_engine(backend)
    backend.engine = engine
    told = []
    engine.control.send_abort = lambda reason: told.append((engine.state, reason))    # the peers are told ...
    try:
        assert engine.state is EngineState.RUNNING and not engine.stopping
        with pytest.raises(HorovodInternalError, match="failed while RUNNING"):
            submit(engine, "boom", np.ones(3, np.float32)).wait(timeout=5)
        deadline = time.monotonic() + 5
        while engine.state is not EngineState.STOPPED and time.monotonic() < deadline:
            time.sleep(0.001)
        assert engine.state is EngineState.STOPPED and "failed while RUNNING" in str(engine.error)
        assert len(told) == 1 and told[0][0] is EngineState.ABORTING      # ... while the engine is ABORTING
        assert "failed while RUNNING" in told[0][1]
        engine.shutdown()                               # a shutdown after an abort does not move it back
        assert engine.state is EngineState.STOPPED and "failed while RUNNING" in str(engine.error)
    finally:
        engine.shutdown()


def test_a_shutdown_goes_through_stopping_to_stopped():
    engine = make_engine()
    submit(engine, "ok", np.ones(3, np.float32)).wait(timeout=5)
    engine.shutdown()
    assert engine.state is EngineState.STOPPED and not engine.alive
    assert "shut down" in str(engine.error).lower()


def test_shutdown_fails_what_is_still_in_flight():
    backend = BlockingBackend()
    engine = make_engine(backend)
    first = submit(engine, "busy", np.ones(3, np.float32))
    assert backend.entered.wait(10)
    queued = submit(engine, "queued", np.ones(3, np.float32))
    stopper = threading.Thread(target=engine.shutdown)
    stopper.start()
    deadline = time.monotonic() + 10
    while not engine.stopping and time.monotonic() < deadline:      # shutdown requested while "busy" runs
        time.sleep(0.001)
    backend.release.set()
    stopper.join(30)
    assert not stopper.is_alive()
    np.testing.assert_array_equal(first.wait(timeout=10), np.ones(3))     # the running op completes
    with pytest.raises(HorovodInternalError, match="shut down"):
        queued.wait(timeout=10)
    with pytest.raises(HorovodInternalError, match="shut down"):
        submit(engine, "late", np.ones(3, np.float32)).wait(timeout=10)


# ------------------------------------------------------------------ wait notices of a worker rank
def _worker(monkeypatch, **settings):
    """Rank 1 of 2 and the other end of its control socket (which plays the coordinator); stops it after."""
    monkeypatch.setenv("HOROVOD_DEADLOCK_CHECK_TIME_SECONDS", "0.4")
    ours, coordinator_end = socket.socketpair()
    engine = Engine(1, 2, LocalBackend(), {0: ours}, EngineSettings(**SMALL, **settings)).start()
    assert engine.waits.lapse_s == pytest.approx(0.1)
    yield engine, coordinator_end
    coordinator_end.close()                            # the worker sees its coordinator go and stops
    engine.shutdown()


@pytest.fixture
def worker(monkeypatch):
    """Rank 1 of 2, its control socket's other end playing the coordinator; the wait lapse is 0.1 s."""
    yield from _worker(monkeypatch)


@pytest.fixture
def polling_worker(monkeypatch):
    """The same, its engine thread polling for 5 s after activity (HOROVOD_SPIN_MICROSECONDS)."""
    yield from _worker(monkeypatch, spin_us=5e6)


def received(sock, within):
    """The messages that arrive on ``sock`` within ``within`` seconds."""
    out, deadline = [], time.monotonic() + within
    while True:
        if not select.select([sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
            return out
        out.append(wire.recv_msg(sock))


def respond(sock, name, shape=(3,)):
    """What the coordinator sends when ``name`` (a float32 allreduce) is to run."""
    response = TensorResponse(name, int(RequestType.ALLREDUCE), int(DataType.FLOAT32), list(shape),
                              int(ReduceOp.SUM), 1.0, 1.0, -1, None)
    wire.send_msg(sock, [Tag.RESPONSES, [[Tag.BATCH, [response.to_wire()]]]])


def test_a_blocking_wait_is_told_once_after_the_request_and_its_completion_needs_no_message(worker):
    engine, coord = worker
    handle = submit(engine, "x", np.ones(3, np.float32))
    waiter = threading.Thread(target=handle.wait, kwargs={"timeout": 10})
    waiter.start()
    messages = received(coord, 0.3)
    assert [m[0] for m in messages] == ["R", "W"], messages          # on one channel: the wait after the request
    assert messages[1][1] == ["x"]
    respond(coord, "x")
    waiter.join(10)
    assert handle.poll() and not waiter.is_alive()
    assert received(coord, 0.3) == []                                 # completion: nothing to take back


def test_a_wait_from_a_program_submitting_from_several_threads_says_so(worker):
    engine, coord = worker
    handle = submit(engine, "t", np.ones(3, np.float32))

    def wait_in_a_tf1_graph_thread():
        with several_threads():
            handle.wait(timeout=10)

    waiter = threading.Thread(target=wait_in_a_tf1_graph_thread)
    waiter.start()
    messages = received(coord, 0.3)
    assert [m[0] for m in messages] == ["R", "W"] and messages[1] == ["W", ["t"], True], messages
    respond(coord, "t")
    waiter.join(10)
    assert handle.poll() and not waiter.is_alive()


def test_timed_waits_that_keep_polling_send_one_notice_and_a_stop_is_taken_back_after_the_lapse(worker):
    engine, coord = worker
    handle = submit(engine, "p", np.ones(3, np.float32))
    assert [m[0] for m in received(coord, 0.2)] == ["R"]              # submitted, nobody waits yet
    start = time.monotonic()
    while time.monotonic() - start < 0.5:                            # 50 timed waits of 10 ms each
        with pytest.raises(TimeoutError):
            handle.wait(timeout=0.01)
    assert received(coord, 0.0) == [["W", ["p"]]]                     # the churn was absorbed
    stopped = time.monotonic()
    assert select.select([coord], [], [], 0.1 + SLACK_S)[0]
    assert wire.recv_msg(coord) == ["U", ["p"]]                       # nobody waits again: taken back ...
    assert 0.05 <= time.monotonic() - stopped < 0.1 + SLACK_S         # ... after the lapse (0.1 s)
    assert received(coord, 0.2) == []
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0.01)                                     # waiting again is told again
    assert received(coord, 0.3)[:1] == [["W", ["p"]]]


def test_a_wait_on_a_tensor_already_running_sends_nothing(worker):
    engine, coord = worker
    backend = BlockingBackend()
    engine.backend = backend
    handle = submit(engine, "r", np.ones(3, np.float32))
    assert [m[0] for m in received(coord, 0.2)] == ["R"]
    respond(coord, "r")
    assert backend.entered.wait(10)                                   # emitted and on the data plane
    waiter = threading.Thread(target=handle.wait, kwargs={"timeout": 10})
    waiter.start()
    assert received(coord, 0.3) == []
    backend.release.set()
    waiter.join(10)
    assert handle.poll()


def test_a_zero_timeout_only_polls(worker):
    engine, coord = worker
    handle = submit(engine, "z", np.ones(3, np.float32))
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0)
    assert [m[0] for m in received(coord, 0.3)] == ["R"]


def test_hooks_list_each_observer_only_under_the_hooks_it_implements():
    """An observer that only inspects (rank 0's stall inspector) must not put every batch on the observed path."""
    from horovod.core.engine.observer import EngineObserver, Hooks
    from horovod.core.observers.stall_inspector import StallObserver
    from horovod.core.observers.timeline import TimelineObserver

    stall = StallObserver(None, None)
    timeline = TimelineObserver.__new__(TimelineObserver)
    plain = EngineObserver()
    hooks = Hooks.of([stall, timeline, plain])
    assert hooks.all == (stall, timeline, plain)
    assert hooks.inspect == (stall,)
    assert hooks.batch == hooks.cycle == hooks.error == (timeline,)
    assert hooks.propose == ()


def submit_blocking(engine, name, tensor):
    handle = Handle(name)
    request = make_request(name, RequestType.ALLREDUCE, DataType.FLOAT32, tensor.shape, ReduceOp.SUM)
    engine.submit_blocking(Entry(request, tensor, np.empty_like(tensor), handle))
    return handle


def test_a_blocking_call_sends_its_wait_notice_inside_its_request_and_its_wait_sends_nothing(worker):
    engine, coord = worker
    handle = submit_blocking(engine, "b", np.ones(3, np.float32))
    messages = received(coord, 0.2)
    assert len(messages) == 1 and messages[0][0] == "R" and messages[0][2] == waits.WAITED, messages
    assert [r[0] for r in messages[0][1]] == ["b"]
    waiter = threading.Thread(target=handle.wait, kwargs={"timeout": 10})
    waiter.start()
    assert received(coord, 0.3) == []                                 # told already: no W
    respond(coord, "b")
    waiter.join(10)
    assert handle.poll() and not waiter.is_alive()
    with several_threads():
        submit_blocking(engine, "c", np.ones(3, np.float32))
    assert received(coord, 0.2)[0][2] == waits.WAITED | waits.SEVERAL_THREADS


def test_a_blocking_call_whose_timed_wait_runs_out_takes_its_notice_back(worker):
    engine, coord = worker
    handle = submit_blocking(engine, "t", np.ones(3, np.float32))
    assert [m[0] for m in received(coord, 0.2)] == ["R"]
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0.01)
    assert select.select([coord], [], [], 0.1 + SLACK_S)[0]
    assert wire.recv_msg(coord) == ["U", ["t"]]                       # the notice the request carried


def test_the_coordinator_marks_a_worker_waiting_on_a_blocking_calls_requests():
    coordinator = Coordinator(2, ResponseCache(16), 1 << 20)
    activity = []
    engine = SimpleNamespace(coordinator=coordinator, active=lambda: activity.append(1))
    request = make_request("w", RequestType.ALLREDUCE, DataType.FLOAT32, [3], ReduceOp.SUM)
    loops._from_worker(engine, 1, [Tag.REQUESTS, [list(request)], waits.WAITED | waits.SEVERAL_THREADS])
    assert coordinator.waits() == [("w", "ALLREDUCE", [1], [1])] and activity == [1]
    assert 1 in coordinator.several_threads
    loops._from_worker(engine, 1, [Tag.REQUESTS, [list(make_request("v", RequestType.ALLREDUCE, DataType.FLOAT32,
                                                                       [3], ReduceOp.SUM))]])
    assert [w[0] for w in coordinator.waits()] == ["w"]                # an async call's requests: no wait


# ------------------------------------------------------------------ when the engine thread polls
def _until(condition, within=SLACK_S):
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _record_sends_and_wakes(engine, monkeypatch):
    """The order in which a worker's caller sends to the coordinator and asks to wake its engine thread."""
    events = []
    send, wake_if_sleeping = engine.control.send_to_coordinator, engine.wake_if_sleeping
    monkeypatch.setattr(engine.control, "send_to_coordinator", lambda msg: (events.append("send"), send(msg)))
    monkeypatch.setattr(engine, "wake_if_sleeping", lambda: (events.append("wake"), wake_if_sleeping()))
    return events


def test_a_blocking_call_starts_the_poll_and_the_answer_that_wakes_its_thread_ends_it(polling_worker,
                                                                                        monkeypatch):
    """The engine thread polls from a blocking call's request until its answer (woken from the kernel for it
    once the request is sent), and not after the answer wakes the waiting thread, which then needs the GIL; an
    answer that wakes nobody leaves it polling for the next."""
    engine, coord = polling_worker
    assert _until(lambda: engine.sleeping)                # no activity yet: asleep in the kernel
    events = _record_sends_and_wakes(engine, monkeypatch)
    before = time.perf_counter()
    handle = submit_blocking(engine, "b", np.ones(3, np.float32))
    assert engine.last_activity >= before
    assert events == ["send", "wake"]                     # woken after the send, not before it
    assert _until(lambda: not engine.sleeping)            # polling while the request travels
    waiter = threading.Thread(target=handle.wait, kwargs={"timeout": 10})
    waiter.start()
    assert _until(lambda: handle.waiters == 1)
    assert not engine.sleeping
    respond(coord, "b")
    waiter.join(10)
    assert handle.poll() and not waiter.is_alive()
    assert _until(lambda: engine.sleeping)                # the waiter woke: no poll (5 s were due otherwise)
    assert engine.last_activity == 0.0
    h = submit(engine, "x", np.ones(3, np.float32))       # an async call nobody waits on yet
    assert received(coord, 1.0)[0][0] == "R"
    respond(coord, "x")
    assert _until(h.poll)
    assert _until(lambda: not engine.sleeping)            # it ran: polling for what comes next
    time.sleep(0.2)
    assert not engine.sleeping


def test_without_polling_a_blocking_call_does_not_wake_the_engine(worker, monkeypatch):
    engine, coord = worker
    events = _record_sends_and_wakes(engine, monkeypatch)
    submit_blocking(engine, "b", np.ones(3, np.float32))
    assert received(coord, 0.2)[0][0] == "R"
    assert events == ["send"]


def test_rank_0_stops_polling_when_its_answer_wakes_a_waiter_and_polls_after_one_nobody_waits_on():
    backend = BlockingBackend()                           # holds the first allreduce until released
    engine = make_engine(backend, spin_us=5e6, fast_rounds=False)    # the blocking call through the engine thread
    try:
        assert _until(lambda: engine.sleeping)
        handle = submit_blocking(engine, "b", np.ones(3, np.float32))
        waiter = threading.Thread(target=handle.wait, kwargs={"timeout": 10})
        waiter.start()
        assert backend.entered.wait(10) and _until(lambda: handle.waiters == 1)
        backend.release.set()
        waiter.join(10)
        assert handle.poll() and not waiter.is_alive()
        assert _until(lambda: engine.sleeping)            # no 5 s poll after the answer that woke the waiter
        h = submit(engine, "x", np.ones(3, np.float32))
        assert _until(h.poll)
        assert _until(lambda: not engine.sleeping)        # nobody waited on it: polling for what comes next
        time.sleep(0.2)
        assert not engine.sleeping
    finally:
        engine.shutdown()
