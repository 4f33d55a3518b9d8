"""An elastic job's worker actor, seen by the elastic driver as if it were a worker process.

:class:`horovod.runner.elastic.driver.ElasticDriver` starts, watches and stops workers through a small face of
:class:`horovod.runner.process.WorkerProcess` (``proc.returncode``/``poll``/``wait``, ``signal_group``,
``join_output``, ``close``, ``exit_info``, ``spec.rank``/``spec.hostname``). :class:`RayWorkerHandle` gives it
that face for a Ray actor: the actor runs the function once, a thread waits for its result and posts the exit
to the driver's events, and "signals" kill the actor. A function that raises has its actor killed at once, as a
process that raised would exit, so that its peers' collectives fail instead of waiting for it.
"""
from __future__ import annotations

import logging
import queue
import threading
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from horovod.runner.common.util.hosts import SlotInfo
from horovod.runner.output_tail import TAIL_LINES
from horovod.runner.process import RemoteProcess, WorkerExit

log = logging.getLogger(__name__)

KILLED = -9       # the return code of a worker whose actor died (as a process killed by SIGKILL)
FAILED = 1        # the return code of a worker whose function raised


class RayWorkerHandle:
    """One worker actor of an elastic job, placed on the node of its slot, running ``func`` once."""

    def __init__(self, actor_cls, slot: SlotInfo, node_id: str, env: Dict[str, str], func: Callable[[], Any],
                 events: queue.SimpleQueue, resources: Dict[str, float]) -> None:
        self.slot = slot
        self.node_id = node_id
        self.spec = SimpleNamespace(rank=slot.rank, hostname=slot.hostname)
        self.proc = RemoteProcess()
        self.tail: List[str] = []
        self.result: Optional[Dict[str, Any]] = None
        self.actor = actor_cls.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), max_restarts=0,
            **resources).remote()
        self._ref = self.actor.run_elastic.remote(env, func)
        self._waiter = threading.Thread(target=self._wait, args=(events,), daemon=True,
                                        name=f"horovod-ray-worker-{slot.hostname}:{slot.local_rank}")
        self._waiter.start()

    def _wait(self, events: queue.SimpleQueue) -> None:
        try:
            outcome = ray.get(self._ref)
            if "exit" in outcome:
                returncode = int(outcome["exit"])
            else:
                self.result, returncode = outcome, 0
        except ray.exceptions.RayTaskError as exc:
            # As a process that raised would exit: its peers' collectives fail now instead of waiting for it.
            self.kill()
            self.tail, returncode = str(exc).splitlines()[-TAIL_LINES:], FAILED
            log.warning("the function raised on %s[%d] (rank %d): %s", self.slot.hostname, self.slot.local_rank,
                        self.slot.rank, self.tail[-1] if self.tail else exc)
        except ray.exceptions.RayActorError as exc:
            self.tail, returncode = [f"the Ray actor died: {str(exc).splitlines()[0] if str(exc) else exc!r}"], KILLED
        except Exception as exc:  # the driver must hear of every end, whatever Ray raised
            self.tail, returncode = [repr(exc)], FAILED
        self.proc.end(returncode)
        events.put(("exit", self))

    def signal_group(self, signum: int) -> bool:
        """Stop the worker (any signal kills its actor); False when it had already ended."""
        if self.proc.returncode is not None:
            return False
        self.kill()
        return True

    def kill(self) -> None:
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception as exc:  # already gone
            log.debug("could not kill the actor of %s:%d: %s", self.slot.hostname, self.slot.local_rank, exc)

    def join_output(self, timeout: float) -> bool:
        """Ray forwards the actor's output itself: there is nothing to wait for."""
        return True

    def close(self) -> None:
        """Release the actor (and its resources) once its function has ended."""
        self.kill()

    def exit_info(self) -> WorkerExit:
        return WorkerExit(self.slot.rank, self.slot.hostname, self.proc.returncode if self.proc.returncode is not None
                          else KILLED, f"the function in a Ray actor on node {self.node_id}", list(self.tail))
