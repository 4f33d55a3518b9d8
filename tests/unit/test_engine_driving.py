"""A user thread that waits on a collective runs the engine's loop itself while the engine thread sleeps
(core/engine/driving.py): the collective executes on the waiting thread, a failure there aborts the engine as one
on the engine thread would, a timed wait hands the loop back, and many threads driving in turn stay correct."""
import socket
import threading
import time

import numpy as np
import pytest

from horovod.backends.local import LocalBackend
from horovod.common import wire
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.controller.messages import BATCH, TensorResponse, make_request
from horovod.core.engine import Engine, Entry
from horovod.core.engine.handles import Handle
from horovod.core.engine.settings import EngineSettings

SMALL = dict(cache_capacity=16, fusion_threshold=1 << 20, cycle_time_ms=1.0)


class RecordingBackend(LocalBackend):
    """Records the thread that runs each allreduce."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.threads = []
        self.elements = 0
        self.fail = fail

    def allreduce(self, inputs, outputs, op, prescale=1.0, postscale=1.0):
        self.threads.append(threading.current_thread().name)
        self.elements += sum(a.size for a in inputs)
        if self.fail:
            raise RuntimeError("the data plane broke")
        return super().allreduce(inputs, outputs, op, prescale, postscale)


def submit(engine, name, tensor):
    handle = Handle(name)
    request = make_request(name, RequestType.ALLREDUCE, DataType.FLOAT32, tensor.shape, ReduceOp.SUM)
    engine.enqueue([Entry(request, tensor, np.empty_like(tensor), handle)])
    return handle


def respond(sock, name, shape=(3,)):
    response = TensorResponse(name, int(RequestType.ALLREDUCE), int(DataType.FLOAT32), list(shape),
                              int(ReduceOp.SUM), 1.0, 1.0, -1, None)
    wire.send_msg(sock, ["L", [[BATCH, [response.to_wire()]]]])


def until_driving(engine, within=10.0):
    """Wait until a user thread drives the loop (its wait notice goes out just before it starts to)."""
    deadline = time.monotonic() + within
    while not engine.driving and time.monotonic() < deadline:
        time.sleep(0.001)
    assert engine.driving


def read_until(sock, kind, within=10.0):
    """The first message of ``kind`` that arrives on ``sock`` within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while True:
            msg = wire.recv_msg(sock)
            if msg[0] == kind:
                return msg
    finally:
        sock.settimeout(None)


@pytest.fixture
def worker():
    """Rank 1 of 2 with a recording data plane; the test plays the coordinator on the other socket end."""
    backend = RecordingBackend()
    ours, coordinator_end = socket.socketpair()
    engine = Engine(1, 2, backend, {0: ours}, EngineSettings(**SMALL)).start()
    yield engine, coordinator_end, backend
    coordinator_end.close()
    engine.shutdown()


def test_the_waiting_thread_runs_its_collective(worker):
    engine, coord, backend = worker
    time.sleep(0.05)                                  # the engine thread is asleep in the kernel
    handle = submit(engine, "x", np.ones(3, np.float32))
    result = {}

    def wait():
        result["out"] = handle.wait(timeout=10)

    waiter = threading.Thread(target=wait, name="user-waiter")
    waiter.start()
    assert read_until(coord, "W")[1] == ["x"]
    until_driving(engine)
    respond(coord, "x")
    waiter.join(10)
    assert not waiter.is_alive()
    np.testing.assert_array_equal(result["out"], np.ones(3))
    assert backend.threads == ["user-waiter"]
    assert engine.drives >= 1


def test_a_timed_wait_hands_the_loop_back_to_the_engine_thread(worker):
    engine, coord, backend = worker
    time.sleep(0.05)
    handle = submit(engine, "late", np.full(3, 2, np.float32))
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0.2)
    respond(coord, "late")                            # nobody waits now: the engine thread must run it
    deadline = time.monotonic() + 10
    while not handle.poll() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert handle.poll()
    np.testing.assert_array_equal(handle.wait(timeout=1), np.full(3, 2))
    assert backend.threads == ["horovod-engine"]


def test_a_failure_on_the_driving_thread_aborts_the_engine_and_tells_the_coordinator():
    backend = RecordingBackend(fail=True)
    ours, coord = socket.socketpair()
    engine = Engine(1, 2, backend, {0: ours}, EngineSettings(**SMALL)).start()
    try:
        time.sleep(0.05)
        handle = submit(engine, "bad", np.ones(3, np.float32))
        errors = []

        def wait():
            try:
                handle.wait(timeout=10)
            except HorovodInternalError as exc:
                errors.append(str(exc))

        waiter = threading.Thread(target=wait, name="user-waiter")
        waiter.start()
        read_until(coord, "W")
        until_driving(engine)
        respond(coord, "bad")
        waiter.join(10)
        assert backend.threads == ["user-waiter"]
        assert len(errors) == 1 and "the data plane broke" in errors[0] and "'bad'" in errors[0], errors
        abort = read_until(coord, "A")
        assert "the data plane broke" in abort[1]
        deadline = time.monotonic() + 10
        while engine.alive and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not engine.alive
        with pytest.raises(HorovodInternalError, match="the data plane broke"):
            submit(engine, "after", np.ones(3, np.float32)).wait(timeout=5)
    finally:
        coord.close()
        engine.shutdown()


def test_many_threads_driving_in_turn_stay_correct():
    """A one-rank job: eight threads each run 200 collectives and wait on them, taking the loop from one
    another and from the engine thread; every result is right and nothing hangs."""
    backend = RecordingBackend()
    engine = Engine(0, 1, backend, {}, EngineSettings(**SMALL)).start()
    failures = []

    def work(t):
        try:
            for i in range(200):
                value = np.full(5, t * 1000 + i, np.float32)
                out = submit(engine, f"t{t}.{i % 7}", value).wait(timeout=30)
                if not np.array_equal(out, value):
                    failures.append((t, i, out))
        except Exception as exc:                      # reported below
            failures.append((t, repr(exc)))

    threads = [threading.Thread(target=work, args=(t,), name=f"user-{t}") for t in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        assert failures == []
        assert backend.elements == 1600 * 5           # fused or not, every tensor went through the data plane once
        assert any(name.startswith("user-") for name in backend.threads)
    finally:
        engine.shutdown()


def test_after_a_drive_a_shutdown_hears_the_coordinators_answer(worker):
    """A shutdown right after a driven collective: the engine thread, which stopped listening to the control
    socket while the user thread drove, must listen again to get the coordinator's answer (not time out)."""
    engine, coord, backend = worker
    time.sleep(0.05)
    handle = submit(engine, "x", np.ones(3, np.float32))
    waiter = threading.Thread(target=handle.wait, kwargs={"timeout": 10}, name="user-waiter")
    waiter.start()
    read_until(coord, "W")
    until_driving(engine)
    respond(coord, "x")
    waiter.join(10)
    assert backend.threads == ["user-waiter"]

    def coordinator():
        read_until(coord, "X")
        wire.send_msg(coord, ["S", "the coordinator answered"])

    answering = threading.Thread(target=coordinator)
    answering.start()
    engine.shutdown()
    answering.join(10)
    assert "the coordinator answered" in str(engine.error)
