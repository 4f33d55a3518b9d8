"""The flight recorder in one process: the ring, the record written as JSON, when it is written (an abort, before
any handle fails; SIGUSR1, with faulthandler's stacks), the launcher's side of the folder, and the ``flight``
comparison on hand-made records."""
import json
import os
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest

from horovod.backends.local import LocalBackend
from horovod.common import flight_records
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.controller.messages import make_request
from horovod.core.engine import Engine, Entry, flight
from horovod.core.engine.handles import Handle
from horovod.core.engine.observer import EngineObserver, Hooks
from horovod.core.engine.settings import EngineSettings
from horovod.core.observers import flight_recorder
from horovod.runner import flight_folder
from horovod.timeline import __main__ as timeline_cli
from horovod.timeline import flight as analysis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def entry(name, shape=(4,), rtype=RequestType.ALLREDUCE, dtype=np.float32):
    tensor = np.ones(shape, dtype)
    request = make_request(name, rtype, DataType.FLOAT32 if dtype == np.float32 else DataType.FLOAT64, shape,
                           ReduceOp.SUM)
    return Entry(request, tensor, tensor.copy(), Handle(name))


def ring(capacity=4, set_id=90, plane="shm"):
    return flight.FlightRing(capacity, set_id, [0, 1, 2], 1, lambda rtype, nbytes: plane)


# ---------------------------------------------------------------------------------------------- the ring
def test_the_ring_numbers_every_submission_and_keeps_the_last_ones():
    r = ring(capacity=3)
    entries = [entry(f"t{i}") for i in range(5)]
    r.submit(entries[:2], 10.0)
    r.submit(entries[2:], 11.0)
    assert r.count == 5 and r.global_rank == 1
    records = r.snapshot()
    assert [rec[flight.SEQ] for rec in records] == [3, 4, 5]       # the oldest dropped
    assert [rec[flight.REQUEST][0] for rec in records] == ["t2", "t3", "t4"]
    assert records[0][flight.NBYTES] == 16 and records[0][flight.SUBMITTED] == 11.0
    assert entries[4].flight[flight.SEQ] == 5
    records[0][flight.DONE] = 1.0                   # a snapshot is a copy
    assert r.snapshot()[0][flight.DONE] is None


def test_states_are_stamped_in_place_and_the_first_failure_is_kept():
    r = ring()
    a, b, c = entry("a"), entry("b"), entry("c")
    r.submit([a, b, c], 1.0)
    flight.started([a, None, b], 2.0, 3.0)          # None: this rank joined
    flight.done([a], 4.0)
    flight.failed([b], 5.0, "first")
    flight.failed([b], 6.0, "second")
    flight.fast_round(c.flight, 7.0)
    assert a.flight[flight.NEGOTIATED:flight.FAILED] == [2.0, 3.0, 4.0]
    assert b.flight[flight.FAILED] == 5.0 and b.flight[flight.ERROR] == "first"
    assert c.flight[flight.PLANE] == flight.FAST_ROUND and c.flight[flight.DONE] == 7.0
    assert [flight_recorder.state_of(x.flight) for x in (a, b, c)] == ["done", "failed", "done"]


def test_a_routed_plane_is_named_by_size_and_barriers_by_the_coordinator():
    small, large = types.SimpleNamespace(name="mpi"), types.SimpleNamespace(name="shm")
    routed = types.SimpleNamespace(name="routed", small=small, large=large, reduce_max=1024, move_max=-1)
    namer = flight.plane_namer(routed)
    assert namer(RequestType.ALLREDUCE, 1024) == "mpi" and namer(RequestType.ALLREDUCE, 1025) == "shm"
    assert namer(RequestType.BROADCAST, 10) == "shm"
    assert flight.plane_namer(LocalBackend())(RequestType.ALLREDUCE, 1) == "local"
    r = ring()
    e = entry("barrier.noname", (), RequestType.BARRIER)
    r.submit([e], 1.0)
    assert r.plane_of(e.flight) == "coordinator"


# ---------------------------------------------------------------------------------------------- the engine
class Incidents(EngineObserver):
    def __init__(self):
        self.seen = []

    def on_incident(self, kind, message):
        self.seen.append((kind, message))


def test_hooks_list_the_incident_observers_only():
    watcher, plain = Incidents(), EngineObserver()
    hooks = Hooks.of([watcher, plain, flight_recorder.FlightObserver()])
    assert hooks.incident[0] is watcher and len(hooks.incident) == 2
    assert hooks.batch == ()                # the recorder never puts batches on the observed path


