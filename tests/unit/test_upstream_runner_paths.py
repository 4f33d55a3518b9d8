"""Upstream's runner module paths that its own runner tests and third-party integrations import, and what the
objects under them do here: running shell commands, codecs, secrets, timeouts, pipes, the elastic rendezvous
handler, worker notifications and the launcher's helpers."""
import hashlib
import importlib
import io
import os
import queue
import re
import socket
import subprocess
import threading
import time
from types import SimpleNamespace
from unittest import mock

import pytest

from horovod.common.elastic import HostUpdateResult, WorkerNotificationManager
from horovod.common.kvstore import KVStoreClient
from horovod.runner import launch, mpi_run
from horovod.runner.common.util import codec, host_hash, safe_shell_exec, secret, timeout, tiny_shell_exec
from horovod.runner.common.util.hosts import SlotInfo
from horovod.runner.common.util.settings import Settings
from horovod.runner.driver import driver_service
from horovod.runner.elastic import rendezvous as elastic_rendezvous
from horovod.runner.elastic.discovery import FixedHosts
from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.elastic.worker import WorkerNotificationClient, WorkerNotificationService
from horovod.runner.gloo_run import gloo_run
from horovod.runner.http.http_server import RendezvousHandler, RendezvousServer
from horovod.runner.process import WorkerExit
from horovod.runner.util import network
from horovod.runner.util.streams import Pipe

pytestmark = pytest.mark.timeout(60)

UPSTREAM_NAMES = {
    "horovod.runner.common.util.codec": ["dumps_base64", "loads_base64"],
    "horovod.runner.common.util.config_parser": [],
    "horovod.runner.common.util.safe_shell_exec": ["execute", "prefix_connection",
                                                    "terminate_executor_shell_and_children",
                                                    "GRACEFUL_TERMINATION_TIME_S"],
    "horovod.runner.common.util.secret": ["make_secret_key", "compute_digest", "check_digest", "HOROVOD_SECRET_KEY"],
    "horovod.runner.common.util.settings": ["Settings"],
    "horovod.runner.common.util.timeout": ["Timeout", "TimeoutException"],
    "horovod.runner.common.util.host_hash": ["_hash", "host_hash"],
    "horovod.runner.common.util.hosts": ["get_host_assignments", "parse_hosts", "HostInfo", "SlotInfo"],
    "horovod.runner.common.util.tiny_shell_exec": ["execute"],
    "horovod.runner.driver.driver_service": ["HorovodRunDriverService", "HorovodRunDriverClient",
                                            "get_common_interfaces", "get_local_interfaces"],
    "horovod.runner.gloo_run": ["gloo_run", "launch_gloo"],
    "horovod.runner.js_run": ["js_run", "generate_jsrun_rankfile"],
    "horovod.runner.launch": ["_check_all_hosts_ssh_successful", "_run", "run_controller"],
    "horovod.runner.mpi_run": ["_get_mpi_implementation", "_get_mpi_implementation_flags", "_LARGE_CLUSTER_THRESHOLD",
                               "mpi_available", "mpi_run", "_OMPI_IMPL", "_SMPI_IMPL", "_MPICH_IMPL", "_IMPI_IMPL",
                               "_UNKNOWN_IMPL", "_MISSING_IMPL"],
    "horovod.runner.util.threads": ["in_thread"],
    "horovod.runner.util.network": ["_get_local_host_addresses", "get_local_host_addresses"],
    "horovod.runner.util.streams": ["Pipe"],
    "horovod.runner.elastic.discovery": ["FixedHosts", "HostDiscovery", "HostManager"],
    "horovod.runner.elastic.driver": ["ElasticDriver"],
    "horovod.runner.elastic.rendezvous": ["create_rendezvous_handler", "GET_RANK_AND_SIZE", "PUT_WORKER_ADDRESSES"],
    "horovod.runner.elastic.settings": ["ElasticSettings"],
    "horovod.runner.elastic.worker": ["WorkerNotificationManager", "WorkerNotificationService",
                                      "WorkerNotificationClient"],
    "horovod.runner.http.http_server": ["RendezvousServer", "RendezvousHandler", "KVStoreHandler"],
}


