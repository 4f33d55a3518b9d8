"""The launcher's live page (horovodrun --monitor-port): its token, the JSON it serves from a hand-made rendezvous
store, rates from consecutive beats, reports and elastic rounds; and the ranks' side of it (the running totals a
heartbeat carries, the reports it publishes)."""
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import psutil
import pytest

from horovod.common import heartbeat_records as rec
from horovod.common import wire
from horovod.common.kvstore import KVStoreServer
from horovod.core.engine import flight
from horovod.core.observers import heartbeat
from horovod.runner import launch, monitor
from horovod.runner.monitor import status as status_module

RANK_FIELDS = {"rank", "host", "pid", "state", "last_collective", "waiting_for", "waited_s", "collectives_per_s",
               "bytes_per_s", "last_completed_seq", "heartbeat_age_s"}


def beat(t, done=0, nbytes=0, **more):
    return {rec.T: t, rec.HOST: "h", rec.PID: 4242, rec.ADDR: "127.0.0.1", rec.SUBMITTED: done + 1,
            rec.LAST_DONE: done, rec.DONE: done, rec.DONE_BYTES: nbytes, **more}


def put_beat(store, rank, record):
    store.put(rec.BEAT_SCOPE, str(rank), wire.pack(record))


@pytest.fixture
def store():
    return KVStoreServer(b"k" * 32, host="127.0.0.1")       # never started: the launcher reads it in-process


@pytest.fixture
def page(store):
    served = monitor.Monitor(monitor.JobStatus(store, monitor.static_view(["a", "b"])), "127.0.0.1", 0)
    served.start()
    yield served
    served.stop()


