"""Who am I: each launcher environment's detector, the single-process fallback, and invalid layouts."""
import socket

import pytest

from horovod.common import topology
from horovod.common.topology import PMI, HorovodLauncher, OpenMPI, Slurm, _tasks_per_node, detect


def layout(t):
    return (t.rank, t.size, t.local_rank, t.local_size, t.cross_rank, t.cross_size)


def test_single_process_fallback():
    t = detect({})
    assert layout(t) == (0, 1, 0, 1, 0, 1)
    assert t.source == "single process" and t.hostname == socket.gethostname()
    assert detect({"HOROVOD_HOSTNAME": "box"}).hostname == "box"


def test_reads_os_environ_by_default(monkeypatch):
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    assert detect().rank == 1


def test_horovodrun_variables():
    env = {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "8", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "4",
           "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": "node-b"}
    t = detect(env)
    assert layout(t) == (5, 8, 1, 4, 1, 2) and t.hostname == "node-b" and t.source == "horovodrun"


def test_horovodrun_variables_without_local_and_cross():
    t = detect({"HOROVOD_RANK": "2", "HOROVOD_SIZE": "3"})
    assert (t.rank, t.size) == (2, 3)
    assert (t.local_rank, t.local_size) == (2, 3)        # one host
    assert (t.cross_rank, t.cross_size) == (0, 1)


def test_horovodrun_takes_precedence_over_mpi_variables():
    env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    assert detect(env).source == "horovodrun"


def test_open_mpi():
    env = {"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_NODE_RANK": "1"}
    t = detect(env)
    assert layout(t) == (6, 8, 2, 4, 1, 2) and t.source == "Open MPI"
    env.pop("OMPI_COMM_WORLD_NODE_RANK")
    assert layout(detect(env)) == (6, 8, 2, 4, 1, 2)       # cross rank from rank // local size
    t = detect({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
    assert layout(t) == (1, 2, 1, 2, 0, 1)


def test_pmi():
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    t = detect(env)
    assert layout(t) == (3, 4, 1, 2, 1, 2) and t.source == "PMI"
    assert layout(detect({"PMI_RANK": "2", "PMI_SIZE": "3"})) == (2, 3, 2, 3, 0, 1)


def slurm_env(procid, ntasks, localid, nodeid, tasks_per_node):
    return {"SLURM_PROCID": str(procid), "SLURM_NTASKS": str(ntasks), "SLURM_LOCALID": str(localid),
            "SLURM_NODEID": str(nodeid), "SLURM_TASKS_PER_NODE": tasks_per_node, "SLURM_STEP_ID": "0"}


def test_slurm_homogeneous():
    t = detect(slurm_env(5, 8, 1, 2, "2(x4)"))
    assert layout(t) == (5, 8, 1, 2, 2, 4) and t.source == "Slurm"


def test_slurm_step_tasks_per_node_wins():
    env = slurm_env(1, 4, 1, 0, "4")
    env["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)"
    assert detect(env).local_size == 2


def test_slurm_npross_instead_of_ntasks():
    env = slurm_env(1, 2, 1, 0, "2")
    del env["SLURM_NTASKS"]
    env["SLURM_NPROCS"] = "2"
    assert layout(detect(env)) == (1, 2, 1, 2, 0, 1)


def test_slurm_needs_a_job_step():
    env = slurm_env(0, 2, 0, 0, "2")
    del env["SLURM_STEP_ID"]                      # inside an allocation but not in an srun step
    assert detect(env).source == "single process"


@pytest.mark.parametrize("spec,expanded", [
    ("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1,2,3", [1, 2, 3]), ("3(x2)", [3, 3]), ("1(x1),5(x2)", [1, 5, 5]),
])
def test_compressed_tasks_per_node(spec, expanded):
    assert _tasks_per_node(spec) == expanded
    assert _tasks_per_node("garbage") is None
    assert _tasks_per_node("") is None


def test_slurm_heterogeneous_nodes():
    # "2(x3),1": nodes 0-2 run two tasks, node 3 runs one; 7 tasks in all.
    last = detect(slurm_env(6, 7, 0, 3, "2(x3),1"))
    assert (last.local_rank, last.local_size) == (0, 1)
    # cross_size is the number of hosts that have this local rank: local rank 0 lives on all 4 nodes ...
    assert (last.cross_rank, last.cross_size) == (3, 4)
    second = detect(slurm_env(1, 7, 1, 0, "2(x3),1"))
    assert (second.local_rank, second.local_size) == (1, 2)
    # ... and local rank 1 on the first 3.
    assert (second.cross_rank, second.cross_size) == (0, 3)


@pytest.mark.parametrize("env", [
    {"HOROVOD_RANK": "4", "HOROVOD_SIZE": "4"},
    {"HOROVOD_RANK": "-1", "HOROVOD_SIZE": "4"},
    {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "0"},
    {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "2", "HOROVOD_LOCAL_SIZE": "2"},
    {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "3"},
    {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "1"},
    {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"},
    {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "2"},
], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_inconsistent_layouts_raise(env):
    with pytest.raises(ValueError):
        detect(env)


@pytest.mark.parametrize("name", ["HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"])
def test_non_integer_values_raise_naming_the_variable(name):
    env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2"}
    env[name] = "zero"
    with pytest.raises(ValueError, match=name):
        detect(env)


def test_every_detector_has_the_same_interface():
    assert [type(d) for d in topology.DETECTORS] == [HorovodLauncher, OpenMPI, PMI, Slurm]
    for detector in topology.DETECTORS:
        assert detector.is_present({}) is False
        assert isinstance(detector.name, str) and detector.name
