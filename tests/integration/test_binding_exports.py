"""Every binding exposes the op layer's names (``horovod.core.api.__all__``, the same objects) and the names of
its own it exposed before they were declared once (issue 12): a regression guard on the public surface.

The bindings are imported in a subprocess (TensorFlow and Keras are slow to import and stay loaded)."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)

pytest.importorskip("torch")
pytest.importorskip("tensorflow")

# The names each module exposes besides horovod.core.api.__all__ (its own collectives and helpers).
OWN_NAMES = {
    "horovod.jax": [
        "Compression", "DistributedOptimizer", "DistributedOptimizerState", "allgather", "allgather_object",
        "allreduce", "allreduce_gradients", "alltoall", "barrier", "broadcast", "broadcast_object",
        "broadcast_parameters", "broadcast_variables", "grouped_allgather", "grouped_allreduce",
        "grouped_reducescatter", "join", "reducescatter"],
    "horovod.keras": [
        "Compression", "DistributedOptimizer", "PartialDistributedOptimizer", "allgather", "allreduce", "broadcast",
        "broadcast_global_variables", "broadcast_variables", "load_model", "reducescatter"],
    "horovod.tensorflow.keras": [
        "Compression", "DistributedOptimizer", "PartialDistributedOptimizer", "allgather", "allreduce", "broadcast",
        "broadcast_global_variables", "broadcast_variables", "load_model", "reducescatter"],
    "horovod.numpy": [
        "Handle", "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_", "allreduce_async",
        "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
        "broadcast_async_", "broadcast_object", "get_average_backwards_compatibility_fun", "grouped_allgather",
        "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
        "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async", "join", "poll",
        "reducescatter", "reducescatter_async", "synchronize"],
    "horovod.tensorflow": [
        "BroadcastGlobalVariablesHook", "Compression", "DistributedGradientTape", "DistributedOptimizer",
        "LocalGradientAggregationHelper", "PartialDistributedGradientTape", "SyncBatchNormalization", "allgather",
        "allgather_object", "allreduce", "alltoall", "broadcast", "broadcast_", "broadcast_global_variables",
        "broadcast_object", "broadcast_object_fn", "broadcast_variables", "check_num_rank_power_of_2",
        "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "handle_average_backwards_compatibility",
        "join", "local_rank_op", "local_size_op", "process_set_included_op", "rank_op", "reducescatter",
        "refs_to_vars", "size_op", "vars_to_refs"],
    "horovod.tensorflow.mpi_ops": [
        "allgather", "alltoall", "broadcast", "broadcast_", "check_num_rank_power_of_2", "collective_chain",
        "get_average_backwards_compatibility_fun", "grouped_allgather", "handle_average_backwards_compatibility",
        "join", "local_rank_op", "local_size_op", "num_rank_is_power_2", "process_set_included_op", "rank_op",
        "size_op"],
    "horovod.torch": [
        "Compression", "DistributedOptimizer", "SyncBatchNorm", "allgather", "allgather_async", "allgather_object",
        "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier",
        "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
        "broadcast_optimizer_state", "broadcast_parameters", "grouped_allgather", "grouped_allgather_async",
        "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
        "grouped_reducescatter", "grouped_reducescatter_async", "join", "poll", "reducescatter",
        "reducescatter_async", "sparse_allreduce_async", "synchronize"],
    "horovod.torch.mpi_ops": [
        "Compression", "Handle", "HorovodAllgather", "HorovodAllreduce", "HorovodAlltoall", "HorovodBroadcast",
        "HorovodGroupedAllgather", "HorovodGroupedAllreduce", "HorovodGroupedReducescatter", "HorovodReducescatter",
        "allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
        "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
        "get_average_backwards_compatibility_fun", "grouped_allgather", "grouped_allgather_async",
        "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
        "grouped_reducescatter", "grouped_reducescatter_async", "handle_average_backwards_compatibility", "join",
        "poll", "process_set_size", "reducescatter", "reducescatter_async", "sparse_allreduce_async",
        "synchronize"],
}

# horovod.torch's own init/shutdown reset its handles; its timeline functions are its own too.
TORCH_OWN = {"init", "shutdown", "start_timeline", "stop_timeline"}

_PROBE = """
import importlib, json, sys
from horovod.core import api
out = {}
for name in sys.argv[1:]:
    mod = importlib.import_module(name)
    out[name] = {"names": sorted(n for n in dir(mod) if not n.startswith("_")),
                 "not_api": sorted(n for n in api.__all__ if getattr(mod, n, None) is not getattr(api, n))}
print("EXPORTS" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def exports():
    result = subprocess.run([sys.executable, "-c", _PROBE, *OWN_NAMES], capture_output=True, text=True,
                            timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("EXPORTS"))
    return json.loads(line[len("EXPORTS"):])


@pytest.mark.parametrize("module", sorted(OWN_NAMES))
def test_binding_keeps_its_public_names(exports, module):
    assert sorted(set(OWN_NAMES[module]) - set(exports[module]["names"])) == []


@pytest.mark.parametrize("module", sorted(OWN_NAMES))
def test_binding_exposes_the_op_layer_names(exports, module):
    expected = sorted(TORCH_OWN) if module.startswith("horovod.torch") else []
    assert exports[module]["not_api"] == expected
