"""Horovod on a real Ray 2.60 cluster: a head node and a worker node on this machine, 2 CPUs each.

One cluster for the module (``tests/support/ray_cluster.py``); every test starts and shuts down its own
executor. Worker functions use ``horovod.numpy`` (a fresh actor imports it in a fraction of the time torch
takes) except the elastic training test. Calls that drive workers run under ``call_with_deadline``, which dumps
every worker actor's stack if they hang.
"""
import os
import re
import signal
import sys
import time
import warnings

import pytest
import ray.cloudpickle

from horovod.common.wire import SECRET_ENV
from horovod.ray import ElasticRayExecutor, RayExecutor, RayWorkerError, log_to_driver
from horovod.ray.strategy import assign_ranks
from tests.support.ray_cluster import ROOT, call_with_deadline, ray_cluster_fixture, run_ray_script

# pytest imports this file as a top-level module that Ray's workers cannot import: ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ray_two_nodes = ray_cluster_fixture(nodes=2, cpus_per_node=2)

CALL_TIMEOUT = 60.0


def _topology_and_sum():
    import numpy as np

    import horovod.numpy as hvd

    hvd.init()
    total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
    with open("/proc/self/cmdline", "rb") as f:
        secret_on_command_line = os.environ[SECRET_ENV].encode() in f.read()
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
            "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "sum": float(total[0]),
            "host": os.environ["HOROVOD_HOSTNAME"], "extra": os.environ.get("EXTRA_VAR"),
            "secret_on_command_line": secret_on_command_line}


def _started(cluster, executor, **start_kwargs):
    call_with_deadline(cluster, lambda: executor.start(**start_kwargs), CALL_TIMEOUT, "RayExecutor.start()")
    return executor


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", [{"num_hosts": 2, "num_workers_per_host": 1}, {"num_workers": 4}],
                         ids=["2-workers-spread", "4-workers-packed"])
def test_static_job_ranks_per_node_and_allreduce(ray_two_nodes, layout):
    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=30)
    executor = RayExecutor(settings, cpus_per_worker=1, **layout)
    try:
        _started(ray_two_nodes, executor, extra_env_vars={"EXTRA_VAR": "yes"})
        results = call_with_deadline(ray_two_nodes, lambda: executor.run(_topology_and_sum), CALL_TIMEOUT, "run")
    finally:
        executor.shutdown()
    size = len(results)
    per_node = size // 2
    assert size == layout.get("num_workers", 2)
    assert [r["rank"] for r in results] == list(range(size))
    hosts = [r["host"] for r in results]
    # Ranks are contiguous per Ray node, and the two nodes (one machine, one IP) are two hosts for Horovod.
    assert len(set(hosts)) == 2 and hosts == sorted(hosts, key=hosts.index)
    for r in results:
        assert (r["size"], r["local_size"], r["cross_size"]) == (size, per_node, 2)
        assert r["local_rank"] == r["rank"] % per_node and r["cross_rank"] == r["rank"] // per_node
        assert r["sum"] == size * (size + 1) / 2
        assert r["extra"] == "yes" and not r["secret_on_command_line"]


class Counter:
    """An executable for ``execute``: built once per worker by ``start(executable_cls=...)``."""

    def __init__(self, start, step=1):
        self.value, self.step = start, step

    def bump(self):
        import horovod.numpy as hvd

        hvd.init()
        self.value += self.step
        return hvd.rank(), self.value


def _log_three_steps():
    for step in range(3):
        log_to_driver(f"step {step}")
    return "done"


@pytest.mark.timeout(120)
def test_execute_and_execute_single_use_the_executable(ray_two_nodes):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=2)
    try:
        _started(ray_two_nodes, executor, executable_cls=Counter, executable_args=[10], executable_kwargs={"step": 5})
        first = call_with_deadline(ray_two_nodes, lambda: executor.execute(lambda c: c.bump()), CALL_TIMEOUT, "run")
        single = call_with_deadline(ray_two_nodes, lambda: executor.execute_single(lambda c: c.bump()), CALL_TIMEOUT,
                                    "execute_single")
        after = ray.get(executor.run_remote(lambda: os.environ["HOROVOD_RANK"]))
        logged = []
        values = executor.run(_log_three_steps, callbacks=[logged.append])
    finally:
        executor.shutdown()
    assert first == [(0, 15), (1, 15)]
    assert single == (0, 20)                  # rank 0's executable only: it was bumped twice
    assert after == ["0", "1"]
    assert values == ["done", "done"] and logged == ["step 0", "step 1", "step 2"]   # rank 0's values only


def _raise_on_rank_1(then_allreduce):
    import numpy as np

    import horovod.numpy as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("bad batch on purpose")
    if then_allreduce:
        hvd.allreduce(np.ones(1), name="waits_for_rank_1")
    return hvd.rank()


