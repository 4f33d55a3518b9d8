"""The timeline writer: upstream's event format, valid JSON at every moment, and the activity hook."""
import json
import time

from horovod.common import timeline as tl


def read(path):
    return json.loads(path.read_text())


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
