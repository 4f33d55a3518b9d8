"""``run(fn, callbacks=[...])``: values a worker reports with :func:`log_to_driver` reach callbacks in the driver.

Upstream calls every callback "on every value logged by the rank 0 worker". Here the driver makes a Ray queue
for the run and hands it to the workers; :func:`log_to_driver` in rank 0 puts a value on it (other ranks'
values are dropped, as upstream), and a thread in the driver calls each callback with each value, in order,
while the run goes on. Without callbacks no queue is made and :func:`log_to_driver` does nothing.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, List, Optional, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
_worker_queue: List[Any] = [None]


def set_worker_queue(queue: Any) -> None:
    """Worker side: the queue of the current run (None: no callbacks)."""
    _worker_queue[0] = queue


def log_to_driver(value: Any) -> None:
    """Hand ``value`` to the driver's callbacks (from rank 0; elsewhere, or without callbacks, a no-op)."""
    queue = _worker_queue[0]
    if queue is not None and os.environ.get("HOROVOD_RANK", "0") == "0":
        queue.put(value)


class CallbackPump:
    """Driver side: a Ray queue and a thread that calls the callbacks with every value put on it."""

    def __init__(self, callbacks: List[Callable[[Any], None]]) -> None:
        from ray.util.queue import Queue

        self.callbacks = list(callbacks)
        self.queue = Queue(actor_options={"num_cpus": 0})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="horovod-ray-callbacks", daemon=True)
        self._thread.start()

    def _deliver(self, value: Any) -> None:
        for callback in self.callbacks:
            try:
                callback(value)
            except Exception:  # a callback's bug must not break the run
                log.exception("a RayExecutor callback failed on %r", value)

    def _pump(self) -> None:
        from ray.util.queue import Empty

        while not self._stop.is_set():
            try:
                self._deliver(self.queue.get(timeout=0.2))
            except Empty:
                continue
            except Exception as exc:  # the queue's actor is gone
                log.debug("callback queue closed: %s", exc)
                return

    def close(self) -> None:
        """Deliver what is left, stop the thread and the queue's actor."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        try:
            while not self.queue.empty():
                self._deliver(self.queue.get_nowait())
        finally:
            self.queue.shutdown()


def run_with_callbacks(run: Callable[[Optional[Any]], T], callbacks: Optional[List[Callable[[Any], None]]]) -> T:
    """``run(queue)`` with a :class:`CallbackPump` around it when there are callbacks (``run(None)`` otherwise)."""
    if not callbacks:
        return run(None)
    pump = CallbackPump(callbacks)
    try:
        return run(pump.queue)
    finally:
        pump.close()


def with_queue(func: Callable[..., T], queue: Optional[Any]) -> Callable[..., T]:
    """``func`` for a worker: makes ``queue`` the target of :func:`log_to_driver` while it runs."""
    if queue is None:
        return func

    def wrapper(*args: Any, **kwargs: Any) -> T:
        set_worker_queue(queue)
        try:
            return func(*args, **kwargs)
        finally:
            set_worker_queue(None)

    return wrapper