def test_an_engine_records_what_it_runs_and_turns_off_at_size_0():
    engine = Engine(0, 1, LocalBackend(), {}, EngineSettings(flight_recorder_size=8), process_set_id=91).start()
    try:
        for name in ("x", "y"):
            e = entry(name)
            engine.enqueue([e])
            e.handle.wait(timeout=10)
        deadline = time.monotonic() + 5
        while engine.flight_ring.snapshot()[-1][flight.DONE] is None and time.monotonic() < deadline:
            time.sleep(0.001)
        records = engine.flight_ring.snapshot()
        assert [(rec[flight.SEQ], rec[flight.REQUEST][0]) for rec in records] == [(1, "x"), (2, "y")]
        for rec in records:
            times = rec[flight.SUBMITTED:flight.FAILED]
            assert None not in times and times == sorted(times)
            assert engine.flight_ring.plane_of(rec) == "local"
    finally:
        engine.shutdown()
    assert engine.flight_ring.closed_at is not None
    off = Engine(0, 1, LocalBackend(), {}, EngineSettings(flight_recorder_size=0), process_set_id=92)
    assert off.flight_ring is None


class Broken(LocalBackend):
    def allreduce_buffer(self, buf, op):
        raise RuntimeError("the data plane broke")


class SeesHandles(EngineObserver):
    """At an abort: were the pending handles still pending, and what did their records say?"""

    def __init__(self, engine_box):
        self.box, self.seen = engine_box, []

    def on_incident(self, kind, message):
        engine = self.box[0]
        pending = list(engine.table.values())
        self.seen.append((kind, [e.handle.poll() for e in pending], [flight_recorder.state_of(e.flight)
                                                                      for e in pending]))


def test_an_abort_tells_the_observers_before_any_handle_fails():
    box = []
    watcher = SeesHandles(box)
    engine = Engine(0, 1, Broken(), {}, EngineSettings(flight_recorder_size=8), observers=[watcher],
                    process_set_id=93)
    box.append(engine)
    engine.control.send_abort = lambda reason: None
    waiting = entry("waiting")
    with engine.lock:                   # in the table, never emitted (a size-1 engine emits at once otherwise)
        engine.table["waiting"] = waiting
        engine.flight_ring.submit([waiting], time.time())
    engine.start()
    try:
        broken = entry("broken")
        engine.enqueue([broken])
        with pytest.raises(HorovodInternalError, match="data plane broke"):
            broken.handle.wait(timeout=5)
        with pytest.raises(HorovodInternalError):
            waiting.handle.wait(timeout=5)
        assert watcher.seen and watcher.seen[0][0] == "abort"
        assert watcher.seen[0][1] == [False]            # the waiting handle had not failed yet
        assert watcher.seen[0][2] == ["failed"]         # marked failed first, for the record written then
        assert broken.flight[flight.ERROR] and "data plane broke" in broken.flight[flight.ERROR]
    finally:
        engine.shutdown()


# ---------------------------------------------------------------------------------------------- the record
@pytest.fixture
def record_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVOD_FLIGHT_RECORDER_DIR", str(tmp_path / "job"))
    monkeypatch.setattr(flight, "_rings", {})
    monkeypatch.setattr(flight_recorder, "_written", {})
    return tmp_path / "job"


def test_the_record_is_json_with_every_set_and_entry(record_dir):
    r = ring(capacity=8, set_id=0)
    a = entry("allreduce.a")
    b = entry("broadcast.b", (2, 3), RequestType.BROADCAST, np.float64)
    b.request = b.request._replace(root=2)       # root rank
    r.submit([a, b], 100.0)
    flight.started([a], 101.0, 102.0)
    flight.done([a], 103.0)
    folder = flight_recorder.dump_all("test", "why")
    assert folder == str(record_dir)
    assert os.listdir(folder) == ["rank.1.json"]            # written atomically: no temporary left
    doc = json.loads((record_dir / "rank.1.json").read_text())
    assert doc["format"] == "horovod-flight-record" and doc["rank"] == 1 and doc["size"] == 3
    assert doc["reason"] == "test" and doc["detail"] == "why" and doc["pid"] == os.getpid()
    (part,) = doc["process_sets"]
    assert part["id"] == 0 and part["ranks"] == [0, 1, 2] and part["rank_in_set"] == 1 and part["submitted"] == 2
    first, second = part["entries"]
    assert first == {"seq": 1, "name": "allreduce.a", "op": "ALLREDUCE", "dtype": "float32", "shape": [4],
                     "bytes": 16, "state": "done", "plane": "shm", "reduce_op": "SUM", "submitted_at": 100.0,
                     "negotiated_at": 101.0, "started_at": 102.0, "done_at": 103.0, "failed_at": None}
    assert second["state"] == "submitted" and second["root_rank"] == 2 and second["shape"] == [2, 3]
    assert second["bytes"] == 48 and "reduce_op" not in second and second["plane"] is None     # never started
    assert (record_dir / "rank.1.json").read_text().count("\n") >= 5      # one entry per line


