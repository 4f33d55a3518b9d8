"""The Spark-driver pieces that ``run`` and ``run_elastic`` share: the SparkContext, the address tasks reach the
rendezvous at, the check for enough task slots, the background Spark job, and the forwarding of rank output."""
from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence

from horovod.common import config, wire
from horovod.runner.common.util.network import get_driver_ip
from horovod.runner.process import OutputSink

from . import protocol

log = logging.getLogger("horovod.spark")  # a named channel: see horovod.common.logging_setup

_LOST_TASK = re.compile(r"Lost task (\d+)\.\d+ in stage \S+ \(TID \d+\) \((\S+) executor ([^)]+)\)")
_BARRIER_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)")


def spark_context():
    """The running SparkContext, or the one ``SparkSession.builder.getOrCreate()`` gives (upstream does the same)."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        from pyspark.sql import SparkSession

        sc = SparkSession.builder.getOrCreate().sparkContext
    return sc


def start_timeout_seconds(start_timeout: Optional[float]) -> float:
    """``start_timeout``, else ``HOROVOD_SPARK_START_TIMEOUT``, else 600 seconds."""
    return float(start_timeout) if start_timeout is not None else float(config.get("HOROVOD_SPARK_START_TIMEOUT"))


def driver_address(sc, nics: Optional[Sequence[str]]) -> str:
    """The address Spark tasks reach the rendezvous at: that of the first of ``nics``, else Spark's own
    ``spark.driver.host`` (which the executors already use to reach the driver)."""
    if nics:
        return get_driver_ip(list(nics))
    return sc.getConf().get("spark.driver.host") or get_driver_ip(None)


def cluster_slots(sc) -> Optional[int]:
    """How many tasks the cluster can run at once now (Spark's own count for barrier stages), None if unknown."""
    try:
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception as exc:  # a private Spark API: never fail the job because it changed
        log.debug("could not ask Spark for its number of task slots: %s", exc)
        return None


def wait_for_slots(sc, num_proc: int, timeout: float, what: str) -> None:
    """Return once the cluster can run ``num_proc`` tasks at once; RuntimeError after ``timeout`` seconds.

    Spark itself retries an oversized barrier stage 40 times, 15 s apart, before it fails the job.
    """
    deadline = time.monotonic() + timeout
    while True:
        slots = cluster_slots(sc)
        if slots is None or slots >= num_proc:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"{what}: timed out after {timeout:.0f}s waiting for {num_proc} Spark task slots: the cluster has "
                f"{slots} (executor cores / spark.task.cpus). Horovod runs one rank per task and needs all "
                f"of them at once. Lower num_proc to at most {slots}, or give Spark more executors or cores "
                "(start_timeout / HOROVOD_SPARK_START_TIMEOUT bounds this wait).")
        time.sleep(0.5)


def forward_output(store, stdout=None, stderr=None, prefix_timestamp: bool = False) -> None:
    """Write every line the tasks forward (``spark_output``) to ``stdout``/``stderr`` (default: this process's),
    with horovodrun's ``[rank]<stream>:`` prefix."""
    sink = OutputSink(stdout, stderr, prefix_timestamp)

    def on_line(key: str, value: bytes) -> None:
        label, stream, line = wire.unpack(value)
        sink.write(int(label), str(stream), bytes(line) + b"\n")
        store.delete(protocol.OUTPUT_SCOPE, key)

    store.watch(protocol.OUTPUT_SCOPE, on_line)


class SparkJob:
    """A Spark action (``action()``, e.g. an RDD's ``collect``) run in a background thread under a job group of its
    own, so that the driver can watch the ranks meanwhile and cancel every task of the job at once."""

    def __init__(self, sc, action: Callable[[], Any], description: str) -> None:
        from pyspark import InheritableThread

        self._sc = sc
        self._action = action
        self.group = f"horovod.spark.{uuid.uuid4().hex[:12]}"
        self._description = description
        self.done = threading.Event()
        self.error: Optional[BaseException] = None
        self.result: Any = None
        self._thread = InheritableThread(target=self._run, name="horovod-spark-job", daemon=True)

    def start(self) -> SparkJob:
        self._thread.start()
        return self

    def _run(self) -> None:
        self._sc.setJobGroup(self.group, self._description, interruptOnCancel=True)
        try:
            self.result = self._action()
        except BaseException as exc:  # reported by the supervising thread
            self.error = exc
        finally:
            self.done.set()

    def cancel(self, wait: float = 30.0) -> None:
        """Cancel every task of the job and wait up to ``wait`` seconds for the action to return."""
        if not self.done.is_set():
            try:
                self._sc.cancelJobGroup(self.group)
            except Exception as exc:
                log.warning("could not cancel the Spark job group %s: %s", self.group, exc)
        self.done.wait(wait)

    def error_summary(self) -> str:
        """The first line of Spark's error (Py4J errors are long Java traces), with the failed task's executor
        and Spark's reason for a lost executor, where the error gives them."""
        text = spark_error_text(self.error)
        lines = text.strip().splitlines()
        summary = lines[0] if lines else repr(self.error)
        lost = _LOST_TASK.search(text)
        if lost:
            summary = f"task {lost.group(1)} on Spark executor {lost.group(3)} (host {lost.group(2)}) failed: {summary}"
        reason = next((line.strip() for line in lines[1:] if "ExecutorLostFailure" in line), None)
        return f"{summary} {reason}" if reason else summary


def failed_partition(error: Optional[BaseException]) -> Optional[int]:
    """The partition of the task that failed a Spark job, as Spark's error names it; None if it names none."""
    text = spark_error_text(error)
    match = _BARRIER_TASK.search(text) or _LOST_TASK.search(text)
    return int(match.group(1)) if match else None


def spark_error_text(error: Optional[BaseException]) -> str:
    """The message of a Spark error: the Java exception's for a Py4J error (whose ``str`` may fail)."""
    if error is None:
        return ""
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            return str(java.toString())
        except Exception:
            pass
    try:
        return str(error)
    except Exception:
        return repr(error)
