"""The timeline writer: upstream's event format, valid JSON at every moment, and the activity hook."""
import json
import time

import numpy as np

from horovod.backends.local import LocalBackend
from horovod.common import timeline as tl
from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.controller.messages import make_request
from horovod.core.engine import Engine, Entry
from horovod.core.engine.handles import Handle
from horovod.core.engine.settings import EngineSettings
from horovod.core.observers.timeline import start_timeline, stop_timeline
from tests.support.timing import SLACK_S

# The prompt path writes a finished op within milliseconds. The tests below move the periodic flush (0.2 s) to a
# minute away, so only the prompt path can put an op in the file before SLACK_S has passed: a pass means the
# prompt path worked, and a failure cannot come from a descheduled writer thread on a busy machine.
FAR_AWAY_SECONDS = 60.0


def completed_ops(path, name):
    """How many of ``name``'s ops the file shows as finished (their closing event carries dtype and shape)."""
    events = read(path)
    pids = [e["pid"] for e in events if e.get("name") == "process_name" and e["args"]["name"] == name]
    return sum(1 for e in events if pids and e["pid"] == pids[0] and e["ph"] == "E" and "dtype" in e.get("args", {}))


def seconds_until(predicate, limit):
    """Poll ``predicate`` until it holds; the seconds that took, or None if it did not within ``limit``."""
    start = time.perf_counter()
    while True:
        if predicate():
            return time.perf_counter() - start
        if time.perf_counter() - start > limit:
            return None
        time.sleep(0.002)


def read(path):
    """The timeline's events as a reader sees them while the writer is still running.

    The writer keeps the file valid JSON, but a reader that takes several ``read`` calls (as
    ``read_text`` does when the file grows under it) can join the file before a write to the tail of
    the file after it. Such a torn read shows as a parse error on content that has since changed; it
    is read again. Content that does not parse and has not changed is a real defect and fails.
    """
    data = path.read_bytes()
    for _ in range(20):
        try:
            return json.loads(data)
        except json.JSONDecodeError:
            again = path.read_bytes()
            if again == data:
                raise
            data = again
    return json.loads(data)


def test_header_and_a_tensor_lifecycle(tmp_path):
    path = tmp_path / "t.json"
    t = tl.Timeline(str(path), mark_cycles=True)
    assert read(path)[0]["name"] == "process_name"          # valid before any event
    t.negotiate_start("grad", "ALLREDUCE")
    t.rank_ready("grad", 0)
    t.rank_ready("grad", 1)
    t.negotiate_end("grad")
    t.begin(["grad"], "ALLREDUCE")
    t.cycle()
    tl.executing(t, ["grad"])
    with tl.activity("MEMCPY_IN_FUSION_BUFFER"):
        pass
    tl.executing(None, [])
    t.end_op("grad", "float32", (2, 3))
    t.close()
    events = read(path)
    meta = [e for e in events if e["ph"] == "M" and e["pid"] == 1]
    assert meta[0] == {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad"}}
    body = [e for e in events if e["ph"] != "M"]
    assert [(e["ph"], e.get("name")) for e in body] == [
        ("B", "NEGOTIATE_ALLREDUCE"), ("X", "0"), ("X", "1"), ("E", None), ("B", "ALLREDUCE"),
        ("i", "CYCLE_START"), ("B", "MEMCPY_IN_FUSION_BUFFER"), ("E", None), ("E", None)]
    assert body[-1]["args"] == {"dtype": "float32", "shape": "[2, 3]"}
    assert body[1]["dur"] == 0 and body[5]["s"] == "g"
    assert all(b["ts"] >= a["ts"] for a, b in zip(body, body[1:]))


def test_file_is_valid_json_while_recording(tmp_path):
    path = tmp_path / "live.json"
    t = tl.Timeline(str(path))
    seen = []
    for i in range(5):
        t.negotiate_start(f"x{i}", "BROADCAST")
        time.sleep(0.25)                                    # past the writer's flush interval
        seen.append(len(read(path)))
    t.close()
    assert seen == sorted(seen) and seen[-1] > seen[0], seen


def test_errors_and_activity_without_a_recording_batch_are_harmless(tmp_path):
    path = tmp_path / "e.json"
    t = tl.Timeline(str(path))
    with tl.activity("SHM_ALLREDUCE"):                     # nothing executing: a no-op
        pass
    t.negotiate_start("bad", "ALLREDUCE")
    t.end_error("bad", "Mismatched shapes")
    t.close()
    body = [e for e in read(path) if e["ph"] != "M"]
    assert body[-1]["args"] == {"error": "Mismatched shapes"}
    assert not any(e.get("name") == "SHM_ALLREDUCE" for e in body)


def test_creates_the_directory(tmp_path):
    path = tmp_path / "deep" / "dir" / "t.json"
    tl.Timeline(str(path)).close()
    assert read(path)


def test_a_finished_op_is_in_the_file_without_waiting_for_the_periodic_flush(tmp_path, monkeypatch):
    monkeypatch.setattr(tl, "_FLUSH_SECONDS", FAR_AWAY_SECONDS)
    path = tmp_path / "prompt.json"
    settings = EngineSettings(cache_capacity=16, fusion_threshold=1 << 20, cycle_time_ms=1.0)
    engine = Engine(0, 1, LocalBackend(), {}, settings).start()
    try:
        start_timeline(engine, str(path))
        x = np.ones(4, np.float32)
        for i in range(6):
            time.sleep(0.03 * i)           # lone ops, at different phases of the writer's periodic flush
            handle = Handle("op")
            engine.enqueue([Entry(make_request("op", RequestType.ALLREDUCE, DataType.FLOAT32, x.shape,
                                               ReduceOp.SUM), x, np.empty_like(x), handle)])
            handle.wait(timeout=10)
            took = seconds_until(lambda n=i + 1: completed_ops(path, "op") == n, limit=SLACK_S)
            assert took is not None, f"op {i} was not in the file {SLACK_S} s after its handle completed"
    finally:
        stop_timeline(engine)
        engine.shutdown()


def test_flush_soon_writes_what_is_recorded_without_waiting_for_the_periodic_flush(tmp_path, monkeypatch):
    monkeypatch.setattr(tl, "_FLUSH_SECONDS", FAR_AWAY_SECONDS)
    path = tmp_path / "soon.json"
    t = tl.Timeline(str(path))
    try:
        for i in range(4):
            time.sleep(0.05)
            t.negotiate_start(f"t{i}", "ALLREDUCE")
            t.end_op(f"t{i}", "float32", (1,))
            t.flush_soon()
            took = seconds_until(lambda n=i + 1: sum(1 for e in read(path) if e["ph"] == "E") == n, limit=SLACK_S)
            assert took is not None, f"event {i} was not in the file {SLACK_S} s after flush_soon()"
    finally:
        t.close()
