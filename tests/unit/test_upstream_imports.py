"""Upstream's module paths that test utilities and users' helpers import, and what those helpers do."""
import importlib
import socket
import threading

import pytest

from horovod.common import util
from horovod.runner.util import network, threads

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("module", ["horovod.runner.util.threads", "horovod.runner.util.network",
                                    "horovod.common.util", "horovod.runner.common.util.network",
                                    "horovod.common.elastic", "horovod.runner.elastic.worker",
                                    "horovod.runner.elastic.constants", "horovod.runner.elastic.discovery",
                                    "horovod.torch.elastic"])
def test_upstream_module_paths_import(module):
    if module.startswith("horovod.torch"):
        pytest.importorskip("torch")
    importlib.import_module(module)


def test_elastic_objects_are_the_same_under_every_path():
    from horovod.common import elastic
    from horovod.runner.elastic import constants, worker

    assert worker.HostUpdateResult is elastic.HostUpdateResult
    assert worker.notification_manager is elastic.notification_manager
    assert constants.RESET_LIMIT_EXCEEDED_MESSAGE.format(3) == (
        "Horovod was shutdown because number of resets during elastic job exceeded limit: 3")


def test_built_queries_answer_like_upstream():
    assert util.gloo_built() is True
    assert util.nccl_built() == 0
    assert util.ddl_built() is False and util.ccl_built() is False
    assert util.mpi_built() == (importlib.util.find_spec("mpi4py") is not None)
    assert util.extension_available("horovod.torch") == (importlib.util.find_spec("torch") is not None)
    assert util.extension_available("horovod.nonexistent") is False
    assert util.gpu_available("horovod.torch") is False


def test_binding_level_helpers_and_basics_as_upstreams_tests_read_them():
    """Upstream's bindings import check_extension, gpu_available and split_list, and its process-set tests read
    ``hvd.mpi_ops._basics._get_process_set_ids_and_ranks()``; no GPU here, so gpu_available says False."""
    torch_hvd = pytest.importorskip("horovod.torch")
    from horovod.core import basics

    assert torch_hvd.gpu_available("torch") is False and torch_hvd.split_list([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]
    assert torch_hvd.mpi_ops._basics is basics
    assert callable(torch_hvd.mpi_ops._basics._get_process_set_ids_and_ranks)
    torch_hvd.check_extension("horovod.torch", "HOROVOD_WITH_PYTORCH", __file__, "mpi_lib_v2")
    if importlib.util.find_spec("mxnet") is None:          # MXNet lives in a venv of its own
        with pytest.raises(ImportError, match=r'pip install \"horovod\[mxnet\]\"'):
            util.check_extension("horovod.mxnet", "HOROVOD_WITH_MXNET", __file__)
    tf_hvd = pytest.importorskip("horovod.tensorflow")
    import horovod.tensorflow.keras as tf_keras_hvd

    assert tf_hvd.gpu_available("tensorflow") is False
    assert tf_hvd.mpi_ops._basics is basics and tf_keras_hvd.mpi_ops._basics is basics


def test_cache_memoizes():
    calls = []

    @util._cache
    def square(x):
        calls.append(x)
        return x * x

    assert [square(3), square(3), square(4)] == [9, 9, 16]
    assert calls == [3, 4]


def test_is_iterable():
    assert util.is_iterable([1]) and util.is_iterable("ab") and not util.is_iterable(3)


def test_execute_function_multithreaded_returns_results_by_index():
    seen = set()

    def add(a, b):
        seen.add(threading.get_ident())
        return a + b

    args = [[i, 10 * i] for i in range(20)]
    assert threads.execute_function_multithreaded(add, args, max_concurrent_executions=4) == \
        {i: 11 * i for i in range(20)}
    assert 1 <= len(seen) <= 4


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # the failing call's thread
def test_execute_function_multithreaded_reports_failed_calls():
    def fail_on_two(x):
        if x == 2:
            raise KeyError("boom")
        return x

    with pytest.raises(RuntimeError, match="did not complete successfully"):
        threads.execute_function_multithreaded(fail_on_two, [[1], [2], [3]])


def test_execute_function_multithreaded_without_blocking():
    done = threading.Event()
    assert threads.execute_function_multithreaded(lambda: done.set(), [[]], block_until_all_done=False) is None
    assert done.wait(10)


def test_in_thread_and_on_event():
    with pytest.raises(ValueError, match="must be a tuple"):
        threads.in_thread(print, args=[1])
    out = []
    threads.in_thread(out.append, args=(1,), daemon=False).join(10)
    assert out == [1]
    threads.in_thread(lambda: 1 / 0, silent=True).join(10)   # swallowed, not raised in this thread

    event, stop = threading.Event(), threading.Event()
    fired = threading.Event()
    t = threads.on_event(event, fired.set, stop=stop, check_stop_interval_s=0.01)
    event.set()
    t.join(10)
    assert fired.is_set()
    stopped = threads.on_event(threading.Event(), fired.clear, stop=stop, check_stop_interval_s=0.01)
    stop.set()
    stopped.join(10)
    assert fired.is_set() and not stopped.is_alive()
    with pytest.raises(ValueError, match="Stop event must be given"):
        threads.on_event(event, print, daemon=False)


def test_network_helpers():
    assert "127.0.0.1" in network.get_local_host_addresses()
    assert network.get_local_intfs()        # the loopback interface
    assert network.resolve_host_address("localhost") == "127.0.0.1"
    assert network.resolve_host_address("no-such-host.invalid") is None
    assert network.filter_local_addresses(["localhost", "no-such-host.invalid", "127.0.0.1"]) == \
        ["no-such-host.invalid"]
    loopback = next(iter(network.get_local_intfs()))
    assert network.get_driver_ip([loopback]) == "127.0.0.1"


def test_find_port_binds_a_free_port():
    def bind(addr):
        s = socket.socket()
        s.bind(addr)
        return s

    server, port = network.find_port(bind)
    try:
        assert server.getsockname()[1] == port
    finally:
        server.close()
