"""A real Spark for tests: ``local-cluster[2,1,1024]``, two executor JVMs with one core each.

Use it as a context manager or through the module-scoped fixture factory::

    from tests.support.spark import spark_session, spark_fixture

    spark = spark_fixture()              # in a test module: a module-scoped fixture named ``spark``

    def test_something(spark):           # a pyspark.sql.SparkSession
        assert spark.sparkContext.defaultParallelism == 2

    with spark_session() as spark:       # anywhere else (a benchmark script, a one-off check)
        ...

``spark_session(executors=2, conf=None, app_name=..., cores=1)`` starts the driver JVM, a local master and
``executors`` worker JVMs (``cores`` cores and 1 GiB each; executors get 512 MiB), with the UI and the console
progress bar off, the JVMs tuned for short jobs (``JVM_OPTIONS``: C1 only, the serial collector), every JVM bound
to 127.0.0.1, ``spark.default.parallelism`` equal to executors x cores, and the executors' Python being this
interpreter with the repository's ``src`` on its path. ``conf`` adds or overrides Spark settings.

On exit it stops the SparkContext, shuts down the driver JVM (pyspark keeps it for the life of the process
otherwise), kills by pid any JVM it started that is still alive, and removes its temporary directories (Spark's
local dir and the workers' work dir under a private SPARK_HOME of links to pyspark's, which holds each
executor's stdout/stderr). So a test module leaves no JVM
behind and a later module may start a fresh Spark in the same pytest process.

Runs that start Spark are multi-process jobs: run pytest on them under the shared CPU lock.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterator, Optional

import psutil
import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]
WORKER_MEMORY_MB = 1024
# The JVMs of a test's Spark run short jobs on tiny data, where the JIT's optimizing tier and the parallel
# collector cost more CPU than they save: C1 only and the serial collector take the digits estimator's first data
# preparation from about 14 s to 8 s, and a whole cold session with two preparations from 62 s of CPU to 35 s
# (2 cores). They change nothing that Spark computes.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _spark_conf(executors: int, cores: int, tmp: Path, extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    python_path = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")]))
    conf = {
        "spark.master": f"local-cluster[{executors},{cores},{WORKER_MEMORY_MB}]",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "768m",
        "spark.executor.memory": "512m",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.default.parallelism": str(executors * cores),
        "spark.sql.shuffle.partitions": str(executors * cores),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYTHONPATH": python_path,
        "spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.level=warn {JVM_OPTIONS}",
        "spark.executor.extraJavaOptions": JVM_OPTIONS,
    }
    conf.update(extra or {})
    return conf


def _spark_home(tmp: Path) -> Path:
    """A SPARK_HOME of links to pyspark's own, so that the workers' ``work`` dir lands in ``tmp``, not the venv.

    local-cluster's workers put each executor's directory under ``$SPARK_HOME/work``; they take no setting for it.
    """
    import pyspark

    package = Path(pyspark.__file__).parent
    home = tmp / "spark-home"
    home.mkdir()
    for entry in package.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    return home


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _stop(session, gateway_pid: Optional[int]) -> None:
    from pyspark import SparkContext

    started = []
    if gateway_pid is not None and psutil.pid_exists(gateway_pid):
        gateway = psutil.Process(gateway_pid)
        started = [gateway] + gateway.children(recursive=True)
    session.stop()
    gateway_obj = SparkContext._gateway
    if gateway_obj is not None:
        with contextlib.suppress(Exception):
            gateway_obj.shutdown()
        proc = getattr(gateway_obj, "proc", None)
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()  # the driver JVM (PythonGatewayServer) exits when its stdin closes
            with contextlib.suppress(Exception):
                proc.wait(timeout=20)
    SparkContext._gateway = None
    SparkContext._jvm = None
    for process in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(started, timeout=10)


@contextlib.contextmanager
def spark_session(executors: int = 2, conf: Optional[Dict[str, str]] = None,
                  app_name: str = "horovod-tests", cores: int = 1) -> Iterator[SparkSession]:
    """Start ``local-cluster[executors,cores,1024]``, yield its SparkSession, and stop every JVM it started."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        raise RuntimeError("a SparkContext is already running in this process; stop it before starting another")
    tmp = Path(tempfile.mkdtemp(prefix="hvd-spark-"))
    builder = SparkSession.builder.appName(app_name)
    for key, value in _spark_conf(executors, cores, tmp, conf).items():
        builder = builder.config(key, value)
    session = None
    try:
        with _environ(SPARK_HOME=str(_spark_home(tmp)), SPARK_LOCAL_IP="127.0.0.1",
                      SPARK_LOCAL_DIRS=str(tmp / "local")):
            session = builder.getOrCreate()
        session.sparkContext.setLogLevel("WARN")
        proc = getattr(SparkContext._gateway, "proc", None)
        gateway_pid = proc.pid if proc is not None else None
        yield session
    finally:
        if session is not None:
            _stop(session, gateway_pid)
        shutil.rmtree(tmp, ignore_errors=True)


def spark_fixture(executors: int = 2, conf: Optional[Dict[str, str]] = None, cores: int = 1) -> Callable:
    """A module-scoped pytest fixture that yields a SparkSession on ``local-cluster[executors,cores,1024]``."""

    @pytest.fixture(scope="module")
    def spark():
        with spark_session(executors=executors, conf=conf, cores=cores) as session:
            yield session

    return spark
