"""``python -m horovod.timeline summary``: parsing live and truncated timelines, the numbers, the CLI."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

from horovod.timeline import (
    Summary,
    TimelineError,
    activity_category,
    format_duration,
    format_report,
    load_events,
    parse_timeline_text,
    summarize,
    summarize_file,
)
from horovod.timeline.__main__ import main

DATA = Path(__file__).parent / "data"
START_EPOCH_US = 1_700_000_000_000_000  # 2023-11-14 22:13:20 UTC


class TimelineBuilder:
    """Writes events the way rank 0's timeline writer does (one tensor = one pid)."""

    def __init__(self) -> None:
        self.events: List[dict] = [
            {"name": "process_name", "ph": "M", "pid": 0,
             "args": {"name": "Horovod", "start_time_since_epoch_in_micros": START_EPOCH_US}},
            {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},
        ]
        self.pids: Dict[str, int] = {}

    def pid(self, tensor: str) -> int:
        if tensor not in self.pids:
            pid = self.pids[tensor] = len(self.pids) + 1
            self.events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": tensor}})
            self.events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        return self.pids[tensor]

    def negotiate(self, tensor: str, kind: str, start: float, ticks: Sequence[Tuple[int, float]],
                  end: Optional[float] = None) -> None:
        pid = self.pid(tensor)
        self.events.append({"ph": "B", "name": f"NEGOTIATE_{kind}", "ts": start, "pid": pid})
        for rank, ts in ticks:
            self.events.append({"ph": "X", "name": str(rank), "ts": ts, "pid": pid, "dur": 0})
        if end is not None:
            self.events.append({"ph": "E", "ts": end, "pid": pid})

    def op(self, tensors: Sequence[str], kind: str, start: float, activities: Sequence[Tuple[str, float, float]],
           end: Optional[float], dtype: str = "float32", shape: str = "[64, 3, 7, 7]") -> None:
        """One collective over ``tensors`` (several: fused), each with the same activities and timestamps."""
        pids = [self.pid(tensor) for tensor in tensors]
        for pid in pids:
            self.events.append({"ph": "B", "name": kind, "ts": start, "pid": pid})
        for name, begin, finish in activities:
            for pid in pids:
                self.events.append({"ph": "B", "name": name, "ts": begin, "pid": pid})
            for pid in pids:
                self.events.append({"ph": "E", "ts": finish, "pid": pid})
        if end is not None:
            for pid in pids:
                self.events.append({"ph": "E", "ts": end, "pid": pid, "args": {"dtype": dtype, "shape": shape}})

    def cycle(self, ts: float, pid: bool = False) -> None:
        event = {"ph": "i", "name": "CYCLE_START", "ts": ts, "s": "g"}
        if pid:
            event["pid"] = 0
        self.events.append(event)

    def text(self) -> str:
        """The file as the writer leaves it: one event a line, always closed with ']'."""
        return "[\n" + ",\n".join(json.dumps(event) for event in self.events) + "\n]\n"


def training_timeline() -> TimelineBuilder:
    """Two ranks; a broadcast, then 3 steps of two gradients fused in one allreduce; rank 1 mostly last."""
    tl = TimelineBuilder()
    tl.cycle(0, pid=True)
    tl.negotiate("w", "BROADCAST", 0, [(0, 10), (1, 40)], 40)
    tl.op(["w"], "BROADCAST", 50, [("MPI_BCAST", 50, 90)], 100, shape="[10]")
    for step in range(3):
        base = 1000 * (step + 1)
        tl.cycle(base)
        tl.negotiate("grad.a", "ALLREDUCE", base, [(0, base + 5), (1, base + 105)], base + 105)
        ticks_b = [(0, base + 20), (1, base + 70)] if step < 2 else [(1, base + 15), (0, base + 20)]
        tl.negotiate("grad.b", "ALLREDUCE", base + 10, ticks_b, max(ts for _, ts in ticks_b))
        tl.op(["grad.a", "grad.b"], "ALLREDUCE", base + 110,
              [("QUEUE", base + 110, base + 130), ("MEMCPY_IN_FUSION_BUFFER", base + 130, base + 150),
               ("SHM_ALLREDUCE", base + 150, base + 350), ("MEMCPY_OUT_FUSION_BUFFER", base + 350, base + 370)],
              base + 380)
    return tl


