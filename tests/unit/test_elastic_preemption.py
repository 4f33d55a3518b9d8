"""Spot preemption in an elastic job: a worker that gets SIGTERM from outside leaves, and the driver records it as
LEFT (no failure, no blacklisting), keeps its slot out while its host is listed, and re-forms with the others.

The driver runs over fake workers that talk to its real store (tests/unit/test_elastic_driver.py); the worker's
side (its SIGTERM handler, and leaving at a commit) runs in a child process or with a fake broadcast.
"""
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from horovod.common import elastic as elastic_module
from horovod.common import wire
from horovod.common.elastic import HostUpdateResult, ObjectState, Preemption, run_fn
from horovod.common.elastic_rendezvous import (
    LEAVE_SCOPE,
    NOTIFY_SCOPE,
    STOP_SCOPE,
    WORKER_ID_ENV,
    announce_leaving,
    mark_stopping,
)
from horovod.common.exceptions import HostsUpdatedInterrupt
from horovod.common.kvstore import KVStoreClient
from horovod.runner.elastic import driver as driver_module
from horovod.runner.elastic.discovery import DiscoveredHosts, FixedHosts, HostManager
from horovod.runner.elastic.preemption import LeftSlots
from horovod.runner.elastic.registration import FAILURE, LEFT, READY, SUCCESS, Decision, WorkerStateRegistry
from horovod.runner.rendezvous import RendezvousServer
from tests.unit.test_elastic_driver import Job

PREEMPTED = "rank {rank} on host {host} was preempted (SIGTERM) and left the job; continuing with {n} worker"


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(driver_module, "RESET_SETTLE_SECS", 0.3)
    monkeypatch.setattr(driver_module, "DISCOVER_HOSTS_FREQUENCY_SECS", 0.05)
    monkeypatch.setattr(driver_module, "GRACE_SECONDS", 0.1)


