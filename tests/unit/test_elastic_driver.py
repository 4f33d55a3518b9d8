"""The elastic driver's decisions, with stand-in workers that talk to its real rendezvous store: a worker that never
reports is stopped instead of hanging the job, stale processes are told to exit, notices only go out when the
assignment changes, and the registry's end-of-round decisions follow upstream."""
import queue
import threading
import time
from types import SimpleNamespace

import pytest

from horovod.common import wire
from horovod.common.elastic import HostUpdateResult
from horovod.common.elastic_rendezvous import ASSIGN_SCOPE, NOTIFY_SCOPE, READY_SCOPE
from horovod.runner.elastic import driver as driver_module
from horovod.runner.elastic.discovery import FixedHosts, HostManager
from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.elastic.registration import FAILURE, READY, SUCCESS, Decision, WorkerStateRegistry
from horovod.runner.process import WorkerExit
from horovod.runner.rendezvous import RendezvousServer


class FakeWorker:
    """What the driver sees of a worker process; the test says when it asks for a round or exits."""

    def __init__(self, info, events: queue.SimpleQueue, worker_id: str, store) -> None:
        self.info, self.events, self.id, self.store = info, events, worker_id, store
        self.slot = f"{info.hostname}:{info.local_rank}"
        self.proc = SimpleNamespace(returncode=None, pid=0, poll=lambda: self.proc.returncode,
                                    wait=lambda timeout=None: self.proc.returncode)
        self.spec = SimpleNamespace(rank=info.rank)
        self.nonces = 0

    def ask(self, after: int, worker_id=None) -> str:
        self.nonces += 1
        nonce = f"{self.id}.{self.nonces}"
        request = {"after": after, "nonce": nonce, "worker": worker_id or self.id}
        self.store.put(READY_SCOPE, self.slot, wire.pack(request))
        return f"{self.slot}/{nonce}"

    def answer(self, key: str, timeout: float = 10.0) -> dict:
        ok, values = self.store.wait(ASSIGN_SCOPE, [key], timeout)
        assert ok, f"no answer for {key}"
        return wire.unpack(values[0])

    def exit(self, code: int) -> None:
        self.proc.returncode = code
        self.events.put(("exit", self))

    def signal_group(self, signum: int) -> bool:
        if self.proc.returncode is None:
            self.exit(-signum)
        return True

    def join_output(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        pass

    def exit_info(self) -> WorkerExit:
        return WorkerExit(self.info.rank, self.info.hostname, self.proc.returncode, "fake", [])


class Job:
    """A driver running in a thread over a FixedHosts discovery, with its fake workers."""

    def __init__(self, hosts, min_np: int, max_np=None, num_proc=None) -> None:
        self.rendezvous = RendezvousServer()
        self.rendezvous.start(host="127.0.0.1")
        self.discovery = FixedHosts(dict(hosts))
        self.driver = ElasticDriver(self.rendezvous, self.discovery, min_np, max_np, timeout=5)
        self.workers = []
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(num_proc or min_np,), daemon=True)
        self.thread.start()

    def _create(self, info, events, worker_id):
        worker = FakeWorker(info, events, worker_id, self.rendezvous.store)
        self.workers.append(worker)
        return worker

    def _run(self, num_proc) -> None:
        try:
            self.result = self.driver.run(num_proc, self._create)
        except BaseException as exc:  # the test inspects it
            self.error = exc

    def wait_workers(self, count: int) -> list:
        deadline = time.monotonic() + 10
        while len(self.workers) < count:
            assert time.monotonic() < deadline, f"only {len(self.workers)} workers started"
            time.sleep(0.01)
        return self.workers

    def join(self):
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "the driver did not finish"
        self.rendezvous.stop(wait=True)


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(driver_module, "RESET_SETTLE_SECS", 0.3)
    monkeypatch.setattr(driver_module, "DISCOVER_HOSTS_FREQUENCY_SECS", 0.05)
    monkeypatch.setattr(driver_module, "GRACE_SECONDS", 0.1)


def test_a_worker_that_never_reports_is_stopped_and_its_host_blacklisted(fast):
    job = Job({"a": 1, "b": 1, "c": 1}, min_np=2, num_proc=3)
    a, b, c = job.wait_workers(3)
    assert [w.answer(w.ask(-1))["size"] for w in (a, b, c)] == [3, 3, 3]
    key_a, key_b = a.ask(0), b.ask(0)               # a and b left round 0; c hangs without a word
    new_a, new_b = a.answer(key_a), b.answer(key_b)
    assert (new_a["round"], new_a["rank"], new_a["size"]) == (1, 0, 2)
    assert (new_b["round"], new_b["rank"], new_b["size"]) == (1, 1, 2)
    assert c.proc.returncode is not None, "the silent worker must have been stopped"
    a.exit(0)
    b.exit(0)
    job.join()
    assert job.error is None and [s.hostname for s in job.result] == ["a", "b"]
    assert job.driver.reset_count == 1


def test_a_stale_process_on_a_slot_is_told_to_exit(fast):
    job = Job({"a": 1, "b": 1}, min_np=2)
    a, b = job.wait_workers(2)
    assert "exit" in a.answer(a.ask(-1, worker_id="a:0#stale"))
    assert a.answer(a.ask(-1))["rank"] == 0 and b.answer(b.ask(-1))["rank"] == 1
    a.exit(0)
    b.exit(0)
    job.join()
    assert job.error is None