def write(tmp_path: Path, text: str, name: str = "timeline.json") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the numbers ------------------------------------------------------------------------------------------------


def test_overall_numbers():
    summary = summarize(training_timeline().events)
    assert summary.notes == []
    assert summary.start_time_since_epoch_us == START_EPOCH_US
    assert (summary.span_start_us, summary.span_end_us, summary.span_us) == (0, 3380, 3380)
    assert summary.tensor_count == 3
    assert (summary.ops, summary.collectives, summary.negotiations) == (7, 4, 7)
    assert summary.cycles == 4
    assert summary.ranks == 2
    assert summary.open_at_end == 0
    assert summary.op_busy_us == 50 + 3 * 270  # the fused allreduce counted once per step
    assert summary.negotiate_busy_us == 40 + 3 * 105  # overlapping negotiations counted once


def test_per_op_type_with_fusion_and_split():
    summary = summarize(training_timeline().events)
    assert [stats.op for stats in summary.op_types] == ["ALLREDUCE", "BROADCAST"]
    allreduce, broadcast = summary.op_types
    assert (allreduce.ops, allreduce.collectives, allreduce.negotiations) == (6, 3, 6)
    assert allreduce.negotiate_total_us == 3 * 105 + 2 * 60 + 10
    assert allreduce.negotiate_mean_us == 74.167  # 445 / 6, rounded to ns
    assert (allreduce.op_total_us, allreduce.op_mean_us) == (1620, 270)
    assert allreduce.split_us == {"queue": 120, "memcpy": 240, "data_plane": 1200, "other": 60}
    assert allreduce.split_pct == {"queue": 7.407, "memcpy": 14.815, "data_plane": 74.074, "other": 3.704}
    assert allreduce.activities_us == {"SHM_ALLREDUCE": 1200, "MEMCPY_IN_FUSION_BUFFER": 120,
                                       "MEMCPY_OUT_FUSION_BUFFER": 120, "QUEUE": 120}
    assert (broadcast.ops, broadcast.collectives, broadcast.negotiations) == (1, 1, 1)
    assert (broadcast.negotiate_total_us, broadcast.op_total_us) == (40, 50)
    assert broadcast.split_us == {"queue": 0, "memcpy": 0, "data_plane": 40, "other": 10}
    assert summary.activities_us["MPI_BCAST"] == 40
    assert list(summary.activities_us)[0] == "SHM_ALLREDUCE"


def test_per_tensor():
    summary = summarize(training_timeline().events)
    assert [tensor.name for tensor in summary.tensors] == ["grad.a", "grad.b", "w"]
    a, b, w = summary.tensors
    assert (a.ops, a.negotiations, a.negotiate_total_us, a.op_total_us, a.total_us) == (3, 3, 315, 810, 1125)
    assert (a.negotiate_mean_us, a.op_mean_us) == (105, 270)
    assert (b.negotiate_total_us, b.total_us) == (130, 940)
    assert (a.dominant_activity, a.dominant_activity_us, a.dominant_activity_pct) == (
        "SHM_ALLREDUCE", 600, 74.074)
    assert (a.dtype, a.shape, a.op_types) == ("float32", "[64, 3, 7, 7]", ["ALLREDUCE"])
    assert (w.pid, w.total_us, w.shape, w.dominant_activity) == (1, 90, "[10]", "MPI_BCAST")


def test_straggler_rank():
    summary = summarize(training_timeline().events)
    assert summary.straggler_negotiations == 7
    assert summary.straggler_ties == 0
    rank0, rank1 = summary.stragglers
    assert (rank0.rank, rank0.negotiations, rank0.times_last, rank0.lag_total_us, rank0.lag_mean_us) == (
        0, 7, 1, 5, 5)
    assert (rank1.rank, rank1.negotiations, rank1.times_last, rank1.lag_total_us) == (1, 7, 6, 30 + 300 + 100)
    assert rank1.lag_mean_us == 71.667
    assert rank1.last_share == 0.857143
    assert summary.verdict == "Rank 1 was last to submit 86% of the time, on average 71.7 us after the others."


