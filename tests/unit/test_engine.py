"""The engine of a one-rank job, driven directly: execution, failures inside the data plane, shutdown."""
import threading
import time

import numpy as np
import pytest

from horovod.backends.local import LocalBackend
from horovod.common.engine import Engine, Entry
from horovod.common.exceptions import HorovodInternalError
from horovod.common.handles import Handle
from horovod.common.messages import make_request
from horovod.common.types import DataType, ReduceOp, RequestType


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


def make_engine(backend=None):
    return Engine(0, 1, backend or LocalBackend(), {}, cache_capacity=16, fusion_threshold=1 << 20,
                  cycle_time_ms=1.0).start()


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


def test_shutdown_fails_what_is_still_in_flight():
    backend = BlockingBackend()
    engine = make_engine(backend)
    first = submit(engine, "busy", np.ones(3, np.float32))
    assert backend.entered.wait(10)
    queued = submit(engine, "queued", np.ones(3, np.float32))
    stopper = threading.Thread(target=engine.shutdown)
    stopper.start()
    deadline = time.monotonic() + 10
    while not engine._stop and time.monotonic() < deadline:      # shutdown requested while "busy" runs
        time.sleep(0.001)
    backend.release.set()
    stopper.join(30)
    assert not stopper.is_alive()
    np.testing.assert_array_equal(first.wait(timeout=10), np.ones(3))     # the running op completes
    with pytest.raises(HorovodInternalError, match="shut down"):
        queued.wait(timeout=10)
    with pytest.raises(HorovodInternalError, match="shut down"):
        submit(engine, "late", np.ones(3, np.float32)).wait(timeout=10)