def request(page, path, method="GET", token=None):
    """(status, body) of ``method path`` with ``token`` (the page's own when True, none when None)."""
    query = "" if token is None else f"?token={page.token if token is True else token}"
    req = urllib.request.Request(f"http://127.0.0.1:{page.port}{path}{query}", method=method,
                                 data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("path,method", [("/", "GET"), ("/api/status", "GET"), ("/api/stacks", "POST"),
                                         ("/nowhere", "GET")])
def test_every_path_needs_the_token(page, path, method):
    code, body = request(page, path, method)
    assert code == 401 and b"token" in body and b"ranks" not in body
    code, body = request(page, path, method, token="not-" + page.token)
    assert code == 403 and b"ranks" not in body
    code, _ = request(page, path, method, token=page.token[:-1])         # a prefix is no token either
    assert code == 403
    code, body = request(page, path, method, token=True)
    assert code == (404 if path == "/nowhere" else 200)


def test_the_page_is_served_with_its_token_and_headers(page):
    with urllib.request.urlopen(page.url, timeout=10) as reply:
        body = reply.read().decode()
        headers = reply.headers
    assert page.url.startswith("http://127.0.0.1:") and "?token=" in page.url
    assert len(page.token) >= 32
    assert '<table id="ranks">' in body and "/api/status" in body
    nonce = headers["Content-Security-Policy"].split("'nonce-")[1].split("'")[0]
    assert f'<script nonce="{nonce}">' in body
    assert headers["Cache-Control"] == "no-store" and headers["Referrer-Policy"] == "no-referrer"
    assert request(page, "/api/status", "POST", token=True)[0] == 405


def test_status_lists_every_rank_with_the_fields_a_script_reads(page, store):
    put_beat(store, 0, beat(100.0, done=10, running="ALLREDUCE of tensor 'x'", running_s=0.5, waiting_for=1,
                            waiting_s=2.5))
    code, body = request(page, "/api/status", token=True)
    assert code == 200
    data = json.loads(body)
    assert {"job", "ranks", "reports", "time"} <= set(data)
    assert data["job"]["size"] == 2 and data["job"]["elastic"] is None and data["job"]["start_time"] > 0
    ranks = data["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for entry in ranks:
        assert RANK_FIELDS <= set(entry), entry
    zero, one = ranks
    assert zero["host"] == "h" and zero["pid"] == 4242 and zero["last_completed_seq"] == 10
    assert zero["last_collective"] == "ALLREDUCE of tensor 'x'" and zero["waiting_for"] == 1
    assert zero["state"] == "waiting" and "waiting" in zero["state_text"] and "rank 1" in zero["state_text"]
    assert zero["waited_s"] >= 2.5 and zero["heartbeat_age_s"] < rec.STALE_SECONDS
    assert zero["collectives_per_s"] is None            # one beat: no rate yet
    # No heartbeat yet: the host of the plan, and a state that says so.
    assert one["host"] == "b" and one["pid"] is None and one["state"] == "starting"


def test_rates_come_from_the_last_two_beats(store):
    job = monitor.JobStatus(store, monitor.static_view(["a"]))
    job.watch()
    put_beat(store, 0, beat(10.0, done=100, nbytes=4_000_000))
    put_beat(store, 0, beat(12.0, done=300, nbytes=12_000_000))
    entry = job.snapshot()["ranks"][0]
    assert entry["collectives_per_s"] == 100.0 and entry["bytes_per_s"] == 4_000_000.0
    assert entry["state"] == "running" and entry["last_completed_seq"] == 300
    put_beat(store, 0, beat(13.0, done=300, nbytes=12_000_000))        # nothing completed since: 0, not stale
    assert job.snapshot()["ranks"][0]["collectives_per_s"] == 0.0


def test_a_wait_grows_with_the_beats_age_only_while_nothing_completes(store, monkeypatch):
    """A beat that caught one of many short collectives says nothing about now; two beats without progress do."""
    job = monitor.JobStatus(store, monitor.static_view(["a"]))
    job.watch()
    busy = {"running": "ALLREDUCE of tensor 'x'", "running_s": 0.0, "waiting_for": 1, "waiting_s": 0.0}
    put_beat(store, 0, beat(10.0, done=100, **busy))
    put_beat(store, 0, beat(11.0, done=900, **busy))
    later = time.monotonic() + 2.0                  # the last beat is 2 s old (not stale yet)
    monkeypatch.setattr(status_module.time, "monotonic", lambda: later)
    entry = job.snapshot()["ranks"][0]
    assert entry["waited_s"] == 0.0 and entry["running_s"] == 0.0 and entry["state"] == "in collective", entry
    put_beat(store, 0, beat(12.0, done=900, **{**busy, "running_s": 1.0, "waiting_s": 1.0}))
    later = time.monotonic() + 2.0
    entry = job.snapshot()["ranks"][0]
    assert entry["waited_s"] >= 2.9 and entry["state"] == "waiting", entry


def test_a_rank_whose_submitted_collective_completes_nowhere_is_shown_negotiating(store):
    """Rank 0 submitted #101 and runs nothing: while its beats show progress it is in its own code; once two beats
    show none, the coordinator is waiting for a rank that has not submitted it (a peer stopped between two
    collectives), and the page says so instead of "running"."""
    job = monitor.JobStatus(store, monitor.static_view(["a"]))
    job.watch()
    put_beat(store, 0, beat(10.0, done=50))
    put_beat(store, 0, beat(11.0, done=100))
    assert job.snapshot()["ranks"][0]["state"] == "running"
    put_beat(store, 0, beat(12.0, done=100))
    entry = job.snapshot()["ranks"][0]
    assert entry["state"] == "negotiating" and entry["submitted_seq"] == 101, entry
    assert entry["state_text"].startswith("negotiating collective #101: submitted, not yet submitted by every rank")
    put_beat(store, 0, {**beat(13.0, done=100), rec.SUBMITTED: 100})     # all it submitted is done: idle
    assert job.snapshot()["ranks"][0]["state"] == "running"


def test_rank_0_names_the_ranks_that_have_not_submitted_its_pending_tensor(store):
    job = monitor.JobStatus(store, monitor.static_view(["a", "b", "c"]))
    job.watch()
    pending = {rec.NEGOTIATING: "allreduce.grad", rec.NEGOTIATING_S: 0.4, rec.MISSING: [1, 2]}
    put_beat(store, 0, beat(10.0, done=7, **pending))
    entry = job.snapshot()["ranks"][0]
    assert entry["state"] == "running" and entry["missing_ranks"] == [1, 2], entry      # under a second: not yet
    put_beat(store, 0, beat(11.0, done=7, **{**pending, rec.NEGOTIATING_S: 1.4}))
    entry = job.snapshot()["ranks"][0]
    assert entry["state"] == "negotiating" and entry["negotiating"] == "allreduce.grad", entry
    assert entry["state_text"] == "negotiating 1.4 s: tensor 'allreduce.grad' waits for ranks 1, 2 to submit it"


class FakeCoordinator:
    def __init__(self, pending, joined=(), fail=False):
        self.pending, self._joined, self.fail = pending, set(joined), fail

    def pending_names(self):
        if self.fail:
            raise RuntimeError("dictionary changed size during iteration")
        return self.pending

    @property
    def joined(self):
        return self._joined


class FakeEngine:
    running = None
    thread_ident = -1

    def __init__(self, coordinator, ranks):
        self.coordinator, self.ranks, self.size = coordinator, ranks, len(ranks)


def test_the_heartbeat_carries_the_coordinators_oldest_pending_tensor_in_global_ranks():
    now = time.monotonic()
    # A process set of global ranks 2, 5, 7 and 9: positions 0 and 2 submitted 'b' (the oldest), 3 joined.
    coordinator = FakeCoordinator([("a", now - 1.0, [0]), ("b", now - 3.0, [0, 2])], joined={3})
    status = heartbeat._engine_status([FakeEngine(None, [0, 1]), FakeEngine(coordinator, [2, 5, 7, 9])])
    assert status[rec.NEGOTIATING] == "b" and status[rec.MISSING] == [5], status
    assert 2.9 < status[rec.NEGOTIATING_S] < 10, status
    assert heartbeat._engine_status([FakeEngine(FakeCoordinator([]), [0, 1])]) == {}
    assert heartbeat._engine_status([FakeEngine(FakeCoordinator([], fail=True), [0, 1])]) == {}


def test_a_silent_rank_is_shown_not_answering_with_no_rate(store, monkeypatch):
    job = monitor.JobStatus(store, monitor.static_view(["a", "b"]))
    job.watch()
    put_beat(store, 1, beat(10.0, done=5, running="ALLREDUCE of tensor 'y'", running_s=0.1))
    put_beat(store, 1, beat(11.0, done=9, running="ALLREDUCE of tensor 'y'", running_s=0.1))
    later = time.monotonic() + 7.0
    monkeypatch.setattr(status_module.time, "monotonic", lambda: later)
    entry = job.snapshot()["ranks"][1]
    assert entry["state"] == "not answering" and "no heartbeat for 7" in entry["state_text"], entry
    assert entry["collectives_per_s"] is None and entry["heartbeat_age_s"] >= 7.0
    assert entry["last_completed_seq"] == 9 and entry["last_collective"] == "ALLREDUCE of tensor 'y'"


def test_a_stopped_local_rank_is_named_stopped(monkeypatch, store):
    monkeypatch.setattr(status_module, "_proc_state", lambda host, pid: "stopped (SIGSTOP, or a debugger holds it)")
    job = monitor.JobStatus(store, monitor.static_view(["a"]))
    put_beat(store, 0, beat(time.time() - 9.0))       # no watcher: the age comes from the beat's own clock
    entry = job.snapshot()["ranks"][0]
    assert entry["state"] == "stopped" and "SIGSTOP" in entry["state_text"] and entry["heartbeat_age_s"] >= 9.0


def test_reports_and_elastic_rounds(store):
    view = {"size": 1, "hosts": ["h1"], "elastic": {"round": 2, "reforming": False, "resets": 2, "min_np": 1,
                                                    "max_np": None,
                                                    "members": [{"rank": 0, "host": "h1", "slot": "h1[0]"}]}}
    job = monitor.JobStatus(store, lambda: view)
    now = time.time()
    store.put(rec.REPORT_SCOPE, "0", wire.pack({rec.T: now - 5, rec.KIND: "data-plane stall", rec.TEXT: "older",
                                                rec.RANK: 0}))
    store.put(rec.REPORT_SCOPE, "3", wire.pack({rec.T: now - 1, rec.KIND: "deadlock", rec.TEXT: "newer",
                                                rec.RANK: 3}))
    data = job.snapshot()
    assert data["job"]["elastic"]["round"] == 2 and data["job"]["elastic"]["members"][0]["slot"] == "h1[0]"
    assert [(r["rank"], r["kind"], r["text"]) for r in data["reports"]] == [(3, "deadlock", "newer"),
                                                                            (0, "data-plane stall", "older")]
    assert 4.0 <= data["reports"][1]["age_s"] < 30


def test_elastic_driver_view_follows_its_rounds():
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.elastic.discovery import FixedHosts
    from horovod.runner.elastic.driver import ElasticDriver

    class Rendezvous:
        store = KVStoreServer(b"k" * 32, host="127.0.0.1")

    driver = ElasticDriver(Rendezvous(), FixedHosts({"a": 1, "b": 1}), 2)
    assert driver.monitor_view() == {"size": 0, "hosts": [], "elastic": None}
    driver._round = 1
    driver._assignment = {"b[0]": SlotInfo("b", 1, 0, 1, 2, 1, 2), "a[0]": SlotInfo("a", 0, 0, 0, 2, 1, 2)}
    driver._publish_view()
    view = driver.monitor_view()
    assert view["size"] == 2 and view["hosts"] == ["a", "b"]
    assert view["elastic"]["round"] == 1 and not view["elastic"]["reforming"]
    assert [m["slot"] for m in view["elastic"]["members"]] == ["a[0]", "b[0]"]
    worker = SimpleNamespace(spec=SimpleNamespace(local=True), proc=SimpleNamespace(pid=4242))
    remote = SimpleNamespace(spec=SimpleNamespace(local=False), proc=SimpleNamespace(pid=4343))    # ssh's pid
    driver._workers = {"b[0]": worker, "a[0]": remote, "c[0]": worker}     # c[0]: not in this round
    assert driver.monitor_view()["local_pids"] == {1: 4242}


def answer_stacks(store, ranks, stop):
    """A stand-in for the ranks' heartbeat threads: answer each stack request of ``ranks``."""
    def run():
        while not stop.is_set():
            for rank in ranks:
                asked = store.get(rec.ASK_SCOPE, str(rank))
                if asked:
                    store.delete(rec.ASK_SCOPE, str(rank))
                    store.put(rec.STACK_SCOPE, rec.stack_key(rank, asked.decode()), f"stack of {rank}".encode())
            time.sleep(0.01)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_stacks_are_asked_of_every_rank_and_say_why_one_did_not_come(store):
    job = monitor.JobStatus(store, monitor.static_view(["a", "b"]))
    stop = threading.Event()
    answer_stacks(store, [0], stop)
    try:
        started = time.monotonic()
        stacks = job.stacks(timeout=0.5)["stacks"]
        assert time.monotonic() - started < 3.0
    finally:
        stop.set()
    assert stacks[0]["answered"] and stacks[0]["text"] == rec.stack_text(0, "stack of 0", 0.5)
    assert not stacks[1]["answered"]
    assert stacks[1]["text"] == ("No Python stack from rank 1 within 0.5 s: its heartbeat thread did not answer "
                                 "(stopped, native code holding the GIL, or its host is gone).")
    # Nothing is left behind: no unanswered request, no answer.
    assert store.items(rec.ASK_SCOPE) == {} and store.items(rec.STACK_SCOPE) == {}


def test_the_stack_button_posts_and_gets_every_stack(page, store):
    stop = threading.Event()
    answer_stacks(store, [0, 1], stop)
    try:
        code, body = request(page, "/api/stacks", "POST", token=True)
    finally:
        stop.set()
    assert code == 200
    stacks = json.loads(body)["stacks"]
    assert [(s["rank"], s["answered"]) for s in stacks] == [(0, True), (1, True)]
    assert "Rank 1's Python stack" in stacks[1]["text"] and "stack of 1" in stacks[1]["text"]


def test_serving_starts_only_with_a_port_and_stops_after(store):
    class Settings:
        monitor_port, monitor_address = None, "127.0.0.1"

    with monitor.serving(Settings(), store, monitor.static_view(["a"])) as none:
        assert none is None
    Settings.monitor_port = 0
    with monitor.serving(Settings(), store, monitor.static_view(["a"])) as served:
        port = served.port
        assert request(served, "/api/status", token=True)[0] == 200
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)


def test_flags_and_knob(monkeypatch):
    args = launch.parse_args(["-np", "2", "--monitor-port", "0", "--monitor-address", "0.0.0.0", "cmd"])
    assert args.monitor_port == 0 and args.monitor_address == "0.0.0.0"
    args.hosts, args.nics = "localhost:2", None
    settings = launch._static_settings(args)
    assert settings.monitor_port == 0 and settings.monitor_address == "0.0.0.0"
    monkeypatch.setenv("HOROVOD_MONITOR_PORT", "8123")
    assert launch._monitor_port(launch.parse_args(["-np", "2", "cmd"])) == 8123
    assert launch._monitor_port(args) == 0                                  # the flag wins
    monkeypatch.delenv("HOROVOD_MONITOR_PORT")
    assert launch._monitor_port(launch.parse_args(["-np", "2", "cmd"])) is None
    with pytest.raises(SystemExit):
        launch.parse_args(["-np", "2", "--monitor-port", "70000", "cmd"])


def test_under_mpi_the_launcher_says_there_is_no_page(monkeypatch, caplog):
    from horovod.runner import mpi_run

    monkeypatch.setattr(mpi_run, "mpi_run", lambda *a, **k: None)
    args = launch.parse_args(["-np", "2", "--mpi", "--monitor-port", "0", "cmd"])
    launch._configure_logging(False)
    launch._run(args)
    lines = [r.getMessage() for r in caplog.records if "live page" in r.getMessage()]
    assert len(lines) == 1 and "under --mpi" in lines[0], lines


# ---------------------------------------------------------------------------------------------- the ranks' side
class Entry:
    def __init__(self, nbytes):
        self.tensor = type("T", (), {"nbytes": nbytes})()
        self.request = ["t", 0]
        self.flight = None


def test_a_beat_carries_running_totals_from_the_flight_rings(monkeypatch):
    monkeypatch.setattr(flight, "_rings", {})
    ring = flight.FlightRing(100, 0, [0, 1], 0, lambda rtype, nbytes: "shm")
    totals = heartbeat.Totals()
    assert totals.update() == {rec.SUBMITTED: 0, rec.LAST_DONE: 0, rec.DONE: 0, rec.DONE_BYTES: 0}
    entries = [Entry(1000) for _ in range(5)]
    ring.submit(entries, 1.0)
    flight.done(entries[:2], 2.0)
    flight.failed(entries[2:3], 2.0, "lost")
    assert totals.update() == {rec.SUBMITTED: 5, rec.LAST_DONE: 2, rec.DONE: 2, rec.DONE_BYTES: 2000}
    flight.done(entries[4:], 3.0)               # out of order: #4 is still in flight
    assert totals.update()[rec.LAST_DONE] == 5
    flight.done(entries[3:4], 4.0)
    more = [Entry(10) for _ in range(3)]
    ring.submit(more, 5.0)
    flight.done(more, 5.0)
    status = totals.update()
    assert status == {rec.SUBMITTED: 8, rec.LAST_DONE: 8, rec.DONE: 7, rec.DONE_BYTES: 4030}
    assert totals.update() == status            # nothing new: nothing counted twice


def test_without_a_flight_recorder_the_beat_has_no_totals(monkeypatch):
    monkeypatch.setattr(flight, "_rings", {})
    assert heartbeat.Totals().update() == {}


def test_a_report_is_published_at_the_next_beat_and_never_raises():
    class Client:
        def __init__(self):
            self.puts = []

        def put(self, scope, key, value):
            self.puts.append((scope, key, wire.unpack(value)))

    client = Client()
    heartbeat._report.clear()           # what other tests' reports left
    heartbeat._put_report(client, "3")
    assert client.puts == []
    heartbeat.publish_report("stall", "first")
    heartbeat.publish_report("data-plane stall", "x" * (rec.REPORT_MAX_CHARS + 10))     # the latest wins
    heartbeat._put_report(client, "3")
    heartbeat._put_report(client, "3")                                                  # once
    assert len(client.puts) == 1
    scope, key, record = client.puts[0]
    assert (scope, key, record[rec.KIND], record[rec.RANK]) == (rec.REPORT_SCOPE, "3", "data-plane stall", 3)
    assert len(record[rec.TEXT]) == rec.REPORT_MAX_CHARS
    heartbeat.publish_report(object(), object())            # anything: kept as text, no exception
    heartbeat._report.clear()


def test_a_local_rank_without_a_heartbeat_is_named_stopped_or_exited_from_its_process(store):
    pids = {}
    job = monitor.JobStatus(store, monitor.static_view(["a", "b", "c"], pids))
    assert [r["state"] for r in job.snapshot()["ranks"]] == ["starting"] * 3       # nothing started yet
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopped = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)'; true"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(stopped.pid).children() and time.monotonic() < deadline:
            time.sleep(0.02)
        child = psutil.Process(stopped.pid).children()[0]
        child.suspend()                         # the program under the shell the launcher started: SIGSTOP
        while child.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.01)                    # the signal takes effect when the child is next scheduled
        pids.update({0: running.pid, 1: stopped.pid, 2: gone.pid + 10**7})   # rank 2's pid no longer exists
        ranks = job.snapshot()["ranks"]
        assert ranks[0]["state"] == "starting" and ranks[0]["pid"] == running.pid, ranks[0]
        assert ranks[1]["state"] == "stopped" and "SIGSTOP" in ranks[1]["state_text"], ranks[1]
        assert ranks[1]["state_text"].startswith("no heartbeat yet"), ranks[1]
        assert ranks[2]["state"] == "exited", ranks[2]
        put_beat(store, 1, beat(time.time()))   # a beat wins over the process's state
        assert job.snapshot()["ranks"][1]["state"] != "stopped"
    finally:
        for proc in (running, stopped):
            for p in psutil.Process(proc.pid).children(recursive=True):
                p.kill()
            proc.kill()
            proc.wait()