@pytest.mark.timeout(120)
def test_an_exception_on_one_worker_names_its_rank(ray_two_nodes):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_hosts=2)
    try:
        _started(ray_two_nodes, executor)
        with pytest.raises(RayWorkerError) as info:
            call_with_deadline(ray_two_nodes, lambda: executor.run(_raise_on_rank_1, args=[False]), CALL_TIMEOUT,
                               "run")
        message = str(info.value)
        assert info.value.rank == 1 and isinstance(info.value.cause, ValueError)
        assert "ValueError('bad batch on purpose') on rank 1 (node " + info.value.hostname in message
        assert "Traceback" in message and "_raise_on_rank_1" in message
        # Rank 0 had finished: the workers are kept, and the executor runs again.
        assert call_with_deadline(ray_two_nodes, lambda: executor.run(lambda: 7), CALL_TIMEOUT, "run") == [7, 7]
        # Rank 0 waits for rank 1 in a collective that never comes: the workers are stopped, nothing hangs.
        with pytest.raises(RayWorkerError, match="(?s)rank 1 .*The other workers were stopped; call start()"):
            call_with_deadline(ray_two_nodes, lambda: executor.run(_raise_on_rank_1, args=[True]), CALL_TIMEOUT,
                               "run")
        with pytest.raises(RuntimeError, match="call start\\(\\) first"):
            executor.run(lambda: 7)
    finally:
        executor.shutdown()


def _die_on_rank_1():
    import numpy as np

    import horovod.numpy as hvd

    hvd.init()
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(np.ones(1), name="after_the_death")
    return hvd.rank()


@pytest.mark.timeout(120)
def test_a_dead_actor_fails_a_static_job_naming_rank_and_node(ray_two_nodes):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_hosts=2)
    try:
        _started(ray_two_nodes, executor)
        node_of_rank_1 = executor._adapter.workers[1].node_id
        with pytest.raises(RayWorkerError) as info:
            call_with_deadline(ray_two_nodes, lambda: executor.run(_die_on_rank_1), CALL_TIMEOUT, "run")
    finally:
        executor.shutdown()
    message = str(info.value)
    assert info.value.rank == 1
    assert f"The Ray actor of rank 1 (node {info.value.hostname}, Ray node id {node_of_rank_1}) died" in message
    assert "The other workers were stopped" in message


@pytest.mark.timeout(60)
def test_an_infeasible_request_fails_within_the_placement_group_timeout(ray_two_nodes):
    executor = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=3), num_workers=5)
    began = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        executor.start()
    assert time.monotonic() - began < 20
    assert str(info.value) == (
        "RayExecutor could not reserve 5 worker(s) with {'CPU': 1} each (PACK) within placement_group_timeout_s=3 s: "
        "the Ray cluster has 2 node(s) with 2, 2 CPUs. Ask for fewer workers or fewer CPUs per worker, add nodes "
        "to the cluster, or raise placement_group_timeout_s in RayExecutor.create_settings().")
    # The reservation was given back: the whole cluster can be reserved again.
    executor = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=20), num_workers=4)
    try:
        _started(ray_two_nodes, executor)
    finally:
        executor.shutdown()


def _size_after_init():
    import horovod.numpy as hvd

    hvd.init()
    return hvd.size()


@pytest.mark.timeout(120)
def test_workers_go_into_the_callers_placement_group(ray_two_nodes):
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=1)
    def driver_in_group():
        from ray.util.placement_group import get_current_placement_group

        executor = RayExecutor(RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=5), num_workers=2)
        executor.start()
        try:
            sizes = executor.run(_size_after_init)
        finally:
            executor.shutdown()
        return get_current_placement_group().id.hex(), sizes

    group = placement_group([{"CPU": 1}] * 3, strategy="PACK")
    ray.get(group.ready(), timeout=30)
    try:
        # With 3 of the cluster's 4 CPUs in the group, a second group for the workers could never be placed: the
        # run succeeds only because the workers are placed in the caller's group.
        task = driver_in_group.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            group, placement_group_capture_child_tasks=True)).remote()
        group_id, sizes = call_with_deadline(ray_two_nodes, lambda: ray.get(task), 90, "the run inside the group")
    finally:
        remove_placement_group(group)
    assert group_id == group.id.hex() and sizes == [2, 2]


