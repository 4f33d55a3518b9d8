"""Horovod on MPI, end to end: the core tests/parallel files under Open MPI's ``mpirun`` and ``horovodrun --mpi``,
``hvd.init(comm=...)`` on halves of COMM_WORLD, the program's own mpi4py calls beside Horovod's, the thread-level
knobs, a killed rank, and the MPI probes. Worker scripts live in ``tests/integration/workers/mpi_*.py``.

Every test skips (with the reason) when mpi4py or mpirun is missing. Each job has a hard timeout that dumps the
stacks of every rank (see tests/support/launch.py).

The default data plane under MPI on one host is not asserted (it is free to route between MPI and shm); the
MPI plane is asserted only where HOROVOD_CPU_OPERATIONS=mpi forces it.
"""
import importlib.util
import re
import sys
import time

import pytest

from tests.support.launch import (
    ROOT,
    RanksHung,
    horovodrun,
    mpirun,
    rank_lines,
    require_mpi,
    run_parallel_tests,
)

pytestmark = pytest.mark.timeout(480)

WORKERS = ROOT / "tests" / "integration" / "workers"
JOB_TIMEOUT = 120
FILES_JOB_TIMEOUT = 420                    # one job runs several files
PER_TEST_TIMEOUT = ["--timeout=30"]
EXPECT = "HVD_TEST_EXPECT_DATA_PLANE"       # test_allreduce.py (and the workers) check the data plane against it
FORCE_MPI = {"HOROVOD_CPU_OPERATIONS": "mpi", EXPECT: "mpi"}
MAIN = ["test_allreduce.py", "test_allgather.py", "test_broadcast.py", "test_reducescatter.py", "test_alltoall.py"]
CORE = MAIN + ["test_join_barrier.py", "test_errors.py", "test_process_sets.py"]     # sets: MPI sub-communicators
# The bindings' Adasum files (upstream's Adasum tests run only under MPI): on the MPI plane, at a power of two
# and at the documented fold.
ADASUM = [("test_torch_adasum.py", "torch"), ("test_tensorflow_adasum.py", "tensorflow"), ("test_adasum.py", "numpy")]


@pytest.fixture(autouse=True)
def _needs_mpi():
    require_mpi()


def worker(name, *args):
    return [sys.executable, str(WORKERS / name), *[str(a) for a in args]]


def lines_of(result, np_):
    return {r: rank_lines(result.stdout, r) for r in range(np_)}


# ---------------------------------------------------------------------------------------------- core files
@pytest.mark.parametrize("np_", [3])
def test_core_files_under_mpirun_on_the_mpi_plane(np_):
    # One job runs every core file (start-up is much of a small job's time). Three ranks, not a power of two;
    # MPI at four ranks runs in test_two_halves_of_comm_world_run_independent_jobs, and the core files at four
    # ranks in the parallel suite.
    run_parallel_tests(np_, CORE, env=FORCE_MPI, timeout=FILES_JOB_TIMEOUT, pytest_args=PER_TEST_TIMEOUT,
                       launcher="mpirun")