def test_ties_and_no_clear_straggler():
    tl = TimelineBuilder()
    tl.negotiate("t", "ALLREDUCE", 0, [(0, 5), (1, 9), (2, 9)], 9)  # ranks 1 and 2 tie for last
    tl.negotiate("u", "ALLREDUCE", 0, [(2, 1), (0, 2), (1, 7)], 7)
    tl.negotiate("v", "ALLREDUCE", 0, [(1, 1), (2, 2), (0, 4)], 4)
    tl.negotiate("x", "ALLREDUCE", 0, [(0, 3)], 3)  # one rank: says nothing about stragglers
    summary = summarize(tl.events)
    assert (summary.straggler_negotiations, summary.straggler_ties) == (3, 1)
    assert [(s.rank, s.negotiations, s.times_last, s.lag_total_us) for s in summary.stragglers] == [
        (0, 3, 1, 2), (1, 3, 1, 5), (2, 3, 0, 0)]
    assert summary.verdict == ("No rank stands out: the last rank to submit varies (rank 1 was last to submit "
                               "33% of the time, on average 5 us after the others).")
    assert summary.ops == 0 and summary.negotiations == 4
    all_tied = TimelineBuilder()
    all_tied.negotiate("t", "ALLREDUCE", 0, [(0, 5), (1, 5)], 5)
    assert summarize(all_tied.events).verdict.startswith("No rank was last on its own")
    assert summarize(TimelineBuilder().events).verdict.startswith("No straggler information")


def test_activity_categories_and_durations():
    assert activity_category("QUEUE") == "queue"
    for name in ("MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_HOST_BUFFER", "COPY_ALLGATHER_OUTPUT"):
        assert activity_category(name) == "memcpy"
    for name in ("SHM_ALLREDUCE", "TCP_ALLREDUCE", "MPI_BCAST", "MPI_CROSS_ALLGATHER", "NCCL_REDUCE",
                 "GLOO_REDUCESCATTER", "SHM_ALLGATHER", "MPI_ALLTOALL"):
        assert activity_category(name) == "data_plane"
    for name in ("WAIT_FOR_DATA", "INIT_FUSION_BUFFER", "INIT_NCCL", "ALLOCATE_OUTPUT", "SOMETHING_NEW"):
        assert activity_category(name) == "other"
    assert [format_duration(us) for us in (0, 3.25, 71.666, 850, 999.7, 3200, 12345, 150_000, 1_250_000,
                                           123_000_000, 4_321_000_000)] == [
        "0 us", "3.25 us", "71.7 us", "850 us", "1000 us", "3.2 ms", "12.3 ms", "150 ms", "1.25 s", "123 s",
        "4321 s"]


def test_complete_x_activities_stray_ends_and_malformed_events():
    tl = TimelineBuilder()
    pid = tl.pid("t")
    tl.events += [
        {"ph": "E", "ts": 1, "pid": pid},  # closes nothing
        {"ph": "B", "name": "ALLGATHER", "ts": 10, "pid": pid},
        {"ph": "X", "name": "SHM_ALLGATHER", "ts": 10, "pid": pid, "dur": 30},
        {"ph": "E", "ts": 50, "pid": pid},
        {"ph": "B", "name": "ALLGATHER", "pid": pid},  # no ts
        {"ph": "C", "name": "counter", "ts": 5, "pid": pid},
        "not an event",
    ]
    summary = summarize(tl.events)
    (stats,) = summary.op_types
    assert stats.split_us == {"queue": 0, "memcpy": 0, "data_plane": 30, "other": 10}
    assert any("closed nothing" in note for note in summary.notes)
    assert any("numeric 'ts'" in note for note in summary.notes)


# --- live and truncated files -----------------------------------------------------------------------------------


def test_live_file_with_operations_in_flight(tmp_path):
    tl = training_timeline()
    tl.negotiate("grad.a", "ALLREDUCE", 4000, [(0, 4005)])  # step 4: still negotiating
    tl.op(["w"], "BROADCAST", 4100, [("MPI_BCAST", 4100, 4150)], None)  # and a broadcast still running
    path = write(tmp_path, tl.text())
    json.loads(path.read_text())  # the writer keeps it valid JSON
    summary = summarize_file(path)
    complete = summarize(training_timeline().events)
    assert summary.open_at_end == 2
    assert (summary.ops, summary.negotiations, summary.op_types) == (7, 7, complete.op_types)
    assert summary.span_end_us == 4150
    assert len(summary.notes) == 1 and "2 tensors still had a negotiation or an operation open" in summary.notes[0]