def test_hosts_are_announced_only_when_the_assignment_changes(fast):
    job = Job({"a": 1, "b": 1}, min_np=1, max_np=2, num_proc=2)
    a, b = job.wait_workers(2)
    store = job.rendezvous.store
    job.discovery.set({"a": 1, "b": 1, "c": 1})     # max_np is reached: c would get no rank
    time.sleep(0.5)
    assert store.items(NOTIFY_SCOPE) == {}
    job.discovery.set({"a": 1})                     # b goes: rank 1 disappears
    deadline = time.monotonic() + 5
    while not store.items(NOTIFY_SCOPE):
        assert time.monotonic() < deadline, "no notice after a host was removed"
        time.sleep(0.02)
    timestamp, update = wire.unpack(store.get(NOTIFY_SCOPE, "0"))
    assert HostUpdateResult(update) == HostUpdateResult.removed and timestamp > 0
    a.exit(0)
    b.exit(0)
    job.join()


def test_a_failure_while_others_finished_fails_the_job(fast):
    job = Job({"a": 1, "b": 1}, min_np=2)
    a, b = job.wait_workers(2)
    a.exit(0)
    b.exit(3)
    job.join()
    assert job.error is not None and "exited with non-zero status" in str(job.error)
    assert job.error.failure.hostname == "b" and job.error.failure.returncode == 3


def _registry(reset_limit=None):
    manager = HostManager(FixedHosts({"a": 1, "b": 1}))
    manager.update_available_hosts()
    registry = WorkerStateRegistry(manager, reset_limit)
    registry.reset({"a:0": "a", "b:0": "b"})
    return manager, registry


@pytest.mark.parametrize("states,decision", [
    ({"a:0": SUCCESS, "b:0": READY}, Decision.FINISH),
    ({"a:0": FAILURE, "b:0": FAILURE}, Decision.FAIL),
    ({"a:0": FAILURE, "b:0": READY}, Decision.RESET),
    ({"a:0": READY, "b:0": READY}, Decision.RESET),
])
def test_registry_decisions_follow_upstream(states, decision):
    manager, registry = _registry()
    for slot, state in states.items():
        registry.record(slot, state)
    assert registry.all_recorded() and registry.decide() is decision
    assert manager.is_blacklisted("a") is (states["a:0"] == FAILURE and decision is Decision.RESET)


def test_registry_reset_limit_and_failure_overriding_ready():
    _, registry = _registry(reset_limit=1)
    registry.record("a:0", READY)
    assert registry.unrecorded() == ["b:0"]
    registry.record("a:0", FAILURE)                 # it died while it waited: the failure counts
    registry.record("b:0", READY)
    registry.record("b:0", SUCCESS)                 # a later state other than failure does not override
    assert registry.get(FAILURE) == ["a:0"] and registry.state("b:0") == READY
    assert registry.decide() is Decision.RESET and registry.reset_count == 1
    registry.reset({"b:0": "b"})
    registry.record("b:0", READY)
    assert registry.decide() is Decision.RESET_LIMIT
    assert registry.reset_limit_message() == ("Horovod was shutdown because number of resets during elastic job "
                                              "exceeded limit: 1")


def test_a_worker_gets_the_notices_of_its_round_even_those_sent_before_it_polled(monkeypatch):
    from horovod.common import elastic_rendezvous
    from horovod.common.kvstore import KVStoreClient

    server = RendezvousServer()
    server.start(host="127.0.0.1")
    try:
        elastic_rendezvous.publish_notice(server.store, int(HostUpdateResult.removed), 1.0)   # an older round's
        monkeypatch.setitem(elastic_rendezvous._joined, "notices_from", 1)
        elastic_rendezvous.publish_notice(server.store, int(HostUpdateResult.added), 2.0)     # before it polled
        got = queue.SimpleQueue()
        poller = elastic_rendezvous.NotificationPoller(KVStoreClient("127.0.0.1", server.port, server.key),
                                                       lambda t, u: got.put((t, u)))
        elastic_rendezvous.publish_notice(server.store, int(HostUpdateResult.mixed), 3.0)
        assert got.get(timeout=5) == (2.0, int(HostUpdateResult.added))
        assert got.get(timeout=5) == (3.0, int(HostUpdateResult.mixed))
        poller.stop()
    finally:
        server.stop(wait=True)


def test_registry_stops_when_every_host_of_the_round_is_blacklisted(caplog):
    """Upstream's test_all_hosts_blacklisted at the decision: a worker ready on a host that another (failed)
    worker's failure blacklisted leaves no host to re-form on (the TF2 job of this scenario ran 12 s; the decision
    is the driver's alone, whatever the framework)."""
    manager = HostManager(FixedHosts({"a": 2, "b": 1}))
    manager.update_available_hosts()
    registry = WorkerStateRegistry(manager, None)
    registry.reset({"a:0": "a", "a:1": "a", "b:0": "b"})
    for slot, state in {"a:0": FAILURE, "a:1": READY, "b:0": FAILURE}.items():
        registry.record(slot, state)
    with caplog.at_level("ERROR"):
        assert registry.decide() is Decision.FAIL
    assert manager.is_blacklisted("a") and manager.is_blacklisted("b")
    assert "blacklisted slots count == 3 -> stop running" in caplog.text
