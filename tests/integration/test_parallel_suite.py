"""Run every size-agnostic body in tests/parallel at 1, 2, 3 and 4 ranks through the real launcher.

The machine may have fewer cores than ranks (3 and 4 ranks oversubscribe a 2-core box), which also shakes
out races in the data planes. One job per rank count runs every core file (start-up is much of a small job's
time). Each job runs under a hard timeout that dumps every rank's stacks, and each test inside a rank has its own
pytest-timeout so that a hang fails fast with a stack instead of eating the budget.
"""
import pytest

from tests.support.launch import PARALLEL, run_parallel_tests

pytestmark = pytest.mark.timeout(480)

# The framework bindings have suites of their own (e.g. test_torch_suite.py); this one runs the core files.
FRAMEWORK_PREFIXES = ("test_torch_", "test_tensorflow_", "test_keras_", "test_jax_", "test_mxnet_")
# test_fast_rounds.py goes first: a join (test_adasum.py, test_join_barrier.py) turns the fast rounds off for the
# rest of a job, and it checks that its rounds run fast.
FIRST = ["test_fast_rounds.py"]
FILES = FIRST + sorted(p.name for p in PARALLEL.glob("test_*.py")
                       if not p.name.startswith(FRAMEWORK_PREFIXES) and p.name not in FIRST)
JOB_TIMEOUT = 180
FILES_JOB_TIMEOUT = 420                    # one job runs every file
PER_TEST_TIMEOUT = ["--timeout=20"]
TWO_HOSTS = "localhost:2,127.0.0.1:2"      # two "hosts" on this machine: shm inside each, tcp between them
EXPECT = "HVD_TEST_EXPECT_DATA_PLANE"      # test_allreduce.py checks that the job uses this data plane
MAIN = ["test_allreduce.py", "test_allgather.py", "test_broadcast.py", "test_reducescatter.py", "test_alltoall.py"]


def test_every_parallel_file_is_listed():
    assert set(MAIN) <= set(FILES) and len(FILES) >= 7, FILES


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_parallel(np_):
    env = {EXPECT: "local" if np_ == 1 else "shm"}
    run_parallel_tests(np_, FILES, env=env, timeout=FILES_JOB_TIMEOUT, pytest_args=PER_TEST_TIMEOUT)


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_carried_allreduces_on_the_tcp_plane(np_):
    """Small blocking allreduces reduced by the coordinator (core/engine/carried.py), which jobs on one host never
    use (their fast rounds take those calls); one rank is in test_parallel."""
    run_parallel_tests(np_, "test_carried_collectives.py", env={"HOROVOD_CPU_OPERATIONS": "tcp"}, timeout=JOB_TIMEOUT,
                       pytest_args=PER_TEST_TIMEOUT)


@pytest.mark.slow
def test_parallel_hierarchical_two_hosts():
    files = MAIN + ["test_join_barrier.py", "test_errors.py", "test_adasum.py", "test_process_sets.py",
                    "test_carried_collectives.py"]
    result = run_parallel_tests(4, files, hosts=TWO_HOSTS, env={EXPECT: "hierarchical"}, timeout=FILES_JOB_TIMEOUT,
                                pytest_args=PER_TEST_TIMEOUT)
    assert "[3]<stdout>" in result.stdout


@pytest.mark.slow
def test_hierarchical_adasum_and_every_rank_across_two_hosts():
    """HOROVOD_HIERARCHICAL_ALLREDUCE=1: sum inside each host, Adasum across hosts (test_adasum.py expects it);
    HOROVOD_HIERARCHICAL_CROSS=all: every local rank allreduces its block across hosts (upstream's scheme; the
    job above runs the default, the hosts' leaders)."""
    env = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_HIERARCHICAL_CROSS": "all", EXPECT: "hierarchical"}
    result = run_parallel_tests(4, ["test_adasum.py", "test_allreduce.py"], hosts=TWO_HOSTS, env=env,
                                timeout=JOB_TIMEOUT, pytest_args=PER_TEST_TIMEOUT)
    assert "[3]<stdout>" in result.stdout


@pytest.mark.slow
def test_parallel_tcp_data_plane():
    # every set on a tcp plane of its own too; small blocking allreduces reduced by the coordinator
    files = MAIN + ["test_process_sets.py", "test_adasum.py", "test_carried_collectives.py"]
    run_parallel_tests(3, files, env={"HOROVOD_CPU_OPERATIONS": "tcp", EXPECT: "tcp"}, timeout=FILES_JOB_TIMEOUT,
                       pytest_args=PER_TEST_TIMEOUT)


@pytest.mark.slow
@pytest.mark.parametrize("env", [
    # many pipeline steps per collective (the data plane), with group fusion off and a tiny cache (the controller):
    # the two are independent, so one job covers both
    {"HOROVOD_SHM_CHUNK_BYTES": "65536", "HOROVOD_DISABLE_GROUP_FUSION": "1", "HOROVOD_CYCLE_TIME": "5",
     "HOROVOD_CACHE_CAPACITY": "4"},
    # small blocking allreduces through the coordinator and the data plane too, there with neither fusion nor the
    # cache (the default fusion and cache already run every async op through the coordinator)
    {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_FAST_ROUNDS": "0",
     "HOROVOD_COORDINATOR_CARRY_BYTES": "0"},
    {"HOROVOD_CPU_OPERATIONS": "tcp", "HOROVOD_TCP_SMALL_BYTES": "0", "HOROVOD_COORDINATOR_CARRY_BYTES": "0",
     EXPECT: "tcp"},   # the ring path, every size
], ids=["small_shm_chunks_group_fusion_off_tiny_cache", "no_fusion_no_cache_no_fast_rounds", "tcp_ring_only"])
def test_parallel_knob_variants(env):
    run_parallel_tests(3, "test_allreduce.py", env=env, timeout=JOB_TIMEOUT, pytest_args=PER_TEST_TIMEOUT)