def test_truncated_mid_event(tmp_path):
    text = training_timeline().text()
    cut = text.rindex('{"ph": "E"') + 12  # inside the last event
    loaded = parse_timeline_text(text[:cut], "t.json")
    assert loaded.truncated
    assert len(loaded.events) == len(training_timeline().events) - 1
    assert "truncated" in loaded.notes[0] and "12 characters ignored" in loaded.notes[0]
    summary = summarize_file(write(tmp_path, text[:cut]))
    assert summary.notes[0].startswith("the file was truncated")
    assert summary.ops == 6  # grad.b's last allreduce lost its final E
    assert summary.open_at_end == 1


def test_unclosed_array_and_trailing_comma():
    text = training_timeline().text().rstrip().rstrip("]")
    loaded = parse_timeline_text(text + ",\n")
    assert len(loaded.events) == len(training_timeline().events)
    assert loaded.truncated and "does not end with ']'" in loaded.notes[0]
    closed = parse_timeline_text(text + ",\n]")
    assert (closed.truncated, closed.notes, len(closed.events)) == (False, [], len(training_timeline().events))


def test_every_cut_of_a_file_is_readable():
    tl = TimelineBuilder()
    tl.negotiate("t", "ALLREDUCE", 0, [(0, 1), (1, 2)], 2)
    tl.op(["t"], "ALLREDUCE", 3, [("QUEUE", 3, 4), ("SHM_ALLREDUCE", 4, 8)], 9)
    text = tl.text()
    counts = []
    for cut in range(text.index("[") + 1, len(text) + 1):
        loaded = parse_timeline_text(text[:cut])
        counts.append(len(loaded.events))
        summary = summarize(loaded.events, notes=loaded.notes)
        assert summary.ops <= 1
    assert counts == sorted(counts) and counts[-1] == len(tl.events)
    assert summarize(parse_timeline_text(text).events).ops == 1


def test_other_shapes_of_valid_files(tmp_path):
    events = training_timeline().events
    assert len(load_events(write(tmp_path, json.dumps({"traceEvents": events})))) == len(events)
    assert len(load_events(write(tmp_path, json.dumps(events)))) == len(events)
    assert parse_timeline_text("[").events == []
    assert summarize(parse_timeline_text("[]").events).ops == 0
    corrupt = parse_timeline_text('[{"ph": "i", "ts": 1}, {"ph": oops}, {"ph": "i", "ts": 2}]')
    assert len(corrupt.events) == 1 and corrupt.truncated


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("hello", "is not a timeline: it is not valid JSON"),
    ('{"a": 1}', "is JSON but not a timeline"),
    ("[oops", "is not a timeline: after '[' comes 'oops'"),
    ("[1, 2]", "is not a timeline: its array holds no event objects"),
])
def test_invalid_files_raise(tmp_path, content, message):
    with pytest.raises(TimelineError, match=re.escape(message)):
        summarize_file(write(tmp_path, content))


# --- the command line -------------------------------------------------------------------------------------------


def test_cli_report(tmp_path, capsys):
    path = write(tmp_path, training_timeline().text())
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    print(out)
    lines = out.splitlines()
    assert lines[0] == f"Horovod timeline: {path}"
    assert "  wall span 3.38 ms (ts 0 us to 3.38 ms), recording started 2023-11-14 22:13:20 UTC" in lines
    assert "  3 tensors, 7 operations in 4 collectives (fused tensors counted once), 7 negotiations" in lines
    assert "  2 ranks seen in ready ticks, 4 cycle markers" in lines
    assert "  a collective was running 25.4% of the span, a negotiation was pending 10.5% of it" in lines
    header = next(line for line in lines if line.lstrip().startswith("op "))
    assert header.split() == ["op", "ops", "collectives", "negotiate", "total", "mean", "op", "total", "mean",
                              "queue", "memcpy", "data", "plane", "other"]
    allreduce = next(line for line in lines if line.lstrip().startswith("ALLREDUCE"))
    assert allreduce.split() == ["ALLREDUCE", "6", "3", "445", "us", "74.2", "us", "1.62", "ms", "270", "us",
                                 "7.4%", "14.8%", "74.1%", "3.7%"]
    assert next(line for line in lines if "SHM_ALLREDUCE " in line).split() == [
        "SHM_ALLREDUCE", "data", "plane", "1.2", "ms", "71.9%"]  # of all op time: 1200 / (1620 + 50)
    first = next(line for line in lines if line.lstrip().startswith("1 "))
    assert first.split() == ["1", "grad.a", "3", "1.12", "ms", "105", "us", "270", "us", "SHM_ALLREDUCE", "(74%)"]
    rank1 = [line.split() for line in lines if line.split()[:2] == ["1", "7"]]
    assert rank1 == [["1", "7", "6", "85.7%", "430", "us", "71.7", "us"]]
    assert lines[-1] == "Rank 1 was last to submit 86% of the time, on average 71.7 us after the others."