@pytest.mark.parametrize("np_", [3])
def test_adasum_files_under_mpirun_on_the_mpi_plane(np_):
    # Upstream's own Adasum tests run only when hvd.mpi_enabled(): every binding's Adasum under mpirun.
    files = [f for f, framework in ADASUM if importlib.util.find_spec(framework) is not None]
    if not files:
        pytest.skip("neither torch nor tensorflow is installed")
    run_parallel_tests(np_, files, env={**FORCE_MPI, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=FILES_JOB_TIMEOUT,
                       pytest_args=["--timeout=60"], launcher="mpirun")


def test_main_files_under_mpirun_on_the_default_plane():
    run_parallel_tests(2, MAIN, timeout=FILES_JOB_TIMEOUT, pytest_args=PER_TEST_TIMEOUT, launcher="mpirun")


def test_core_files_under_mpirun_at_one_rank():
    # One job runs every core file (one rank: no data plane at all, only the MPI start-up path).
    run_parallel_tests(1, CORE, env={"HOROVOD_CPU_OPERATIONS": "mpi", EXPECT: "local"}, timeout=JOB_TIMEOUT,
                       pytest_args=PER_TEST_TIMEOUT, launcher="mpirun")


@pytest.mark.parametrize("np_", [3])
def test_main_files_under_horovodrun_mpi(np_):
    # One job per rank count runs every main file, as for mpirun above.
    result = run_parallel_tests(np_, MAIN, env=FORCE_MPI, timeout=FILES_JOB_TIMEOUT, pytest_args=PER_TEST_TIMEOUT,
                                launcher="horovodrun-mpi")
    assert f"[1,{np_ - 1}]<stdout>" in result.stdout, result.stdout[-3000:]     # mpirun's tags: it ran on MPI


# ---------------------------------------------------------------------------------------------- harness
@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun-mpi"])
def test_a_hung_mpi_job_is_killed_with_every_ranks_stack(launcher):
    command = worker("hang.py")
    start = time.monotonic()
    with pytest.raises(RanksHung) as info:
        if launcher == "mpirun":
            mpirun(2, command, timeout=8)
        else:
            horovodrun(2, command, extra_args=["--mpi"], timeout=8)
    assert time.monotonic() - start < 30
    report = str(info.value)
    assert "did not finish within 8s" in report
    rank0 = "\n".join(line for line in report.splitlines() if line.startswith("[1,0]<stderr>:"))
    rank1 = "\n".join(line for line in report.splitlines() if line.startswith("[1,1]<stderr>:"))
    assert "in wait" in rank0 and "hang.py" in rank0, report[-4000:]
    assert "rank1_sleeps_forever" in rank1, report[-4000:]
    # One dump per rank (the MPI runtime forwards SIGUSR1 itself; the harness does not signal the ranks twice).
    assert rank1.count("Current thread") == 1, rank1[-3000:]


# ---------------------------------------------------------------------------------------------- init(comm=...)
@pytest.mark.parametrize("env", [FORCE_MPI, {}], ids=["mpi_plane", "default_plane"])
def test_two_halves_of_comm_world_run_independent_jobs(env):
    result = mpirun(4, worker("mpi_split.py"), env=env, timeout=JOB_TIMEOUT)
    assert result.returncode == 0, result.stdout[-8000:]
    lines = lines_of(result, 4)
    for r in range(4):
        members = [0, 2] if r % 2 == 0 else [1, 3]
        half = (f"rank={members.index(r)} size=2 sum={sum(members)} gather={[members[0], members[1], members[1]]} "
                f"bcast={members[0]}")
        for part in ("COMM", "LIST"):
            mine = [line for line in lines[r] if line.startswith(f"{part} world={r} ")]
            assert len(mine) == 1 and half in mine[0], (r, part, lines[r])
            if env:
                assert mine[0].endswith("plane=mpi"), mine
        assert lines[r][-1] == "DONE", lines[r]
    # A rank outside the list is refused, saying why; the odd ranks did their own MPI work meanwhile.
    refused = [line for line in lines[1] if line.startswith("NOT_MEMBER")]
    assert refused == ["NOT_MEMBER ValueError Horovod initialization failed: hvd.init(comm=[0, 2]) was called on "
                       "COMM_WORLD rank 1, which is not in the list; only the listed ranks may call it."], lines[1]
    assert "OTHER world=1 got='hello from 3'" in lines[1] and "OTHER world=3 got='hello from 1'" in lines[3]


# ---------------------------------------------------------------------------------------------- user's own MPI
@pytest.mark.parametrize("np_,env,args", [(3, FORCE_MPI, ["comm"]), (2, {}, [])],
                         ids=["mpi_plane_np3_comm_world_given", "default_plane_np2"])
def test_the_programs_own_mpi_calls_beside_horovods(np_, env, args):
    result = mpirun(np_, worker("mpi_mix.py", *args), env=env, timeout=JOB_TIMEOUT)
    assert result.returncode == 0, result.stdout[-8000:]
    for r, mine in lines_of(result, np_).items():
        assert "PROBES enabled=True built=True threads=True level=True" in mine, (r, mine)
        for step in ("ALTERNATE ok", "OVERLAP ok", "AFTER_SHUTDOWN ok"):
            assert step in mine, (r, step, mine)


# ---------------------------------------------------------------------------------------------- thread level
@pytest.mark.parametrize("np_,how", [(3, "variable"), (2, "user_funneled")])
def test_without_thread_multiple_mpi_is_not_the_data_plane(np_, how):
    if how == "variable":
        result = mpirun(np_, worker("mpi_probe.py"), env={"HOROVOD_MPI_THREADS_DISABLE": "1"}, timeout=JOB_TIMEOUT)
        why = "MPI is not used for data because HOROVOD_MPI_THREADS_DISABLE=1"
    else:                   # the program initialized MPI itself, below MPI_THREAD_MULTIPLE
        result = mpirun(np_, worker("mpi_probe.py", "funneled"), timeout=JOB_TIMEOUT)
        why = "MPI is not used for data because MPI was initialized without MPI_THREAD_MULTIPLE"
    assert result.returncode == 0, result.stdout[-8000:]
    for r, mine in lines_of(result, np_).items():
        assert "PROBES enabled=True built=True threads=False" in mine, (r, mine)
        plane = [line for line in mine if line.startswith("PLANE ")]
        assert len(plane) == 1 and not plane[0].startswith("PLANE mpi"), plane
        assert why in plane[0], plane
        assert "COLLECTIVES ok" in mine, (r, mine)


@pytest.mark.parametrize("how", ["variable", "user_serialized"])
def test_forcing_the_mpi_plane_without_thread_multiple_fails_init_saying_why(how):
    env = {"HOROVOD_CPU_OPERATIONS": "mpi"}
    if how == "variable":
        env["HOROVOD_MPI_THREADS_DISABLE"] = "1"
        result = mpirun(2, worker("mpi_probe.py"), env=env, timeout=JOB_TIMEOUT)
        why = "HOROVOD_CPU_OPERATIONS=mpi, but HOROVOD_MPI_THREADS_DISABLE=1"
    else:
        result = mpirun(2, worker("mpi_probe.py", "serialized"), env=env, timeout=JOB_TIMEOUT)
        why = "HOROVOD_CPU_OPERATIONS=mpi, but MPI was initialized without MPI_THREAD_MULTIPLE"
    output = result.stdout
    assert result.returncode != 0, output[-6000:]
    for r in range(2):
        errors = [line for line in rank_lines(output, r) if line.startswith("ValueError: Horovod initialization")]
        assert len(errors) == 1, (r, output[-6000:])
        assert errors[0].startswith(f"ValueError: Horovod initialization failed on rank {r} of 2: {why}"), errors
        assert "unset HOROVOD_CPU_OPERATIONS" in errors[0], errors
        assert not any(line.startswith("PROBES") for line in rank_lines(output, r))


# ---------------------------------------------------------------------------------------------- dead rank
@pytest.mark.parametrize("launcher,env", [("mpirun", FORCE_MPI), ("mpirun", {}), ("horovodrun-mpi", FORCE_MPI)],
                         ids=["mpirun_mpi_plane", "mpirun_default_plane", "horovodrun_mpi"])
def test_a_sigkilled_rank_ends_the_job_and_is_named(launcher, env):
    np_ = 3
    start = time.monotonic()
    if launcher == "mpirun":
        result = mpirun(np_, worker("mpi_kill_rank.py"), env=env, timeout=60)
    else:
        result = horovodrun(np_, worker("mpi_kill_rank.py"), extra_args=["--mpi"], env=env, timeout=60)
    elapsed = time.monotonic() - start
    output = result.stdout
    assert result.returncode != 0, output[-6000:]
    assert elapsed < 30, f"the job took {elapsed:.1f}s to end after rank 1 died"
    for r in range(np_):
        assert "FIRST_ALLREDUCE ok" in rank_lines(output, r), (r, output[-6000:])
    assert "KILLING_MYSELF" in rank_lines(output, 1)
    # Open MPI ends the job itself (it kills the survivors as soon as it sees rank 1 die) and says which rank
    # died of what; a survivor may or may not get to report Horovod's own error first.
    flat = " ".join(output.split())
    assert re.search(r"process rank 1 with PID \d+ on node \S+ exited on signal 9 \(Killed\)", flat), output[-6000:]
    if launcher == "horovodrun-mpi":
        # horovodrun parses mpirun's report and names the root cause.
        assert "Process 1 failed" in output and "Process name: 1" in output, output[-6000:]
        assert "killed by SIGKILL" in output, output[-6000:]
    for r in (0, 2):
        for line in rank_lines(output, r):
            if line.startswith("SURVIVOR_ERROR"):
                assert "HorovodInternalError" in line and re.search(r"\b[Rr]anks? 1\b", line), line


# ---------------------------------------------------------------------------------------------- probes
def test_probes_under_plain_horovodrun_say_mpi_is_not_enabled():
    result = horovodrun(2, worker("mpi_probe.py"), timeout=JOB_TIMEOUT)
    assert result.returncode == 0, result.stdout[-6000:]
    for r, mine in lines_of(result, 2).items():
        probes = [line for line in mine if line.startswith("PROBES ")]
        assert probes == ["PROBES enabled=False built=True threads=ValueError: Horovod MPI is not enabled in this "
                          "job (it was not started by mpirun or horovodrun --mpi, nor given a communicator); "
                          "mpi_threads_supported() needs MPI."], (r, mine)
        assert "COLLECTIVES ok" in mine


def test_probes_under_mpirun_say_mpi_is_enabled():
    result = mpirun(2, worker("mpi_probe.py"), timeout=JOB_TIMEOUT)
    assert result.returncode == 0, result.stdout[-6000:]
    for r, mine in lines_of(result, 2).items():
        assert "PROBES enabled=True built=True threads=True" in mine, (r, mine)
        assert "COLLECTIVES ok" in mine
