"""The driver-side parts of ``horovod.spark.run_elastic`` that stand in for hosts and processes.

- :class:`SparkTaskDiscovery`: the hosts are the executors whose tasks are alive (renewing their registration),
  with one slot per live task; a lost executor disappears from it, and the executor Spark starts in its place
  (rerunning the lost tasks) appears as a new host.
- :class:`SparkTaskWorkers`: ``create_worker`` sends a free task on the slot's executor a ``start`` command and
  returns a :class:`SparkWorker`, which stands for the rank process as the elastic driver expects (its exit status
  comes back through the store, and a worker whose task stops renewing is reported as lost).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import signal
import threading
import time
from typing import Callable, Deque, Dict, List, Optional, Sequence

from horovod.common import wire
from horovod.common.elastic_rendezvous import WORKER_ID_ENV
from horovod.runner.common.util.hosts import SlotInfo
from horovod.runner.elastic.discovery import HostDiscovery
from horovod.runner.gloo_run import slot_env
from horovod.runner.output_tail import TAIL_LINES
from horovod.runner.process import RemoteProcess, WorkerExit, WorkerSpec

from . import protocol

log = logging.getLogger("horovod.spark")  # a named channel: see horovod.common.logging_setup

LOST_AFTER_SECONDS = 5.0     # a task that renewed its registration this long ago is gone


class SparkTaskDiscovery(HostDiscovery):
    """Hosts and slots from the live Spark tasks: ``{executor host: live tasks on it}``."""

    def __init__(self, store) -> None:
        self._lock = threading.Lock()
        self._seen: Dict[str, float] = {}            # task key -> when its registration was last renewed
        self._records: Dict[str, dict] = {}
        store.watch(protocol.TASKS_SCOPE, self._on_beat)

    def _on_beat(self, key: str, value: bytes) -> None:
        with self._lock:
            self._seen[key] = time.monotonic()
            self._records[key] = wire.unpack(value)

    def live_tasks(self) -> Dict[str, dict]:
        """The registration records of the tasks that are alive, by task key."""
        now = time.monotonic()
        with self._lock:
            return {k: self._records[k] for k, seen in self._seen.items() if now - seen < LOST_AFTER_SECONDS}

    def is_alive(self, key: str) -> bool:
        return key in self.live_tasks()

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        slots: Dict[str, int] = {}
        for record in self.live_tasks().values():
            slots[record["elastic_host"]] = slots.get(record["elastic_host"], 0) + 1
        return slots


@dataclasses.dataclass
class SparkWorker:
    """One worker of the elastic job, running in the Spark task ``task``."""

    spec: WorkerSpec
    task: str
    send: Callable[[str, dict], None]
    proc: RemoteProcess = dataclasses.field(default_factory=RemoteProcess)
    tail: Deque[str] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    exception: List[str] = dataclasses.field(default_factory=list)      # its last exception's first lines, if unseen

    def signal_group(self, signum: int) -> bool:
        if self.proc.poll() is not None:
            return False
        self.send(self.task, {"op": "signal", "signum": int(signum)})
        return True

    def join_output(self, timeout: float) -> bool:
        return True                     # the task forwards the output itself

    def close(self) -> None:
        pass

    def exit_info(self) -> WorkerExit:
        return WorkerExit(self.spec.rank, self.spec.hostname, self.proc.returncode if self.proc.returncode
                          is not None else -1, self.spec.command_text, list(self.tail), list(self.exception))


class SparkTaskWorkers:
    """Starts workers in free live tasks and reports their ends to the driver's event queue."""

    def __init__(self, store, discovery: SparkTaskDiscovery, variables: Dict[str, str]) -> None:
        self._store = store
        self._discovery = discovery
        self._variables = variables
        self._lock = threading.Lock()
        self._seq: Dict[str, int] = {}
        self._running: Dict[str, tuple] = {}            # worker id -> (worker, events)
        self._stop = threading.Event()
        store.watch(protocol.EXIT_SCOPE, self._on_exit)
        self._monitor = threading.Thread(target=self._watch_tasks, name="horovod-spark-tasks", daemon=True)
        self._monitor.start()

    def send(self, task: str, command: dict) -> None:
        with self._lock:
            seq = self._seq.get(task, 0)
            self._seq[task] = seq + 1
        self._store.put(protocol.COMMAND_SCOPE, f"{task}/{seq}", wire.pack(command))

    def create_worker(self, slot: SlotInfo, events: queue.SimpleQueue, worker_id: str) -> SparkWorker:
        """The driver's ``create_worker``: start ``worker_id`` for ``slot`` in a free task of its executor."""
        variables = {**self._variables, **slot_env(slot), WORKER_ID_ENV: worker_id}
        command_text = f"horovod.spark.rank for {worker_id}"
        spec = WorkerSpec(slot.rank, slot.hostname, [], {}, command_text, command_text=command_text)
        with self._lock:
            busy = {w.task for w, _ in self._running.values()}
            free = [key for key, record in sorted(self._discovery.live_tasks().items())
                    if record["elastic_host"] == slot.hostname and key not in busy]
            task = free[0] if free else ""
            worker = SparkWorker(spec, task, self.send)
            self._running[worker_id] = (worker, events)
        if not task:
            self._end(worker_id, -signal.SIGKILL, f"no live Spark task on {slot.hostname} to run it")
        else:
            log.debug("starting %s as rank %d in Spark task %s", worker_id, slot.rank, task)
            self.send(task, {"op": "start", "env": variables, "label": slot.rank, "worker": worker_id})
        return worker

    def _end(self, worker_id: str, returncode: int, note: Optional[str] = None,
             last_lines: Sequence[str] = (), exception: Sequence[str] = ()) -> None:
        with self._lock:
            worker, events = self._running.pop(worker_id, (None, None))
        if worker is None:
            return
        worker.tail.extend(last_lines)
        worker.exception = list(exception)
        if note:
            worker.tail.append(f"({note})")
        if worker.proc.end(returncode):
            events.put(("exit", worker))

    def _on_exit(self, worker_id: str, value: bytes) -> None:
        record = wire.unpack(value)
        self._end(worker_id, int(record["returncode"]), last_lines=record.get("last_lines") or [],
                  exception=record.get("exception") or [])

    def _watch_tasks(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                running = [(worker_id, w.task) for worker_id, (w, _) in self._running.items()]
            for worker_id, task in running:
                if not self._discovery.is_alive(task):
                    self._end(worker_id, -signal.SIGKILL,
                              f"its Spark task {task} stopped reporting: the task or its executor was lost")

    def stop(self) -> None:
        self._stop.set()
        self._monitor.join(timeout=5.0)
