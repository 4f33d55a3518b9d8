"""The rendezvous server wrapper, the horovod.run result protocol, and cheap imports."""
import subprocess
import sys

import pytest

from horovod.runner import run_func
from horovod.runner.http import http_client
from horovod.runner.rendezvous import RendezvousServer


def test_rendezvous_server_roundtrip_with_upstream_helpers():
    server = RendezvousServer()
    port = server.start()
    try:
        assert len(server.secret) == 64 and server.port == port
        http_client.put_data_into_kvstore("127.0.0.1", port, "scope", "k", {"a": [1, 2]}, secret=server.key)
        assert http_client.read_data_from_kvstore("127.0.0.1", port, "scope", "k", secret=server.key,
                                                  timeout=5) == {"a": [1, 2]}
    finally:
        server.stop(wait=True)
    with pytest.raises(RuntimeError, match="not started"):
        server.store  # noqa: B018


def test_http_client_needs_a_secret(monkeypatch):
    monkeypatch.delenv("_HOROVOD_SECRET_KEY", raising=False)
    with pytest.raises(ValueError, match="_HOROVOD_SECRET_KEY"):
        http_client.put_data_into_kvstore("127.0.0.1", 1, "s", "k", 1)


class FakeStore:
    def __init__(self):
        self.data = {}

    def get(self, scope, key):
        return self.data.get((scope, key))


def test_result_protocol():
    store = FakeStore()
    store.data[(run_func.RESULT_SCOPE, "0")] = run_func.encode_success([1, "x"])
    try:
        raise KeyError("nope")
    except KeyError as exc:
        import traceback

        store.data[(run_func.RESULT_SCOPE, "1")] = run_func.encode_failure(exc, traceback.format_exc())
    assert run_func.failure_for_rank(store, 0, "h") is None
    error = run_func.failure_for_rank(store, 1, "hostB")
    assert isinstance(error, RuntimeError) and isinstance(error.__cause__, KeyError)
    assert "rank 1 (host hostB)" in str(error) and "KeyError: 'nope'" in str(error)
    with pytest.raises(RuntimeError, match="rank 1"):
        run_func.collect_results(store, 2)
    store.data[(run_func.RESULT_SCOPE, "1")] = run_func.encode_success(None)
    assert run_func.collect_results(store, 2) == [[1, "x"], None]
    with pytest.raises(RuntimeError, match="rank 2 exited without reporting"):
        run_func.collect_results(store, 3)


def test_unpicklable_result_becomes_an_error():
    import threading

    record = run_func.decode(run_func.encode_success(threading.Lock()))
    assert record["ok"] is False and "could not be pickled" in record["repr"]


def test_elastic_constants_for_tooling():
    from horovod.runner.elastic import driver
    from horovod.runner.launch import _run_elastic  # noqa: F401

    assert driver.DISCOVER_HOSTS_FREQUENCY_SECS == 1.0 and driver.ELASTIC_TIMEOUT_SECS == 600


def test_imports_stay_light():
    code = ("import sys, horovod.runner, horovod.runner.launch; "
            "print(sorted(m for m in ('numpy', 'cloudpickle', 'psutil', 'yaml', 'torch', 'tensorflow', 'mpi4py') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