def test_a_second_dump_for_the_same_reason_soon_after_writes_nothing(record_dir):
    ring(set_id=0)
    assert flight_recorder.dump_all("abort") == str(record_dir)
    path = record_dir / "rank.1.json"
    first = path.stat().st_mtime_ns
    time.sleep(0.01)
    assert flight_recorder.dump_all("abort") == str(record_dir)
    assert path.stat().st_mtime_ns == first
    flight_recorder.dump_all("report")                  # another reason writes
    assert json.loads(path.read_text())["reason"] == "report"
    assert flight_records.request_dump("watchdog", "x") == str(record_dir)     # the layers below's entry


def test_a_dump_never_raises(record_dir, tmp_path, monkeypatch):
    assert flight_recorder.dump_all("nothing recorded") is None        # no ring yet
    ring(set_id=0)
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("HOROVOD_FLIGHT_RECORDER_DIR", str(blocker / "sub"))     # cannot be created
    assert flight_recorder.dump_all("broken") is None


SIGNAL_SCRIPT = textwrap.dedent("""
    import faulthandler, os, signal, sys, time
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)    # as a test harness does
    from horovod.core.engine import flight
    from horovod.core.observers import flight_recorder
    flight.FlightRing(10, 0, [0, 1], 1, lambda rtype, nbytes: "shm")
    assert flight_recorder.install_signal_handler()
    assert flight_recorder.install_signal_handler()         # idempotent
    def waiting_for_the_signal():
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(200):
            if os.path.exists(os.path.join(sys.argv[1], "rank.1.json")):
                print("RECORD WRITTEN", flush=True)
                return
            time.sleep(0.01)
    waiting_for_the_signal()
""")


