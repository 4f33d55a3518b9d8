"""The timeline and the stall inspector, end to end through the launcher at 2 and 3 ranks."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.launch import ROOT, horovodrun, rank_lines
from tests.support.timing import SLACK_S

pytestmark = pytest.mark.timeout(180)
WORKERS = ROOT / "tests" / "integration" / "workers"
TIMEOUT = 90


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return env


def worker(name, *args):
    return [sys.executable, str(WORKERS / name), *[str(a) for a in args]]


def tensors(events):
    """pid -> tensor name, and the events of each tensor name in file order."""
    pids = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"] > 0}
    by_name = {}
    for e in events:
        if e.get("ph") != "M" and e.get("pid") in pids:
            by_name.setdefault(pids[e["pid"]], []).append(e)
    return by_name


def check_tensor(events, op, activity, np_):
    """One tensor's events: negotiation with a tick per rank, then the op, QUEUE and the data plane's op, all
    balanced, closed by an E that carries dtype and shape."""
    depth, ticks, names, last_args = 0, set(), [], None
    for e in events:
        if e["ph"] == "B":
            depth += 1
            names.append(e["name"])
        elif e["ph"] == "E":
            depth -= 1
            assert depth >= 0, events
            last_args = e.get("args")
        elif e["ph"] == "X":
            ticks.add(e["name"])
    assert depth == 0, events
    assert ticks == {str(r) for r in range(np_)}, ticks
    assert names[:3] == [f"NEGOTIATE_{op}", op, "QUEUE"], names
    assert activity in names, names
    assert last_args and "dtype" in last_args and "shape" in last_args, last_args
    ts = [e["ts"] for e in events]
    assert ts == sorted(ts), ts


@pytest.mark.parametrize("np_", [2, 3])
def test_timeline_is_valid_json_mid_run_and_shows_every_tensor(tmp_path, np_):
    path = tmp_path / "timeline.json"
    result = horovodrun(np_, worker("timeline_steps.py", "static", path), timeout=TIMEOUT,
                        env={"HOROVOD_TIMELINE": str(path), "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert result.returncode == 0, result.stdout[-5000:]
    mid = [line for line in rank_lines(result.stdout, 0) if line.startswith("MIDRUN")]
    assert mid, result.stdout[-3000:]
    _, count, names = mid[0].split()
    assert int(count) > 20 and "allreduce.train.grad.0" in names.split(","), mid
    events = json.loads(path.read_text())
    assert events[0]["name"] == "process_name" and events[0]["pid"] == 0
    by_name = tensors(events)
    assert set(by_name) == {"allreduce.train.grad.0", "allreduce.train.grad.1", "allreduce.train.grad.2",
                            "allgather.train.gather", "broadcast.train.bcast"}, set(by_name)
    per_step = {"allreduce.train.grad.0": ("ALLREDUCE", "SHM_ALLREDUCE"),
                "allgather.train.gather": ("ALLGATHER", "SHM_ALLGATHER"),
                "broadcast.train.bcast": ("BROADCAST", "SHM_BCAST")}
    for name, (op, activity) in per_step.items():
        evs = by_name[name]
        assert sum(1 for e in evs if e["ph"] == "B" and e["name"] == f"NEGOTIATE_{op}") == 6
        starts = [i for i, e in enumerate(evs) if e["ph"] == "B" and e["name"].startswith("NEGOTIATE_")]
        for a, b in zip(starts, starts[1:] + [len(evs)]):
            check_tensor(evs[a:b], op, activity, np_)
    fused = [e for e in by_name["allreduce.train.grad.1"] if e.get("name") == "MEMCPY_IN_FUSION_BUFFER"]
    assert fused, "the three gradients were fused, so they were copied into the fusion buffer"
    assert any(e.get("name") == "CYCLE_START" and e["ph"] == "i" for e in events)
    # The report tool reads the recorded file.
    report = subprocess.run([sys.executable, "-m", "horovod.timeline", "summary", str(path), "--json"],
                            capture_output=True, text=True, timeout=60, env=_env())
    assert report.returncode == 0, report.stderr
    summary = json.loads(report.stdout)
    assert summary["tensor_count"] == 5 and summary["negotiations"] == 5 * 6, summary
    kinds = {row["op"] for row in summary["op_types"]}
    assert kinds == {"ALLREDUCE", "ALLGATHER", "BROADCAST"}, kinds


def test_dynamic_timeline_start_stop_twice_with_different_files(tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    result = horovodrun(2, worker("timeline_steps.py", "dynamic", first, second), timeout=TIMEOUT,
                        env={"HOROVOD_TIMELINE": "DYNAMIC"})
    assert result.returncode == 0, result.stdout[-5000:]
    one, two = json.loads(first.read_text()), json.loads(second.read_text())
    names_one, names_two = set(tensors(one)), set(tensors(two))
    assert names_one and all(".first." in n for n in names_one), names_one
    assert names_two and all(".second." in n for n in names_two), names_two
    assert not any(e.get("name") == "CYCLE_START" for e in one)
    assert any(e.get("name") == "CYCLE_START" for e in two)


def test_start_timeline_without_horovod_timeline_says_how_to_enable_it(tmp_path):
    code = ("import horovod.numpy as hvd; hvd.init()\n"
            "try:\n    hvd.start_timeline('x.json')\nexcept ValueError as e:\n    print('VALUEERROR', e)\n")
    result = horovodrun(2, [sys.executable, "-c", code], timeout=TIMEOUT, env={"HOROVOD_TIMELINE": ""})
    assert result.returncode == 0, result.stdout[-3000:]
    for r in range(2):
        lines = [line for line in rank_lines(result.stdout, r) if line.startswith("VALUEERROR")]
        assert lines and "set HOROVOD_TIMELINE=DYNAMIC" in lines[0], result.stdout[-3000:]


@pytest.mark.parametrize("np_,plane", [(2, {}), (3, {}), (3, {"HOROVOD_CPU_OPERATIONS": "tcp"})],
                         ids=["2-shm", "3-shm", "3-tcp"])
def test_stall_warning_names_the_missing_rank_within_the_check_time(np_, plane):
    # Rank 1 submits late, after the warning's bound (1 s check time + the slack of a loaded machine) and 1 s more.
    late = 1.0 + SLACK_S + 1.0
    result = horovodrun(np_, worker("stall.py", late, "late"), timeout=TIMEOUT,
                        env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0",
                             **plane})
    out = result.stdout
    warnings = [i for i, line in enumerate(rank_lines(out, 0)) if "WARNING" in line and "subset of ranks" in line]
    assert warnings, out[-5000:]
    lines = rank_lines(out, 0)
    after = lines[warnings[0]:warnings[0] + 4]
    assert "Missing ranks:" in after, after
    entry = [line for line in after if line.startswith("1: [")]
    assert entry and "allreduce.only.some (waiting" in entry[0], after
    waited = float(re.search(r"waiting ([\d.]+) s", entry[0]).group(1))
    assert 1.0 <= waited < 1.0 + SLACK_S, entry
    if np_ == 3:
        assert not any(line.startswith("2: [") for line in after), after
    # Where rank 1 is: its state, its heartbeat, and its Python stack, the program's own thread first (it sleeps).
    report = lines[warnings[0]:warnings[0] + 40]
    where = report.index("Where the missing ranks are:")
    assert re.match(r"Rank 1 \(host \S+, pid \d+\): running \(\w+\)\. Its heartbeat is [\d.]+ s old: no collective "
                    r"running \(it is in its own code\)\.", report[where + 1]), report
    assert report[where + 2] == "Rank 1's Python stack (every thread, the program's own first):", report
    assert report[where + 3] == "Thread 'MainThread':" and "stall.py" in report[where + 4], report
    assert report[where + 5].strip() == "time.sleep(sleep)", report
    # No shutdown time: the stall resolves when rank 1 submits the tensor late, and the job succeeds.
    assert result.returncode == 0, out[-5000:]
    for r in range(np_):
        assert "RESULT ok" in rank_lines(out, r), out[-5000:]


@pytest.mark.slow      # the quick tier keeps the warning at 2 ranks and the data-plane shutdown
@pytest.mark.parametrize("np_", [2, 3])
def test_stall_shutdown_stops_every_rank_with_the_same_facts(np_):
    # Rank 1 sleeps past the shutdown's bound (2 s + the slack of a loaded machine) before it submits another name.
    result = horovodrun(np_, worker("stall.py", 2.0 + SLACK_S + 1.0, "skip"), timeout=TIMEOUT,
                        env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    out = result.stdout
    for r in range(np_):
        res = [line for line in rank_lines(out, r) if line.startswith("RESULT")]
        assert res, f"rank {r} reported nothing:\n{out[-5000:]}"
        assert res[0].startswith("RESULT HorovodInternalError"), res
        assert "Missing ranks: | 1!: [allreduce.only.some (waiting" in res[0], res
        assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2" in res[0], res
        if r != 1:
            elapsed = float(res[0].split()[2])
            assert 2.0 <= elapsed < 2.0 + SLACK_S, res


def test_stall_check_disable_means_no_warning():
    result = horovodrun(2, worker("stall.py", 2.5, "late"), timeout=TIMEOUT,
                        env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2",
                             "HOROVOD_STALL_CHECK_DISABLE": "1"})
    assert result.returncode == 0, result.stdout[-3000:]
    assert "subset of ranks" not in result.stdout, result.stdout[-3000:]