@pytest.mark.parametrize("module", sorted(UPSTREAM_NAMES))
def test_upstream_paths_import_with_their_names(module):
    mod = importlib.import_module(module)
    assert [name for name in UPSTREAM_NAMES[module] if not hasattr(mod, name)] == []


# --- safe_shell_exec ------------------------------------------------------------------------------------------

def test_execute_returns_the_exit_code_and_forwards_both_streams():
    out, err = io.StringIO(), io.StringIO()
    assert safe_shell_exec.execute("echo hello; echo oops >&2", stdout=out, stderr=err) == 0
    assert out.getvalue() == "hello\n" and err.getvalue() == "oops\n"
    assert safe_shell_exec.execute("sh -c 'exit 3'", stdout=io.StringIO(), stderr=io.StringIO()) == 3


def test_execute_prefixes_lines_with_index_and_stream():
    out, err = io.StringIO(), io.StringIO()
    code = safe_shell_exec.execute("printf 'a\\rb\\nlast'; echo bad >&2", stdout=out, stderr=err, index=3)
    assert code == 0
    assert out.getvalue() == "[3]<stdout>:a\r[3]<stdout>:b\n[3]<stdout>:last"
    assert err.getvalue() == "[3]<stderr>:bad\n"
    stamped = io.StringIO()
    safe_shell_exec.execute("echo x", stdout=stamped, stderr=io.StringIO(), index=0,
                            prefix_output_with_timestamp=True)
    assert re.fullmatch(r"\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4}\[0\]<stdout>:x\n", stamped.getvalue())


def test_execute_passes_env():
    out = io.StringIO()
    assert safe_shell_exec.execute("echo $HVD_TEST_VAR", env={"HVD_TEST_VAR": "42", "PATH": os.environ["PATH"]},
                                   stdout=out, stderr=io.StringIO()) == 0
    assert out.getvalue() == "42\n"


def test_an_event_stops_the_command_quickly():
    event = threading.Event()
    threading.Timer(0.2, event.set).start()
    start = time.monotonic()
    code = safe_shell_exec.execute("sleep 30; echo never", stdout=io.StringIO(), stderr=io.StringIO(),
                                   events=[event])
    assert time.monotonic() - start < 5
    assert code == 143          # 128 + SIGTERM, as upstream reports a signal