def test_cli_top_and_notes(tmp_path, capsys):
    text = training_timeline().text()
    path = write(tmp_path, text[: text.rindex('{"ph": "E"') + 5])
    assert main(["summary", str(path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "Slowest tensors (top 1 of 3 by negotiation + op time)" in out
    assert "  note: the file was truncated: its last event is incomplete" in out
    assert "grad.b" not in out.split("Slowest tensors")[1].split("Stragglers")[0]


def test_cli_json_round_trips(tmp_path, capsys):
    path = write(tmp_path, training_timeline().text())
    assert main(["summary", str(path), "--json", "--top", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert Summary.from_dict(data) == summarize_file(path)
    assert data["op_types"][0]["op"] == "ALLREDUCE"
    assert data["stragglers"][1]["times_last"] == 6
    assert main(["summary", str(path), "--json", "--top", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [tensor["name"] for tensor in data["tensors"]] == ["grad.a", "grad.b"]
    assert data["tensor_count"] == 3


def test_cli_plot_writes_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = write(tmp_path, training_timeline().text())
    out_png = tmp_path / "summary.png"
    assert main(["summary", str(path), "--plot", str(out_png)]) == 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Plot written to {out_png}" in capsys.readouterr().out
    empty_png = tmp_path / "empty.png"
    assert main(["summary", str(write(tmp_path, "[]", "empty.json")), "--plot", str(empty_png)]) == 0
    assert empty_png.read_bytes()[:4] == b"\x89PNG"


def test_cli_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    path = write(tmp_path, training_timeline().text())
    assert main(["summary", str(path), "--plot", str(tmp_path / "x.png")]) == 2
    captured = capsys.readouterr()
    assert "pip install matplotlib" in captured.err and captured.out == ""


def test_cli_plot_unwritable(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = write(tmp_path, training_timeline().text())
    assert main(["summary", str(path), "--plot", str(tmp_path / "missing-dir" / "x.png")]) == 2
    assert "cannot write the plot to" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    (None, "no such file; pass the path that HOROVOD_TIMELINE named"),
    ("", "is empty"),
    ("not json at all", "is not a timeline"),
    ("[1, 2", "its array holds no event objects (the first entry is 1)"),
])
def test_cli_bad_files_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "timeline.json"
    if content is not None:
        path.write_text(content)
    assert main(["summary", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("python -m horovod.timeline: error: ") and message in err


def test_cli_directory_and_usage(tmp_path, capsys):
    assert main(["summary", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main([]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["summary", "x", "--top", "-1"])
    assert exc.value.code == 2


def test_module_entry_point_and_sample_file():
    sample = DATA / "timeline_sample.json"
    result = subprocess.run([sys.executable, "-m", "horovod.timeline", "summary", str(sample), "--top", "5"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    summary = summarize_file(sample)
    assert result.stdout == format_report(summary, top=5)
    assert (summary.tensor_count, summary.ranks) == (6, 4)
    assert summary.stragglers[2].times_last == max(stats.times_last for stats in summary.stragglers)
    assert summary.verdict.startswith("Rank 2 was last to submit")
    missing = subprocess.run([sys.executable, "-m", "horovod.timeline", "summary", str(DATA / "nope.json")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_docs_example_matches_the_tool():
    docs = Path(__file__).parents[2] / "docs" / "timeline.md"
    command = "$ python -m horovod.timeline summary tests/unit/data/timeline_sample.json --top 5\n"
    text = docs.read_text()
    assert command in text, "docs/timeline.md lost its example"
    shown = text.split(command, 1)[1].split("```", 1)[0]
    summary = summarize_file(DATA / "timeline_sample.json")
    summary.source = "tests/unit/data/timeline_sample.json"
    assert shown == format_report(summary, top=5), "regenerate the example in docs/timeline.md"