def _elastic_training(marker):
    """Commits every step; the worker that is rank 2 kills its own process once (``marker`` says it did). Trains
    until it has seen sizes 3, 2 and 3 again (the replacement joined) and at least 30 steps."""
    import torch

    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, batch=0, sizes=[])

    @hvd.elastic.run
    def train(state):
        while state.batch < 600:
            if hvd.rank() == 2 and state.batch >= 5 and not os.path.exists(marker):
                with open(marker, "w") as f:
                    f.write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
            x = torch.randn(8, 4, generator=torch.Generator().manual_seed(state.batch * 10 + hvd.rank()))
            optimizer.zero_grad()
            ((model(x) - x.sum(1, keepdim=True)) ** 2).mean().backward()
            optimizer.step()
            if not state.sizes or state.sizes[-1] != hvd.size():
                state.sizes.append(hvd.size())
            state.batch += 1
            state.commit()
            time.sleep(0.05)
            if state.batch >= 30 and state.sizes[-3:] == [3, 2, 3]:
                break

    train(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "pid": os.getpid(), "batch": state.batch, "sizes": state.sizes,
            "params": [p.detach().numpy().tolist() for p in model.parameters()]}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_elastic_job_replaces_a_killed_actor_and_finishes(ray_two_nodes, tmp_path):
    marker = tmp_path / "killed"
    # 2 + 1 workers on the two nodes; the killed worker's node comes back after a 1 s cooldown and gets a new one.
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), min_workers=2, max_workers=3,
                           cooldown_range=(1, 1), elastic_timeout=60)
    try:
        _started(ray_two_nodes, executor)
        results = call_with_deadline(ray_two_nodes, lambda: executor.run(_elastic_training, args=[str(marker)]), 120,
                                     "the elastic run")
    finally:
        executor.shutdown()
    killed_pid = int(marker.read_text())
    assert [r["rank"] for r in results] == [0, 1, 2] and {r["size"] for r in results} == {3}
    assert all(r["sizes"] == [3, 2, 3] for r in results), results
    assert killed_pid not in {r["pid"] for r in results}
    assert len({r["batch"] for r in results}) == 1
    assert all(r["params"] == results[0]["params"] for r in results)      # the same model on every worker


def _elastic_raise_everywhere():
    import horovod.numpy as hvd

    hvd.init()
    raise ValueError(f"rank {hvd.rank()} gives up on purpose")


@pytest.mark.timeout(120)
def test_an_elastic_job_whose_workers_all_raise_fails_naming_the_first_rank(ray_two_nodes):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), min_workers=2, max_workers=2,
                           elastic_timeout=30)
    try:
        _started(ray_two_nodes, executor)
        with pytest.raises(RayWorkerError) as info:
            call_with_deadline(ray_two_nodes, lambda: executor.run(_elastic_raise_everywhere), 90, "the elastic run")
    finally:
        executor.shutdown()
    message = str(info.value)
    assert info.value.rank == 0
    assert "The elastic job on Ray failed" in message and "Process name: 0" in message
    assert f"Host: {info.value.hostname}" in message and "the function in a Ray actor on node" in message
    assert "ValueError: rank 0 gives up on purpose" in message


@pytest.mark.timeout(120)
def test_elastic_ray_executor_is_the_deprecated_alias(ray_two_nodes):
    def fn():
        import numpy as np

        import horovod.numpy as hvd

        hvd.init()
        state = hvd.elastic.ObjectState(steps=0)

        @hvd.elastic.run
        def train(state):
            for _ in range(3):
                state.steps += 1
                state.commit()
            log_to_driver(hvd.size())
            return float(hvd.allreduce(np.array([1.0]), op=hvd.Sum)[0])

        return hvd.rank(), train(state), os.environ["FROM_ENV_VARS"]

    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2, elastic_timeout=30)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        executor = ElasticRayExecutor(settings, cpus_per_slot=1, env_vars={"FROM_ENV_VARS": "set"})
    assert any(issubclass(w.category, DeprecationWarning) and "RayExecutor(settings, min_workers" in str(w.message)
               for w in caught)
    executor.start()
    logged = []
    results = call_with_deadline(ray_two_nodes, lambda: executor.run(fn, callbacks=[logged.append]), 90,
                                 "ElasticRayExecutor.run")
    assert results == [(0, 2.0, "set"), (1, 2.0, "set")] and logged == [2]


def test_ranks_follow_the_nodes_the_actors_landed_on():
    # Actors started in the order a, b, c, d landed on nodes n1, n2, n1, n2: each node's actors get adjacent ranks.
    places = [{"node_id": f"n{i % 2 + 1}" + "0" * 10, "node_ip": "10.0.0.1", "pid": 100 + i} for i in range(4)]
    placed = assign_ranks(["a", "b", "c", "d"], places)
    assert [(p.actor, p.slot.rank, p.slot.local_rank, p.slot.cross_rank) for p in placed] == [
        ("a", 0, 0, 0), ("c", 1, 1, 0), ("b", 2, 0, 1), ("d", 3, 1, 1)]
    assert {p.slot.hostname for p in placed} == {"10.0.0.1-n1000000", "10.0.0.1-n2000000"}


# Seeded (seed 42), the Ray example reaches 96.44 % on the reference VM; seeds 0-4 reach 94.89-97.11 %. Other
# CPUs' arithmetic moves a seeded run by a point or two, so the threshold is 3 points below the lower, rounded
# down.
RAY_MIN_ACCURACY = 91.0


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_ray_digits_example_trains():
    result = run_ray_script([sys.executable, str(ROOT / "examples" / "ray" / "ray_digits.py"), "--epochs", "6",
                             "--min-accuracy", str(RAY_MIN_ACCURACY / 100)], timeout=120)
    assert result.returncode == 0, result.stdout
    accuracy = re.search(r"test accuracy: ([\d.]+)% with 2 workers", result.stdout)
    assert accuracy and float(accuracy.group(1)) >= RAY_MIN_ACCURACY, result.stdout[-3000:]
    assert "epoch 5: loss" in result.stdout and "with 2 workers" in result.stdout, result.stdout
