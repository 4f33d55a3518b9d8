"""HOROVOD_HIERARCHICAL_ALLREDUCE in ``backends.factory.make_backend``'s choice across hosts.

Unset (or 1), a job over several hosts with equal ranks per host gets the hierarchical plane; an explicit 0
(upstream's default value, written out) selects one flat plane over every rank: a tcp ring, or MPI when the job
runs on MPI with threads. On one host the knob changes nothing (upstream: "ignored on a single node"). The other
choices (MPI, forced planes, uneven hosts) are tested in test_mpi_backend.py.
"""
import types

import pytest

from horovod.backends import factory
from horovod.backends.hierarchical import HierarchicalBackend
from horovod.backends.tcp import TcpBackend

pytestmark = pytest.mark.timeout(60)

KNOBS = ("HOROVOD_CPU_OPERATIONS", "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_MPI_THREADS_DISABLE")


class FakeShm:
    """Stands in for ShmBackend (whose constructor maps shared memory with its peers)."""

    name = "shm"

    def __init__(self, comm, tag, chunk):
        self.comm, self.rank, self.size = comm, comm.rank, comm.size

    def close(self):
        pass


class FakeMPIBackend:
    """Stands in for MPIBackend, so that this file needs no MPI."""

    def __init__(self, comm):
        self.comm = comm

    def close(self):
        pass


@pytest.fixture
def choose(monkeypatch):
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(factory, "ShmBackend", FakeShm)
    monkeypatch.setattr(factory, "MPIBackend", FakeMPIBackend)
    made = []

    def choose(hosts, rank=0, mpi=None, **env):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        mesh = types.SimpleNamespace(rank=rank, size=len(hosts), hosts=list(hosts), data=[None] * len(hosts),
                                     control={}, on_machine=1)
        backend, reason = factory.make_backend(mesh, "job", 0, mpi)
        made.append(backend)
        return backend, reason

    yield choose
    for backend in made:
        backend.close()


@pytest.mark.parametrize("value", [None, "1", "true"], ids=["unset", "1", "true"])
def test_across_hosts_the_plane_is_hierarchical_unless_the_knob_says_0(choose, value):
    env = {} if value is None else {"HOROVOD_HIERARCHICAL_ALLREDUCE": value}
    backend, reason = choose(["a", "a", "b", "b"], rank=2, **env)
    assert isinstance(backend, HierarchicalBackend), reason
    assert backend.cross.comm.global_ranks == [0, 2] and reason.startswith("hierarchical"), reason


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_hierarchical_allreduce_0_selects_one_flat_tcp_ring_over_every_rank(choose, value):
    backend, reason = choose(["a", "a", "b", "b", "c", "c"], rank=3, HOROVOD_HIERARCHICAL_ALLREDUCE=value)
    assert type(backend) is TcpBackend, reason
    assert backend.comm.global_ranks == list(range(6)) and (backend.rank, backend.size) == (3, 6)
    assert reason.startswith("tcp: one flat ring over the 3 hosts") and "HOROVOD_HIERARCHICAL_ALLREDUCE=0" in reason


def test_hierarchical_allreduce_0_under_mpi_selects_flat_mpi(choose):
    mpi = types.SimpleNamespace(comm="the job's communicator", threads_supported=True, library="Open MPI v5")
    backend, reason = choose(["a", "a", "b", "b"], mpi=mpi, HOROVOD_HIERARCHICAL_ALLREDUCE="0")
    assert type(backend) is FakeMPIBackend and backend.comm == "the job's communicator", reason
    assert reason.startswith("mpi (Open MPI v5): one flat plane over the 2 hosts"), reason


def test_hierarchical_allreduce_0_on_one_host_changes_nothing(choose):
    backend, reason = choose(["a", "a"], HOROVOD_HIERARCHICAL_ALLREDUCE="0")
    assert isinstance(backend, FakeShm) and reason == "shm: every rank is on this host", reason


class FakeMPIComm:
    """An mpi4py communicator's Split, as the hierarchical plane over MPI asks for one."""

    def Split(self, color, key):
        return "the cross-host communicator"


class FakeRankedMPIBackend(FakeMPIBackend):
    """A FakeMPIBackend with a rank and a size, as the hierarchical and routed planes read them."""

    rank, size = 0, 1


# For each rule of factory.RULES, a job it is the first to apply to: (hosts, rank, MPI, environment).
THREADS = {"threads_supported": True}
NO_THREADS = {"threads_supported": False}
JOB_FOR_RULE = {
    "single": (["a"], 0, None, {}),
    "forced-tcp": (["a", "a"], 0, THREADS, {"HOROVOD_CPU_OPERATIONS": "tcp"}),
    "forced-mpi": (["a", "a"], 0, THREADS, {"HOROVOD_CPU_OPERATIONS": "mpi"}),
    "one-host-forced-shm": (["a", "a"], 0, THREADS, {"HOROVOD_CPU_OPERATIONS": "shm"}),
    "one-host-shm": (["a", "a"], 0, None, {}),
    "one-host-mpi-without-threads": (["a", "a"], 0, NO_THREADS, {}),
    "one-host-mpi-sizes-0": (["a", "a"], 0, THREADS, {"HOROVOD_MPI_REDUCE_MAX_BYTES": "0",
                                                       "HOROVOD_MPI_MOVE_MAX_BYTES": "0"}),
    "one-host-mpi+shm": (["a", "a"], 0, THREADS, {}),
    "flat-mpi-asked": (["a", "a", "b", "b"], 0, THREADS, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}),
    "flat-tcp-asked": (["a", "a", "b", "b"], 0, None, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}),
    "uneven-mpi": (["a", "a", "b"], 0, THREADS, {}),
    "hierarchical-mpi": (["a", "a", "b", "b"], 1, THREADS, {}),
    "uneven-tcp": (["a", "a", "b"], 0, None, {}),
    "hierarchical-tcp": (["a", "a", "b", "b"], 2, None, {}),
}


def test_every_rule_has_a_job_here():
    assert list(JOB_FOR_RULE) == [rule.name for rule in factory.RULES]


@pytest.mark.parametrize("name", list(JOB_FOR_RULE))
def test_the_reason_reported_is_the_chosen_rules(choose, monkeypatch, name):
    """The table decides: for each rule's job, make_backend reports that rule's reason, formatted for the job."""
    monkeypatch.setattr(factory, "MPIBackend", FakeRankedMPIBackend)
    monkeypatch.setattr(factory, "_OwnedMPIBackend", FakeRankedMPIBackend)
    hosts, rank, mpi, env = JOB_FOR_RULE[name]
    if mpi is not None:
        mpi = types.SimpleNamespace(comm=FakeMPIComm(), library="Open MPI v5",
                                    thread_level_name="MPI_THREAD_FUNNELED", **mpi)
    backend, reason = choose(hosts, rank=rank, mpi=mpi, **env)
    mesh = types.SimpleNamespace(rank=rank, size=len(hosts), hosts=list(hosts), data=[None] * len(hosts),
                                 on_machine=1)
    situation = factory.Situation(mesh, "job", 0, mpi)
    rule = factory.rule_for(situation)
    assert rule.name == name
    assert reason == rule.reason.format(s=situation) and "{" not in reason, reason
