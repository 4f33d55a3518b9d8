"""The Spark-task side of ``horovod.spark.run_elastic``: a task that hosts the elastic job's workers.

Each task registers under ``spark_tasks/<partition>.<attempt>`` and renews that record every
:data:`HEARTBEAT_SECONDS` (the driver counts a task as lost when the renewals stop). It then serves the driver's
commands, ``spark_elastic_cmd/<task>/<n>`` for n = 0, 1, ...: ``start`` a worker (a rank process, as in
:mod:`horovod.spark.task`) with the given variables, ``signal`` it, or ``finish``. A worker's end is recorded under
``spark_exit/<worker id>``. The task returns once the driver puts ``spark_elastic_done/done`` or goes away.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Callable, Dict, Iterable, Iterator, Mapping, Optional

from horovod.common import wire
from horovod.common.kvstore import KVStoreClient

from . import protocol
from .task import RankProcess, rank_env, run_and_report

log = logging.getLogger("horovod.spark")  # a named channel: see horovod.common.logging_setup

HEARTBEAT_SECONDS = 1.0
COMMAND_POLL_SECONDS = 1.0


def task_host(place: protocol.TaskPlace) -> str:
    """The elastic driver's host for a task: its executor. A lost or failing executor is blacklisted as a whole,
    and the executor Spark starts in its place is a new host, so the job can grow back onto it."""
    return f"{place.host}-executor-{place.executor}"


def make_elastic_task_fn(addr: str, port: int, secret: str, user_env: Optional[Mapping[str, str]],
                         connect_timeout: float) -> Callable[[Iterable], Iterator[str]]:
    """The ``mapPartitions`` function of an elastic job's tasks (the secret travels in this closure)."""
    user_env = dict(user_env or {})

    def horovod_spark_elastic_task(_: Iterable) -> Iterator[str]:
        from horovod.spark.elastic_task import serve_workers

        yield serve_workers(addr, port, secret, user_env, connect_timeout)

    return horovod_spark_elastic_task


class _Heartbeat:
    """Renews this task's registration until stopped."""

    def __init__(self, client: KVStoreClient, key: str, record: dict) -> None:
        self._client, self._key, self._record = client, key, record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="horovod-spark-heartbeat", daemon=True)
        self._beat()
        self._thread.start()

    def _beat(self) -> None:
        self._client.put(protocol.TASKS_SCOPE, self._key, wire.pack(self._record))

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._beat()
            except (OSError, ConnectionError):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


def serve_workers(addr: str, port: int, secret: str, user_env: Dict[str, str], connect_timeout: float) -> str:
    """Register this task, run the workers the driver asks for, and return the task's key when the job ends."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    key = f"{ctx.partitionId()}.{ctx.attemptNumber()}"
    place = protocol.TaskPlace(socket.gethostname(), protocol.executor_id(f"pid{os.getppid()}"), ctx.partitionId())
    record = {**place.to_record(), "elastic_host": task_host(place)}
    client = KVStoreClient(addr, port, bytes.fromhex(secret), timeout=connect_timeout)
    commands = KVStoreClient(addr, port, bytes.fromhex(secret), timeout=connect_timeout)
    heartbeat = _Heartbeat(client, key, record)
    workers = []
    try:
        _serve(commands, client, key, place, addr, port, secret, user_env, workers)
    except (OSError, ConnectionError) as exc:
        log.warning("horovod.spark: task %s lost the driver (%s); stopping its worker", key, exc)
    finally:
        heartbeat.stop()
        for worker, waiter in workers:
            worker.stop()
            waiter.join(timeout=5.0)
        commands.close()
        client.close()
    return key


def _serve(commands: KVStoreClient, client: KVStoreClient, key: str, place: protocol.TaskPlace, addr: str,
           port: int, secret: str, user_env: Dict[str, str], workers: list) -> None:
    seq = 0
    while commands.get(protocol.DONE_SCOPE, protocol.DONE_KEY) is None:
        try:
            [payload] = commands.wait(protocol.COMMAND_SCOPE, [f"{key}/{seq}"], COMMAND_POLL_SECONDS)
        except TimeoutError:
            continue
        seq += 1
        command = wire.unpack(payload)
        if command["op"] == "finish":
            return
        if command["op"] == "signal":
            if workers:
                workers[-1][0].signal(int(command["signum"]))
            continue
        env = rank_env(user_env, {str(k): str(v) for k, v in command["env"].items()})
        worker = RankProcess(client, addr, port, secret, env, None, int(command["label"]))
        waiter = threading.Thread(target=run_and_report, args=(client, worker, str(command["worker"]), place),
                                  name="horovod-spark-worker", daemon=True)
        waiter.start()
        workers.append((worker, waiter))
