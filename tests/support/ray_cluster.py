"""A real Ray 2.60 cluster for tests: a head node and a worker node on this machine (``ray.cluster_utils``).

Use it as a context manager or through the module-scoped fixture factory::

    from tests.support.ray_cluster import ray_cluster, ray_cluster_fixture

    ray_two_nodes = ray_cluster_fixture()     # in a test module: a module-scoped fixture

    def test_something(ray_two_nodes):        # the ray.cluster_utils.Cluster, with this process connected
        ...

Each node has ``cpus_per_node`` logical CPUs and a 100 MB object store; the dashboard is off. Ray's files go to
a private temporary directory (``RAY_TMPDIR``), so that nothing is written to ``/tmp/ray`` and a cluster of
someone else's on the machine is never touched. On exit it disconnects, shuts both nodes down, kills by pid any
process it started that is still alive (raylets, GCS, actors' workers), and removes the directory.

:func:`call_with_deadline` runs a call that drives Horovod workers with a timeout below the test's own, and on
expiry raises with every worker actor's stack (:func:`dump_worker_stacks`), as ``tests/support/launch.py`` does
for horovodrun's ranks.

Runs that start Ray are multi-process jobs: run pytest on them under the shared CPU lock.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, List, TypeVar

import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

ROOT = Path(__file__).resolve().parents[2]
OBJECT_STORE_BYTES = 100 * 1024 * 1024
STACK_LINES = 80
T = TypeVar("T")


def _environ(values: dict) -> Callable[[], None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)

    def restore() -> None:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    return restore


def _kill_started(before: set) -> None:
    me = psutil.Process()
    started = [p for p in me.children(recursive=True) if p.pid not in before]
    for process in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(started, timeout=10)


@contextlib.contextmanager
def ray_cluster(nodes: int = 2, cpus_per_node: int = 2) -> Iterator[Cluster]:
    """Start ``nodes`` Ray nodes of ``cpus_per_node`` CPUs on this machine, connect this process, yield the
    cluster; stop everything it started on exit."""
    if ray.is_initialized():
        raise RuntimeError("this process is already connected to Ray; call ray.shutdown() first")
    tmp = Path(tempfile.mkdtemp(prefix="hvdray-"))
    (tmp / "ray").mkdir()
    python_path = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")]))
    restore = _environ({"RAY_TMPDIR": str(tmp), "PYTHONPATH": python_path, "RAY_USAGE_STATS_ENABLED": "0"})
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    cluster = None
    try:
        node_args = {"num_cpus": cpus_per_node, "object_store_memory": OBJECT_STORE_BYTES}
        cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False,
                                                                "temp_dir": str(tmp / "ray")})
        for _ in range(nodes - 1):
            cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        cluster.horovod_tmp = str(tmp)
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=True)
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.shutdown()
        _kill_started(before)
        restore()
        shutil.rmtree(tmp, ignore_errors=True)


def worker_processes() -> List[psutil.Process]:
    """The Horovod worker actors' processes among those this process started (Ray renames them ``ray::<class>``)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if process.cmdline()[:1] and process.cmdline()[0].startswith("ray::BaseHorovodWorker"):
                found.append(process)
    return found


def dump_worker_stacks(cluster: Cluster) -> str:
    """Make every Horovod worker actor print its threads' stacks (SIGUSR1, see ``horovod.ray.worker``) and return
    what their Ray logs hold (the tail of each ``worker-*-<pid>.err``)."""
    workers = worker_processes()
    for process in workers:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGUSR1)
    time.sleep(1.5)
    texts = []
    for process in workers:
        logs = {p.resolve() for p in Path(cluster.horovod_tmp).glob(f"ray/session_*/logs/worker-*-{process.pid}.err")}
        for log in sorted(logs):
            lines = log.read_text(errors="replace").splitlines()[-STACK_LINES:]
            texts.append(f"--- worker actor pid {process.pid} ({log.name}) ---\n" + "\n".join(lines))
    return "\n".join(texts) or "(no Horovod worker actor was running)"


def call_with_deadline(cluster: Cluster, call: Callable[[], T], timeout: float, what: str) -> T:
    """``call()`` (which drives Horovod workers on ``cluster``); when it outlives ``timeout`` seconds, raise
    AssertionError with every worker actor's stack (the caller then shuts its executor down)."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="ray-test-call", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"{what} did not finish within {timeout:.0f} s.\n--- stacks of the worker actors ---\n"
                             f"{dump_worker_stacks(cluster)}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def ray_cluster_fixture(nodes: int = 2, cpus_per_node: int = 2):
    """A module-scoped pytest fixture that yields a :func:`ray_cluster`."""

    @pytest.fixture(scope="module")
    def fixture():
        with ray_cluster(nodes, cpus_per_node) as cluster:
            yield cluster

    return fixture


def run_ray_script(args: List[str], timeout: float) -> subprocess.CompletedProcess:
    """Run a script that starts its own local Ray (an example, a benchmark) with its Ray files in a private
    temporary directory (short: Ray's socket paths must fit 107 bytes); afterwards kill whatever of its session is
    still alive and remove the directory. On timeout raise AssertionError with its output."""
    tmp = Path(tempfile.mkdtemp(prefix="hvdray-"))
    (tmp / "ray").mkdir()
    python_path = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "RAY_TMPDIR": str(tmp), "PYTHONPATH": python_path, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(ROOT),
                            start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(proc.pid)
        out, _ = proc.communicate()
        raise AssertionError(f"{' '.join(args)} did not finish within {timeout:.0f} s:\n{out}") from None
    finally:
        _kill_session(proc.pid)
        shutil.rmtree(tmp, ignore_errors=True)
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


def _kill_session(sid: int) -> None:
    leftovers = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(process.pid) == sid:
                leftovers.append(process)
                process.kill()
    psutil.wait_procs(leftovers, timeout=10)