def test_sigusr1_dumps_the_stacks_and_writes_the_record(tmp_path):
    env = {**os.environ, "HOROVOD_FLIGHT_RECORDER_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", SIGNAL_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert "RECORD WRITTEN" in result.stdout, result.stderr
    assert "Current thread" in result.stderr and "waiting_for_the_signal" in result.stderr, result.stderr
    assert json.loads((tmp_path / "rank.1.json").read_text())["reason"] == "SIGUSR1"


def test_a_program_handler_for_sigusr1_is_left_alone():
    script = ("import signal\nfrom horovod.core.observers import flight_recorder\n"
              "mine = lambda *a: None\nsignal.signal(signal.SIGUSR1, mine)\n"
              "assert not flight_recorder.install_signal_handler()\nassert signal.getsignal(signal.SIGUSR1) is mine\n")
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------- the folder
def test_folders_agree_within_a_job():
    assert flight_records.default_folder({"HOROVOD_FLIGHT_RECORDER_DIR": "rel"}) == os.path.abspath("rel")
    slurm = flight_records.default_folder({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3"})
    assert slurm == os.path.join(os.getcwd(), "horovod-flight", "77.3")
    pmix = flight_records.default_folder({"PMIX_NAMESPACE": "prterun-vm-123@1"})
    assert pmix.endswith(os.path.join("horovod-flight", "prterun-vm-123-1"))
    name = os.path.basename(flight_records.new_job_folder("/base"))
    assert flight_records.new_job_folder("/base").startswith("/base/horovod-flight/") and len(name) == 20


def test_the_launcher_chooses_one_folder_and_names_it_when_ranks_wrote(tmp_path, monkeypatch):
    env = {}
    monkeypatch.chdir(tmp_path)
    folder = flight_folder.choose(env)
    assert env["HOROVOD_FLIGHT_RECORDER_DIR"] == folder and folder.startswith(str(tmp_path / "horovod-flight"))
    assert flight_folder.failure_note() == ""
    os.makedirs(folder)
    for rank in (0, 2):
        with open(os.path.join(folder, f"rank.{rank}.json"), "w") as f:
            f.write("{}")
    note = flight_folder.failure_note()
    assert f"Flight records of ranks 0, 2: {folder}" in note
    assert f"python -m horovod.timeline flight {folder}" in note
    assert flight_folder.choose({"HOROVOD_FLIGHT_RECORDER_SIZE": "0"}) is None
    given = {"HOROVOD_FLIGHT_RECORDER_DIR": "mine"}
    assert flight_folder.choose(given) == str(tmp_path / "mine") == given["HOROVOD_FLIGHT_RECORDER_DIR"]


class FakeWorker:
    def __init__(self, rank, folder):
        self.spec = types.SimpleNamespace(rank=rank, env={"HOROVOD_FLIGHT_RECORDER_DIR": folder})
        self.proc = types.SimpleNamespace(poll=lambda: None)


def test_the_launcher_waits_for_the_survivors_records_only_while_they_come(tmp_path):
    folder = str(tmp_path)
    workers = [FakeWorker(0, folder), FakeWorker(1, folder)]
    start = time.monotonic()
    flight_folder.await_records(workers, 1, wait=5.0)       # an exit code, and nobody wrote: no wait
    assert time.monotonic() - start < 0.5
    (tmp_path / "rank.0.json").write_text("{}")
    (tmp_path / "rank.1.json").write_text("{}")
    start = time.monotonic()
    flight_folder.await_records(workers, -9, wait=5.0)      # everyone wrote: no wait either
    assert time.monotonic() - start < 0.5
    os.remove(tmp_path / "rank.1.json")
    start = time.monotonic()
    flight_folder.await_records(workers, -9, wait=0.3)      # rank 1 never writes: the whole wait, no more
    assert 0.3 <= time.monotonic() - start < 2.0


# ---------------------------------------------------------------------------------------------- the comparison
def e(seq, name, state, op="ALLREDUCE"):
    at = dict.fromkeys(("submitted_at", "negotiated_at", "started_at", "done_at", "failed_at"))
    order = ["submitted", "negotiated", "started", "done"]
    for reached in order[:order.index(state) + 1] if state != "failed" else ["submitted"]:
        at[f"{reached}_at"] = float(seq)
    if state == "failed":
        at["failed_at"] = float(seq) + 0.5
    return {"seq": seq, "name": name, "op": op, "dtype": "float32", "shape": [4], "bytes": 16, "state": state,
            "plane": "shm", "reduce_op": "SUM", **at}


def doc(rank, entries, size=3, set_id=0, ranks=None, reason="abort"):
    return {"format": "horovod-flight-record", "version": 1, "rank": rank, "size": size, "host": "h", "pid": 1,
            "reason": reason, "detail": "", "written_at": 1.0, "capacity": 2000,
            "process_sets": [{"id": set_id, "ranks": ranks or list(range(size)), "rank_in_set": rank,
                              "submitted": max((x["seq"] for x in entries), default=0), "entries": entries}]}


def write(folder, docs):
    for d in docs:
        (folder / f"rank.{d['rank']}.json").write_text(json.dumps(d))
    return str(folder)


def done_steps(n):
    return [e(s, f"step.{s}", "done") for s in range(1, n + 1)]


def test_flight_names_the_rank_that_never_came_and_the_collective(tmp_path):
    folder = write(tmp_path, [doc(0, done_steps(3) + [e(4, "late", "failed")]), doc(1, done_steps(3)),
                              doc(2, done_steps(3) + [e(4, "late", "failed")])])
    text, data = analysis.compare_folder(folder)
    assert "first divergence at #4: ALLREDUCE late (float32 [4], 16 B, SUM)" in text
    assert "    submitted:  0, 2\n" in text and "    started:    none\n" in text and "    failed:     0, 2\n" in text
    assert "    never came: 1\n" in text
    assert "last completed: rank 0: #3, rank 1: #3, rank 2: #3" in text
    (part,) = data["process_sets"]
    assert part["divergence"]["never_came"] == [1] and part["divergence"]["seq"] == 4


def test_flight_with_different_collectives_under_one_number(tmp_path):
    folder = write(tmp_path, [doc(0, done_steps(2) + [e(3, "a", "submitted")], size=2),
                              doc(1, done_steps(2) + [e(3, "b", "submitted")], size=2)])
    text, _ = analysis.compare_folder(folder)
    assert "first divergence at #3: the ranks submitted different collectives" in text
    assert "    ALLREDUCE a (float32 [4], 16 B, SUM)\n      submitted:  0\n" in text
    assert "    ALLREDUCE b (float32 [4], 16 B, SUM)\n      submitted:  1\n" in text


def test_flight_with_a_rank_that_wrote_nothing(tmp_path):
    # Nobody saw #4 negotiated: the rank without a record is the one that never came.
    folder = write(tmp_path, [doc(0, done_steps(3) + [e(4, "late", "failed")]),
                              doc(1, done_steps(3) + [e(4, "late", "failed")])])
    text, _ = analysis.compare_folder(folder)
    assert "first divergence at #4" in text and "never came: 2 (wrote no record)" in text
    assert "rank 2: no record" in text


def test_flight_with_ranks_in_different_states_of_one_collective(tmp_path):
    folder = write(tmp_path, [doc(0, done_steps(3) + [e(4, "big", "done")], size=2),
                              doc(1, done_steps(3) + [e(4, "big", "started")], size=2)])
    text, _ = analysis.compare_folder(folder)
    assert "first divergence at #4: ALLREDUCE big" in text
    assert "    started:    0, 1\n    done:       0\n" in text and "never came: none" in text


def test_flight_when_all_ranks_agree_and_rings_wrapped_differently(tmp_path):
    folder = write(tmp_path, [doc(0, done_steps(10)[4:], size=2), doc(1, done_steps(10)[7:], size=2)])
    text, data = analysis.compare_folder(folder)
    assert "every rank agrees up to #10; the last, ALLREDUCE step.10, is done on each" in text
    assert data["process_sets"][0]["first_common"] == 8


def test_flight_compares_each_process_set(tmp_path):
    d0, d1 = doc(0, done_steps(2), size=2), doc(1, done_steps(2), size=2)
    d0["process_sets"].append(doc(0, [e(1, "in.set", "submitted")], set_id=1, ranks=[0, 1])["process_sets"][0])
    folder = write(tmp_path, [d0, d1])
    text, _ = analysis.compare_folder(folder)
    assert "Process set 0 (ranks 0, 1)\n  every rank agrees up to #2" in text
    assert "Process set 1 (ranks 0, 1)\n  first divergence at #1" in text and "rank 1: no record" in text


def test_the_flight_command(tmp_path, capsys):
    folder = write(tmp_path, [doc(0, done_steps(1), size=1)])
    assert timeline_cli.main(["flight", folder]) == 0
    assert "every rank agrees up to #1" in capsys.readouterr().out
    assert timeline_cli.main(["flight", folder, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"] == [0]
    assert timeline_cli.main(["flight", str(tmp_path / "none")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    (tmp_path / "rank.3.json").write_text("{not json")
    assert timeline_cli.main(["flight", folder]) == 0
    assert "rank.3.json is unreadable" in capsys.readouterr().out


def test_flight_with_a_rank_that_wrote_nothing_but_was_negotiated(tmp_path):
    # #4 was negotiated, so every rank had submitted it: the rank without a record did come.
    folder = write(tmp_path, [doc(0, done_steps(3) + [e(4, "big", "started")]),
                              doc(1, done_steps(3) + [e(4, "big", "started")])])
    text, _ = analysis.compare_folder(folder)
    assert "never came: none" in text and "no record:  2 (it submitted #4: it was negotiated)" in text, text


def test_flight_takes_collectives_done_in_different_orders_as_agreement(tmp_path):
    one = done_steps(2) + [e(3, "x", "done"), e(4, "y", "done")]
    other = done_steps(2) + [e(3, "y", "done"), e(4, "x", "done")]
    folder = write(tmp_path, [doc(0, one, size=2), doc(1, other, size=2)])
    text, _ = analysis.compare_folder(folder)
    assert "every rank agrees up to #4, all done (the ranks ran some collectives in different orders)" in text
    write(tmp_path, [doc(0, one + [e(5, "a", "submitted")], size=2), doc(1, other + [e(5, "b", "submitted")], size=2)])
    text, _ = analysis.compare_folder(str(tmp_path))
    assert "first divergence at #5: the ranks submitted different collectives" in text


def test_flight_passes_over_a_failure_the_ranks_went_on_from(tmp_path):
    # A mismatch (the same name, different ops) failed on every rank, and the job went on: not where it diverges.
    one = done_steps(2) + [e(3, "m", "failed"), e(4, "after", "done"), e(5, "late", "submitted")]
    other = done_steps(2) + [e(3, "m", "failed", op="ALLGATHER"), e(4, "after", "done")]
    folder = write(tmp_path, [doc(0, one, size=2), doc(1, other, size=2)])
    text, _ = analysis.compare_folder(folder)
    assert "first divergence at #5: ALLREDUCE late" in text and "never came: 1" in text, text
    # The same mismatch with nothing after it is the divergence.
    write(tmp_path, [doc(0, one[:3], size=2), doc(1, other[:3], size=2)])
    text, _ = analysis.compare_folder(str(tmp_path))
    assert "first divergence at #3: the ranks submitted different collectives" in text, text
