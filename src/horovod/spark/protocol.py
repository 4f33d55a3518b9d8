"""What the Spark driver and its tasks exchange through the job's rendezvous store (scopes, keys, records).

The driver runs the job's authenticated KV store (:class:`horovod.runner.rendezvous.RendezvousServer`); every task
connects to it with the job secret, which reaches the task inside the Spark task's closure. Records are msgpack
(:func:`horovod.common.wire.pack`); the user's function and results travel as ``horovod.run`` does
(:mod:`horovod.runner.run_func`), cloudpickled, between parties that proved they hold the secret.

- ``spark_tasks/<task>``: a task started (``host``, ``executor``, ``pid``, ``partition``); in elastic jobs also
  its heartbeat time (``beat``).
- ``spark_output/<rank>/<stream>/<seq>``: one line of a rank's stdout or stderr, forwarded to the driver's
  streams (the driver consumes and deletes it).
- ``spark_exit/<rank or worker id>``: how a rank's process ended (``returncode``, ``last_lines``, ``exception``, ``time``,
  where).
- ``spark_elastic_cmd/<task>``: what an elastic task must do next (start a worker, signal it, or finish).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Optional, Sequence

from horovod.common import wire

TASKS_SCOPE = "spark_tasks"
OUTPUT_SCOPE = "spark_output"
EXIT_SCOPE = "spark_exit"
COMMAND_SCOPE = "spark_elastic_cmd"
DONE_SCOPE = "spark_elastic_done"
DONE_KEY = "done"

_EXECUTOR_ID = re.compile(r"executorId=([^&]+)")


@dataclasses.dataclass
class TaskPlace:
    """Where a Spark task runs: its executor's host and id, and the task's partition."""

    host: str
    executor: str
    partition: int

    def describe(self) -> str:
        """``Spark executor 1 (host 10.0.0.5, task 3)``: how error messages name the place."""
        return f"Spark executor {self.executor} (host {self.host}, task {self.partition})"

    def to_record(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> TaskPlace:
        return cls(str(record["host"]), str(record["executor"]), int(record["partition"]))


def executor_id(fallback: str, env: Optional[dict] = None) -> str:
    """This executor's id, read from the log URL a standalone cluster gives its Python workers, else ``fallback``
    (something else that names the executor: its address, or the pid of the process that started this worker)."""
    env = os.environ if env is None else env
    match = _EXECUTOR_ID.search(env.get("SPARK_LOG_URL_STDERR", "") or env.get("SPARK_LOG_URL_STDOUT", ""))
    return match.group(1) if match else fallback


def exit_record(returncode: int, last_lines: list, place: TaskPlace, when: float,
                exception: Sequence[str] = ()) -> bytes:
    """The ``spark_exit`` record of a rank process that ended (``exception``: the first lines of its last
    exception, when its last lines do not show them; see horovod.runner.output_tail)."""
    return wire.pack({"returncode": int(returncode), "last_lines": list(last_lines), "time": float(when),
                      "exception": list(exception), **place.to_record()})