@pytest.fixture
def driver_log(caplog, monkeypatch):
    """The driver's records, even after an init in this process made the ``horovod`` logger stop propagating."""
    monkeypatch.setattr(logging.getLogger("horovod"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="horovod.elastic"):
        yield caplog


def _preempt(job, worker) -> None:
    """What a worker's SIGTERM handler says to the driver."""
    job.rendezvous.store.put(LEAVE_SCOPE, worker.id, wire.pack({"signal": "SIGTERM"}))


def _wait_for(what, condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_preempted_rank_0_leaves_without_a_failure_and_the_others_reform(fast, driver_log):
    job = Job({"a": 2, "b": 1}, min_np=2, num_proc=3)
    a0, a1, b0 = job.wait_workers(3)
    assert [w.answer(w.ask(-1))["rank"] for w in (a0, a1, b0)] == [0, 1, 2]
    store = job.rendezvous.store
    _preempt(job, a0)
    _wait_for("the notice that makes every rank re-form at its next commit", lambda: store.items(NOTIFY_SCOPE))
    assert HostUpdateResult(wire.unpack(store.get(NOTIFY_SCOPE, "0"))[1]) == HostUpdateResult.removed
    key_a1, key_b0 = a1.ask(0), b0.ask(0)           # the survivors re-form at the commit ...
    a0.exit(0)                                      # ... where the preempted worker exits with status 0
    new_a1, new_b0 = a1.answer(key_a1), b0.answer(key_b0)
    # a:1 is now rank 0 and local rank 0 of 1 on host a (its slot key stays a:1); no worker replaces a:0.
    assert (new_a1["round"], new_a1["rank"], new_a1["size"], new_a1["local_rank"], new_a1["local_size"]) == \
        (1, 0, 2, 0, 1)
    assert (new_b0["rank"], new_b0["size"]) == (1, 2)
    assert len(job.workers) == 3
    a1.exit(0)
    b0.exit(0)
    job.join()
    assert job.error is None and [(s.hostname, s.rank) for s in job.result] == [("a", 0), ("b", 1)]
    assert not job.driver._host_manager.is_blacklisted("a") and job.driver.reset_count == 1
    text = driver_log.text
    assert PREEMPTED.format(rank=0, host="a", n=2) + "s" in text
    assert "failed" not in text and "blacklist" not in text


def test_a_preempted_worker_waiting_for_a_round_is_told_to_exit(fast, driver_log):
    job = Job({"a": 1, "b": 1, "c": 1}, min_np=2, num_proc=3)
    a, b, c = job.wait_workers(3)
    for w in (a, b, c):
        w.answer(w.ask(-1))
    key_b = b.ask(0)                                # b's collective failed: it waits for the next round
    _preempt(job, b)                                # ... and then gets SIGTERM
    assert "preempted" in b.answer(key_b)["exit"]
    b.exit(0)
    key_a, key_c = a.ask(0), c.ask(0)
    assert (a.answer(key_a)["size"], c.answer(key_c)["rank"]) == (2, 1)
    a.exit(0)
    c.exit(0)
    job.join()
    assert job.error is None and not job.driver._host_manager.is_blacklisted("b")
    assert PREEMPTED.format(rank=1, host="b", n=2) + "s" in driver_log.text


def test_the_slot_stays_out_until_its_host_leaves_the_discovery_then_it_rejoins(fast, driver_log):
    job = Job({"a": 1, "b": 1}, min_np=1, max_np=2, num_proc=2)
    a, b = job.wait_workers(2)
    a.answer(a.ask(-1))
    b.answer(b.ask(-1))
    _preempt(job, b)
    key_a = a.ask(0)
    b.exit(0)
    assert a.answer(key_a)["size"] == 1
    time.sleep(0.3)                                 # discovery polls every 0.05 s: b is still listed, and out
    assert len(job.workers) == 2
    job.discovery.set({"a": 1})                     # b's instance is gone ...
    _wait_for("the driver to forget b's slot", lambda: "no longer listed by the discovery" in driver_log.text)
    job.discovery.set({"a": 1, "b": 1})             # ... and a new one comes up under the same name
    store = job.rendezvous.store
    _wait_for("a notice for the returning host", lambda: len(store.items(NOTIFY_SCOPE)) == 2)
    key_a = a.ask(1)
    _wait_for("a new worker on b", lambda: len(job.workers) == 3)
    new_b = job.workers[2]
    assert a.answer(key_a)["size"] == 2 and new_b.answer(new_b.ask(-1))["rank"] == 1
    a.exit(0)
    new_b.exit(0)
    job.join()
    assert job.error is None and [s.hostname for s in job.result] == ["a", "b"]
    assert PREEMPTED.format(rank=1, host="b", n=1) + "\n" in driver_log.text
    assert "blacklist" not in driver_log.text


def test_a_departure_from_a_process_the_driver_does_not_run_is_ignored(fast):
    job = Job({"a": 1, "b": 1}, min_np=2)
    a, b = job.wait_workers(2)
    a.answer(a.ask(-1))
    b.answer(b.ask(-1))
    job.rendezvous.store.put(LEAVE_SCOPE, "b:0#stale", wire.pack({"signal": "SIGTERM"}))
    time.sleep(0.3)
    assert job.rendezvous.store.items(NOTIFY_SCOPE) == {}
    a.exit(0)
    b.exit(0)
    job.join()
    assert job.error is None


def test_when_every_worker_left_the_job_ends_saying_why(fast):
    job = Job({"a": 1, "b": 1}, min_np=1, num_proc=2)
    a, b = job.wait_workers(2)
    a.answer(a.ask(-1))
    b.answer(b.ask(-1))
    _preempt(job, a)
    _preempt(job, b)
    time.sleep(0.2)
    a.exit(0)
    b.exit(0)
    job.join()
    assert isinstance(job.error, RuntimeError) and "Every worker of round 0 was preempted" in str(job.error)


def test_the_driver_announces_its_own_stops_before_it_signals(fast):
    job = Job({"a": 1, "b": 1, "c": 1}, min_np=2, num_proc=3)
    a, b, c = job.wait_workers(3)
    for w in (a, b, c):
        w.answer(w.ask(-1))
    store = job.rendezvous.store
    key_a, key_b = a.ask(0), b.ask(0)               # c never reports: the driver stops it itself
    a.answer(key_a)
    b.answer(key_b)
    assert store.get(STOP_SCOPE, c.id) is not None and store.get(STOP_SCOPE, "*") is None
    a.exit(0)
    b.exit(0)
    job.join()
    assert store.get(STOP_SCOPE, "*") is None       # nothing was left to stop at the end


def test_announce_leaving_says_nothing_when_the_driver_stops_the_worker():
    server = RendezvousServer()
    server.start(host="127.0.0.1")
    kv = KVStoreClient("127.0.0.1", server.port, server.key)
    try:
        assert announce_leaving(kv, "a:0#1")
        assert wire.unpack(server.store.get(LEAVE_SCOPE, "a:0#1")) == {"signal": "SIGTERM"}
        mark_stopping(server.store, ["a:0#2"])
        assert not announce_leaving(kv, "a:0#2") and announce_leaving(kv, "a:0#3")
        mark_stopping(server.store)
        assert not announce_leaving(kv, "a:0#4") and server.store.get(LEAVE_SCOPE, "a:0#4") is None
    finally:
        kv.close()
        server.stop(wait=True)


# ---------------------------------------------------------------------------------------------- bookkeeping


def _registry():
    manager = HostManager(FixedHosts({"a": 1, "b": 1}))
    manager.update_available_hosts()
    registry = WorkerStateRegistry(manager)
    registry.reset({"a:0": "a", "b:0": "b"})
    return manager, registry


@pytest.mark.parametrize("b_state,decision", [
    (READY, Decision.RESET),
    (LEFT, Decision.ALL_LEFT),
    (FAILURE, Decision.FAIL),
    (SUCCESS, Decision.FINISH),
])
def test_registry_a_departure_is_neither_failure_nor_success(b_state, decision):
    manager, registry = _registry()
    registry.record("a:0", READY)
    registry.record("a:0", LEFT)                    # it was preempted while it waited: the departure counts
    registry.record("b:0", b_state)
    assert registry.state("a:0") == LEFT and registry.decide() is decision
    assert not manager.is_blacklisted("a")
    assert manager.is_blacklisted("b") is False     # FAIL and FINISH blacklist nothing either


def test_left_slots_plan_keys_places_by_slot_and_forgets_hosts_that_went_away():
    current = DiscoveredHosts({"a": 3, "b": 1}, ["a", "b"])
    left = LeftSlots()
    left.add("a:1")
    assert "a:1" in left and "a:0" not in left and left.count_usable(current) == 3
    plan = left.plan(current, 2, None)
    assert [(slot, s.rank, s.local_rank, s.local_size, s.size) for slot, s in plan.items()] == [
        ("a:0", 0, 0, 2, 3), ("a:2", 1, 1, 2, 3), ("b:0", 2, 0, 1, 3)]
    assert LeftSlots.slot_index("a:2") == 2
    assert left.forget_missing(["a", "b"]) == [] and left.forget_missing(["b"]) == ["a"]
    assert left.count_usable(current) == 4 and list(left.plan(current, 2, 4)) == ["a:0", "a:1", "a:2", "b:0"]


def test_left_slots_never_plan_below_min_np():
    current = DiscoveredHosts({"a": 2}, ["a"])
    left = LeftSlots()
    left.add("a:0")
    with pytest.raises(ValueError, match="available slots"):
        left.plan(current, 2, None)


# ---------------------------------------------------------------------------------------------- worker side

WORKER = textwrap.dedent("""
    import logging, os, signal, sys, time
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from horovod.common.elastic import preemption
    preemption.install()
    print("INSTALLED", signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
    print("LEAVING", preemption.leaving.is_set(), flush=True)
""")


def _run_worker(server, worker_id, timeout=30):
    env = dict(os.environ, HOROVOD_ELASTIC="1", HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1",
               HOROVOD_GLOO_RENDEZVOUS_PORT=str(server.port), **{WORKER_ID_ENV: worker_id, wire.SECRET_ENV: server.secret})
    return subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, timeout=timeout)


def test_a_sigterm_from_outside_the_driver_is_announced_and_the_worker_stays_to_leave():
    server = RendezvousServer()
    server.start(host="127.0.0.1")
    try:
        result = _run_worker(server, "a:0#1")
        assert result.returncode == 0, result.stderr
        assert "INSTALLED True" in result.stdout and "LEAVING True" in result.stdout, result.stdout + result.stderr
        assert "received SIGTERM (preemption)" in result.stderr
        assert wire.unpack(server.store.get(LEAVE_SCOPE, "a:0#1")) == {"signal": "SIGTERM"}
    finally:
        server.stop(wait=True)


def test_a_sigterm_from_the_driver_still_kills_the_worker_at_once():
    server = RendezvousServer()
    server.start(host="127.0.0.1")
    try:
        mark_stopping(server.store, ["a:0#1"])
        result = _run_worker(server, "a:0#1")
        assert result.returncode == -signal.SIGTERM, result.stdout + result.stderr
        assert "LEAVING" not in result.stdout and server.store.get(LEAVE_SCOPE, "a:0#1") is None
    finally:
        server.stop(wait=True)


TWICE = textwrap.dedent("""
    import os, signal, sys, time
    from horovod.common.elastic import preemption
    preemption.install()
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)        # a duplicate from outside: ignored
    time.sleep(0.3)
    print("STILL", preemption.leaving.is_set(), flush=True)
    sys.stdin.readline()                        # the test marks the driver's stop, then sends SIGTERM
    print("SURVIVED", flush=True)
""")


def test_a_second_sigterm_ends_a_leaving_worker_only_when_the_driver_sends_it():
    server = RendezvousServer()
    server.start(host="127.0.0.1")
    env = dict(os.environ, HOROVOD_ELASTIC="1", HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1",
               HOROVOD_GLOO_RENDEZVOUS_PORT=str(server.port), **{WORKER_ID_ENV: "a:0#1", wire.SECRET_ENV: server.secret})
    proc = subprocess.Popen([sys.executable, "-c", TWICE], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().split() == ["STILL", "True"]
        mark_stopping(server.store, ["a:0#1"])
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == -signal.SIGTERM and "SURVIVED" not in out, out + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop(wait=True)


class _Leaving(Preemption):
    """A worker whose SIGTERM was announced to the driver ``ago`` seconds back."""

    def __init__(self, ago: float = 0.0) -> None:
        super().__init__()
        self._announced_at = time.monotonic() - ago
        self.leaving.set()


def test_a_preempted_worker_leaves_at_a_commit_once_the_job_did_not_reform_in_time(monkeypatch):
    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, step=0)
    monkeypatch.setattr(elastic_module, "preemption", _Leaving())
    state.commit()                                  # the notice may still be on its way: it stays for now
    monkeypatch.setattr(elastic_module, "preemption", _Leaving(ago=elastic_module.PREEMPTION_NOTICE_SECS))
    with pytest.raises(SystemExit) as leaving:
        state.commit()
    assert leaving.value.code == 0


def test_run_leaves_instead_of_reforming_when_preempted(monkeypatch):
    monkeypatch.setattr(elastic_module, "preemption", _Leaving())
    resets = []

    def train(state):
        raise HostsUpdatedInterrupt(True)           # every rank re-forms at this commit: this one leaves

    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, step=0)
    with pytest.raises(SystemExit) as leaving:
        run_fn(train, lambda: resets.append(1))(state)
    assert leaving.value.code == 0 and resets == []