def test_terminate_executor_shell_and_children():
    import psutil

    proc = subprocess.Popen("sleep 30 & sleep 30; wait", shell=True, start_new_session=True)
    deadline = time.monotonic() + 5
    while len(psutil.Process(proc.pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    children = psutil.Process(proc.pid).children()
    start = time.monotonic()
    safe_shell_exec.terminate_executor_shell_and_children(proc.pid)
    assert time.monotonic() - start < 4
    proc.wait(timeout=5)
    _, alive = psutil.wait_procs(children, timeout=2)
    assert len(children) == 2 and alive == []


def test_tiny_shell_exec_returns_output_and_exit_code():
    output, code = tiny_shell_exec.execute("echo hi; echo err >&2; exit 2")
    assert code == 2 and sorted(output.splitlines(keepends=True)) == ["err\n", "hi\n"]   # two pipes: any order


# --- codec, secret, timeout, host_hash, streams ---------------------------------------------------------------

def test_codec_round_trips_objects_and_functions():
    obj = {"a": [1, 2], "b": (3.0, "x")}
    encoded = codec.dumps_base64(obj)
    assert isinstance(encoded, str) and codec.loads_base64(encoded) == obj
    raw = codec.dumps_base64(lambda x: x + 1, to_ascii=False)
    assert isinstance(raw, bytes) and codec.loads_base64(raw)(1) == 2


def test_secret_digests():
    key = secret.make_secret_key()
    assert len(key) == secret.SECRET_LENGTH and key != secret.make_secret_key()
    digest = secret.compute_digest(key, b"message")
    assert len(digest) == secret.DIGEST_LENGTH
    assert secret.check_digest(key, b"message", digest)
    assert not secret.check_digest(key, b"massage", digest)
    assert not secret.check_digest(secret.make_secret_key(), b"message", digest)
    assert secret.HOROVOD_SECRET_KEY == "_HOROVOD_SECRET_KEY"


def test_timeout():
    t = timeout.Timeout(0.1, "Timed out waiting for {activity}. Please check the hosts.")
    assert 0 < t.remaining() <= 0.1 and not t.timed_out()
    t.check_time_out_for("nothing")
    time.sleep(0.15)
    assert t.timed_out() and t.remaining() == 0
    with pytest.raises(timeout.TimeoutException,
                       match=r"^Timed out waiting for tasks\. Please check the hosts\. Timeout after 0\.1 seconds\.$"):
        t.check_time_out_for("tasks")
    with pytest.raises(timeout.TimeoutException, match=r"^no tasks\. Timeout after 0 seconds\.$"):
        timeout.Timeout(0, "no {activity}").check_time_out_for("tasks")


def test_host_hash():
    assert host_hash._hash("abc") == hashlib.md5(b"abc").hexdigest()
    h = host_hash.host_hash()
    assert h == host_hash.host_hash() and h.startswith(socket.gethostname().split(".")[0] + "-")
    assert host_hash.host_hash(salt="job1") != h and host_hash.host_hash(salt="") == h


def test_pipe_hands_chunks_from_a_writer_to_a_reader():
    pipe = Pipe()
    writer = threading.Thread(target=lambda: [pipe.write(chunk) for chunk in ("abc", "defg")] and pipe.close())
    writer.start()
    assert pipe.read(2) == "ab"
    assert pipe.read() == "c"
    assert pipe.read(10) == "defg"
    writer.join(5)
    assert pipe.read() is None
    with pytest.raises(RuntimeError, match="closed"):
        pipe.write("late")


def test_pipe_as_execute_output():
    pipe = Pipe()
    lines = []
    reader = threading.Thread(target=lambda: [lines.append(c) for c in iter(pipe.read, None)])
    reader.start()
    assert safe_shell_exec.execute("echo one; echo two", stdout=pipe, stderr=io.StringIO()) == 0
    pipe.close()
    reader.join(5)
    assert "".join(lines) == "one\ntwo\n"


# --- the elastic rendezvous handler and notifications ---------------------------------------------------------

class _StubDriver:
    def __init__(self):
        self.ready, self.registered = [], []

    def record_ready(self, host, local_rank):
        self.ready.append((host, local_rank))

    def get_slot_info(self, host, local_rank):
        return SlotInfo(hostname=host, rank=1, local_rank=local_rank, cross_rank=0, size=2, local_size=2,
                        cross_size=1)

    def register_worker_server(self, host, local_rank, addresses, secret_key):
        self.registered.append((host, local_rank, addresses, secret_key))


def test_rendezvous_handler_answers_upstream_scopes_over_the_wire():
    driver = _StubDriver()
    server = RendezvousServer()
    port = server.start(host="127.0.0.1")
    assert server.start(elastic_rendezvous.create_rendezvous_handler(driver)) == port
    client = KVStoreClient("127.0.0.1", port, server.key)
    try:
        assert client.get(elastic_rendezvous.GET_RANK_AND_SIZE, "host-1:1") == b"1,2,1,2,0,1"
        assert driver.ready == [("host-1", 1)]
        value = codec.dumps_base64(({"lo": [("127.0.0.1", 1234)]}, b"key")).encode()
        client.put(elastic_rendezvous.PUT_WORKER_ADDRESSES, "host-1:1", value)
        assert driver.registered == [("host-1", 1, {"lo": [("127.0.0.1", 1234)]}, b"key")]
        assert client.get(elastic_rendezvous.PUT_WORKER_ADDRESSES, "host-1:1") == value
        client.put("other", "k", b"v")                  # other scopes are the plain store
        assert client.get("other", "k") == b"v" and server.store.get("other", "k") == b"v"
    finally:
        client.close()
        server.stop(wait=True)


def test_handler_subclasses_call_the_base_like_upstream():
    class Upper(RendezvousHandler):
        def _get_value(self, scope, key):
            value = super(RendezvousHandler, self)._get_value(scope, key)
            return None if value is None else value.upper()

    with RendezvousServer() as server:
        server.start(Upper)
        server.store.put("s", "k", b"abc")
        assert server.store.get("s", "k") == b"ABC"


class _FakeWorker:
    """What the elastic driver reads of a worker process; it exits when told."""

    def __init__(self, info, events):
        self.info, self.events = info, events
        self.proc = SimpleNamespace(returncode=None, pid=0, poll=lambda: self.proc.returncode,
                                    wait=lambda timeout=None: self.proc.returncode)
        self.spec = SimpleNamespace(rank=info.rank)

    def exit(self, code):
        self.proc.returncode = code
        self.events.put(("exit", self))

    def signal_group(self, signum):
        if self.proc.returncode is None:
            self.exit(-signum)
        return True

    def join_output(self, timeout):
        return True

    def close(self):
        pass

    def exit_info(self):
        return WorkerExit(self.info.rank, self.info.hostname, self.proc.returncode, "fake", [])


def test_rendezvous_handler_answers_rank_and_size_from_our_elastic_driver():
    rendezvous = RendezvousServer()
    driver = ElasticDriver(rendezvous, FixedHosts({"127.0.0.1": 2}), 2, timeout=5)     # upstream's order
    assert rendezvous.started
    port = rendezvous.start(elastic_rendezvous.create_rendezvous_handler(driver))
    workers = []
    runner = threading.Thread(target=driver.run, args=(2, lambda info, events, _: workers.append(
        _FakeWorker(info, events)) or workers[-1]), daemon=True)
    client = KVStoreClient("127.0.0.1", port, rendezvous.key)
    try:
        assert client.get(elastic_rendezvous.GET_RANK_AND_SIZE, "127.0.0.1:0") == b"-1,-1,-1,-1,-1,-1"
        runner.start()
        deadline = time.monotonic() + 10
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        answers = {client.get(elastic_rendezvous.GET_RANK_AND_SIZE, f"127.0.0.1:{i}") for i in range(2)}
        assert answers == {b"0,2,0,2,0,1", b"1,2,1,2,0,1"}
        for worker in workers:
            worker.exit(0)
        runner.join(10)
        assert not runner.is_alive()
    finally:
        client.close()
        driver.stop()
        rendezvous.stop(wait=True)


def test_worker_notifications_travel_through_the_store():
    with RendezvousServer() as server:
        manager = WorkerNotificationManager()
        received = queue.SimpleQueue()
        class Listener:
            def on_hosts_updated(self, timestamp, res):
                received.put((timestamp, res))

        manager.register_listener(Listener())
        service = WorkerNotificationService(server.key, None, manager, "127.0.0.1", server.port)
        try:
            assert service.addresses() == {"rendezvous": [("127.0.0.1", server.port)]}
            WorkerNotificationClient(server).notify_hosts_updated(12.5, HostUpdateResult.added)
            remote = WorkerNotificationClient(("127.0.0.1", server.port), server.key)
            remote.notify_hosts_updated(13.0, HostUpdateResult.removed)
            remote.close()
            assert received.get(timeout=5) == (12.5, HostUpdateResult.added)
            assert received.get(timeout=5) == (13.0, HostUpdateResult.removed)
        finally:
            service.shutdown()


# --- the launcher's helpers ----------------------------------------------------------------------------------

def test_gloo_run_runs_the_command_on_every_slot(capfd):
    settings = Settings(num_proc=2, hosts="localhost:2")
    gloo_run(settings, None, dict(os.environ), "127.0.0.1", ["sh", "-c", "echo rank $HOROVOD_RANK of $HOROVOD_SIZE"])
    out = capfd.readouterr().out
    assert "[0]<stdout>:rank 0 of 2" in out and "[1]<stdout>:rank 1 of 2" in out


@pytest.mark.parametrize("use_gloo,use_mpi,use_js,mpi,lsf,jsrun,expected", [
    (True, False, False, True, False, False, "gloo"),
    (False, True, False, True, False, False, "mpi"),
    (False, True, False, False, False, False, "MPI support has not been built"),
    (False, False, True, True, True, False, "js"),
    (False, False, True, True, False, False, "did not detect an LSF job"),
    (False, False, False, True, True, True, "js"),
    (False, False, False, True, False, True, "mpi"),
    (False, False, False, False, False, False, "gloo"),
])
def test_run_controller_picks_upstream_launcher(monkeypatch, use_gloo, use_mpi, use_js, mpi, lsf, jsrun, expected):
    monkeypatch.setattr(launch, "mpi_built", lambda: mpi)
    monkeypatch.setattr(launch.lsf.LSFUtils, "using_lsf", staticmethod(lambda: lsf))
    monkeypatch.setattr(launch, "is_jsrun_installed", lambda: jsrun)
    called = []
    runners = {name: (lambda name=name: called.append(name)) for name in ("gloo", "mpi", "js")}
    if expected in runners:
        launch.run_controller(use_gloo, runners["gloo"], use_mpi, runners["mpi"], use_js, runners["js"], 2)
        assert called == [expected]
    else:
        with pytest.raises(ValueError, match=expected):
            launch.run_controller(use_gloo, runners["gloo"], use_mpi, runners["mpi"], use_js, runners["js"], 2)
        assert called == []


def test_check_all_hosts_ssh_successful(monkeypatch):
    monkeypatch.setattr(launch.ssh, "check_ssh", lambda host, port, identity: None)
    assert launch._check_all_hosts_ssh_successful(["a", "b"]) is True
    monkeypatch.setattr(launch.ssh, "check_ssh", lambda host, port, identity: "refused" if host == "b" else None)
    assert launch._check_all_hosts_ssh_successful(["a", "b"], ssh_port=22) is None


@pytest.mark.parametrize("output,exit_code,expected", [
    ("mpirun (Open MPI) 4.1.5\n\nReport bugs to http://www.open-mpi.org/community/help/\n", 0, "OpenMPI"),
    ("OpenRTE", 0, "OpenMPI"),
    ("IBM Spectrum MPI", 0, "SpectrumMPI"),
    ("HYDRA build details:\n    Version:           4.1\n", 0, "MPICH"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.1", 0, "IntelMPI"),
    ("Unknown MPI v1.00", 0, "Unknown"),
    ("output", 1, "Missing"),
    (None, None, "Missing"),
])
def test_get_mpi_implementation(output, exit_code, expected):
    result = None if output is None else (output, exit_code)
    env = {"PATH": "/nonexistent"}
    with mock.patch.object(mpi_run.tiny_shell_exec, "execute", return_value=result) as execute:
        assert mpi_run._get_mpi_implementation(env) == expected
        assert mpi_run.mpi_available(env) == (expected not in ("Unknown", "Missing"))
    execute.assert_called_with(mock.ANY, env)


def test_get_mpi_implementation_flags():
    version = ("mpirun (Open MPI) 5.0.3", 0)
    with mock.patch.object(mpi_run.tiny_shell_exec, "execute", return_value=version):
        assert mpi_run._get_mpi_implementation_flags(False) == ([], ["--bind-to none", "--map-by slot"], "OpenMPI")
    with mock.patch.object(mpi_run.tiny_shell_exec, "execute", return_value=("IBM Spectrum MPI", 0)):
        flags, binding, impl = mpi_run._get_mpi_implementation_flags(True)
        assert (flags, impl) == (["-tcp"], "SpectrumMPI") and binding[0] == "--bind-to socket"
    with mock.patch.object(mpi_run.tiny_shell_exec, "execute", return_value=None):
        assert mpi_run._get_mpi_implementation_flags(False) == (None, None, None)
    assert mpi_run._LARGE_CLUSTER_THRESHOLD == 64


def test_driver_service_interfaces():
    settings = Settings(num_proc=1, hosts="localhost:1")
    loopback = network.get_local_intfs()
    assert loopback and driver_service.get_local_interfaces(settings) == loopback
    assert driver_service.get_common_interfaces(settings, ["localhost", "127.0.0.1"]) == loopback
    assert driver_service.get_common_interfaces(Settings(1, "h:1", nics=["eth9"]), ["h"], ["h"]) == {"eth9"}
    with pytest.raises(NotImplementedError, match="rendezvous store"):
        driver_service.HorovodRunDriverService(2, b"key", None)


def test_local_host_addresses():
    assert "127.0.0.1" in network._get_local_host_addresses()
    assert network.get_local_host_addresses() == network._get_local_host_addresses()

