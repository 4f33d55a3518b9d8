"""Process sets end to end: static sets under horovodrun and mpirun, sets made from MPI communicators, a Horovod
job on part of COMM_WORLD with a set inside it, the errors upstream programs see, the stall inspector naming the
set, and a rank lost inside a set. The size-agnostic bodies (every collective on sets, add/remove loops) are in
tests/parallel/test_process_sets.py, run at 1-4 ranks by test_parallel_suite.py and test_mpi_suite.py.
"""
import json
import sys

import pytest

from tests.support.launch import ROOT, horovodrun, mpirun, rank_lines, require_mpi, run_parallel_tests

pytestmark = pytest.mark.timeout(240)
WORKER = ROOT / "tests" / "integration" / "workers" / "process_sets.py"
TIMEOUT = 120


def run(np_, scenario, launcher="horovodrun", env=None):
    command = [sys.executable, str(WORKER), scenario]
    if launcher == "mpirun":
        return mpirun(np_, command, env=env, timeout=TIMEOUT)
    return horovodrun(np_, command, env=env, timeout=TIMEOUT)


def results(proc, np_):
    """rank -> the RESULT dict it printed (ranks that printed none are absent)."""
    out = {}
    for r in range(np_):
        found = [json.loads(line[len("RESULT "):]) for line in rank_lines(proc.stdout, r) if line.startswith("RESULT ")]
        if found:
            out[r] = found[-1]
    return out


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_static_process_sets_of_unequal_size_and_overlapping(launcher):
    if launcher == "mpirun":
        require_mpi()
    proc = run(4, "static", launcher)
    assert proc.returncode == 0, proc.stdout[-4000:]
    got = results(proc, 4)
    assert sorted(got) == [0, 1, 2, 3], proc.stdout[-4000:]
    for rank, res in got.items():
        assert res["ids"] == {"evens": 1, "odds": 2, "low": 3}, res
        assert res["sizes"] == {"evens": 2, "odds": 2, "low": 3}, res
        expected = {"evens": [2.0, 2.0]} if rank % 2 == 0 else {"odds": [4.0, 4.0]}
        if rank in (0, 1, 2):
            expected["low"] = [3.0, 3.0]
        assert res["sums"] == expected, res


def test_process_sets_from_mpi_communicators():
    require_mpi()
    proc = run(4, "comm", "mpirun")
    assert proc.returncode == 0, proc.stdout[-4000:]
    got = results(proc, 4)
    for rank, res in got.items():
        members = [0, 2] if rank % 2 == 0 else [1, 3]
        assert res["ranks"] == members and res["sum"] == [float(sum(members))] * 2 and res["mpi"], res
    assert {res["id"] for res in got.values()} == {1, 2} and len(got) == 4, got


def test_a_process_set_inside_a_job_on_part_of_comm_world():
    require_mpi()
    proc = run(4, "init_comm", "mpirun")
    assert proc.returncode == 0, proc.stdout[-4000:]
    got = results(proc, 4)
    assert got[3] == {"rank": -1}
    assert got[0] == {"rank": 0, "size": 3, "id": 1, "sum": [2.0, 2.0]}, got
    assert got[1] == {"rank": 1, "size": 3, "id": 1, "sum": None}, got
    assert got[2] == {"rank": 2, "size": 3, "id": 1, "sum": [2.0, 2.0]}, got


def test_the_same_set_twice_in_init_is_upstreams_value_error():
    proc = run(2, "duplicate")
    assert proc.returncode == 0, proc.stdout[-4000:]
    for res in results(proc, 2).values():
        assert res["error"].startswith("Horovod could not be initialized because process_sets entry number 1 is "
                                       "a duplicate: ProcessSet("), res


def test_duplicates_made_from_communicators_are_refused_where_visible_and_init_works_again():
    require_mpi()
    proc = run(3, "comm_duplicates", "mpirun")
    assert proc.returncode == 0, proc.stdout[-4000:]
    got = results(proc, 3)
    assert len(got) == 3, proc.stdout[-4000:]
    for rank, res in got.items():
        errors = res["errors"]
        assert "is a duplicate" in errors["dup_of_global"] and "is a duplicate" in errors["dup_of_a_set"], res
        # [0] equals rank 0's communicator set: a duplicate there only (ranks 1, 2 see the set [1, 2])
        assert ("is a duplicate" in (errors["list_equal_to_a_comm_set"] or "")) == (rank == 0), res
        assert res["sets"] == [[0], [0, 1], [0, 1, 2]], res


def test_adding_a_set_without_dynamic_process_sets_says_how_to_allow_it():
    proc = run(2, "not_dynamic", env={"HOROVOD_DYNAMIC_PROCESS_SETS": ""})
    assert proc.returncode == 0, proc.stdout[-4000:]
    got = results(proc, 2)
    assert len(got) == 2
    for res in got.values():
        assert res["error"] == ("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets after Horovod "
                                "initialization."), res


def test_the_stall_inspector_names_the_set_and_the_missing_rank():
    proc = run(3, "stall", env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:]
    # Rank 2 waits in the global set's barrier meanwhile, so rank 0 (the coordinator of both sets) may warn about
    # the global set too, before or after: the warning about set 1 is the one that names it.
    warnings = [line for line in rank_lines(proc.stdout, 0) if "subset of ranks" in line]
    about_set = [line for line in warnings if "in process set 1 (ranks [0, 1])" in line]
    assert about_set, warnings or proc.stdout[-4000:]
    following = rank_lines(proc.stdout, 0)
    index = following.index(about_set[0])
    assert any(line.startswith("1: [") and "late.tensor" in line for line in following[index:index + 4]), \
        following[index:index + 4]


def test_a_rank_lost_inside_a_set_is_named_by_its_global_rank():
    proc = run(3, "kill")
    assert proc.returncode != 0
    got = results(proc, 3)
    assert 0 in got, proc.stdout[-4000:]
    assert got[0]["error"].startswith("HorovodInternalError: Rank 1 (host "), got[0]


def test_the_timeline_records_the_sets_rank_0_coordinates(tmp_path):
    path = tmp_path / "timeline.json"
    proc = run(3, "timeline", env={"HOROVOD_TIMELINE": str(path)})
    assert proc.returncode == 0, proc.stdout[-4000:]
    events = json.loads(path.read_text())
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"] > 0}
    assert {f"allreduce.in.set.{i}" for i in range(3)} <= names, names
    assert {f"allreduce.global.{i}" for i in range(3)} <= names, names
    assert not any("other.set" in n for n in names), names


def test_the_process_set_bodies_under_mpirun_on_the_default_plane():
    # test_mpi_suite.py runs them on the MPI plane (every set on an MPI sub-communicator) at 1-4 ranks.
    run_parallel_tests(3, "test_process_sets.py", timeout=TIMEOUT, pytest_args=["--timeout=30"], launcher="mpirun")
