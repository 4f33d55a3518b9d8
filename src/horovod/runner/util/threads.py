"""Upstream's import path ``horovod.runner.util.threads``: run functions in background threads.

Upstream's test utilities and users' launch helpers import ``in_thread`` and ``execute_function_multithreaded``
from here; the signatures, defaults and errors are upstream's.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

log = logging.getLogger(__name__)


def execute_function_multithreaded(fn: Callable[..., Any], args_list: Sequence[List[Any]],
                                   block_until_all_done: bool = True,
                                   max_concurrent_executions: int = 1000) -> Optional[Dict[int, Any]]:
    """Call ``fn(*args)`` for every ``args`` of ``args_list`` on up to ``max_concurrent_executions`` threads.

    With ``block_until_all_done`` it waits and returns ``{index: result}`` (and raises RuntimeError, as upstream,
    when some call did not complete); otherwise it returns None at once and the threads run as daemons.
    """
    results: queue.Queue[tuple] = queue.Queue()
    work: queue.Queue[tuple] = queue.Queue()
    for index, args in enumerate(args_list):
        work.put((index, list(args)))

    def drain() -> None:
        while True:
            try:
                index, args = work.get(block=False)
            except queue.Empty:
                return
            results.put((index, fn(*args)))

    threads = [in_thread(drain, daemon=not block_until_all_done)
               for _ in range(min(max_concurrent_executions, len(args_list)))]
    if not block_until_all_done:
        return None
    # join() with a timeout, in a loop, so that a signal (Ctrl-C) still reaches the main thread.
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.1)
    done: Dict[int, Any] = {}
    while not results.empty():
        index, value = results.get()
        done[index] = value
    if len(done) != len(args_list):
        raise RuntimeError(f"Some threads for func {getattr(fn, '__name__', fn)} did not complete successfully.")
    return done


def in_thread(target: Callable[..., Any], args: tuple = (), name: Optional[str] = None, daemon: bool = True,
              silent: bool = False) -> threading.Thread:
    """Start ``target(*args)`` in a new thread and return it; ``silent`` logs exceptions at DEBUG instead of
    letting the thread report them."""
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args)}, for a single argument use (arg,)")
    fn = target
    if silent:
        def fn(*a: Any) -> None:
            try:
                target(*a)
            except Exception:
                log.debug("background thread %s failed", name or target, exc_info=True)

    thread = threading.Thread(target=fn, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def on_event(event: threading.Event, func: Callable[..., Any], args: tuple = (),
             stop: Optional[threading.Event] = None, check_stop_interval_s: float = 1.0, daemon: bool = True,
             silent: bool = False) -> threading.Thread:
    """Call ``func(*args)`` in a thread once ``event`` is set, unless ``stop`` is set first (checked every
    ``check_stop_interval_s``)."""
    if event is None:
        raise ValueError("Event must not be None")
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args)}, for a single argument use (arg,)")
    if stop is None and not daemon:
        raise ValueError("Stop event must be given for non-daemon event thread")

    def wait_then_call() -> None:
        if stop is None:
            event.wait()
        else:
            while not event.is_set() and not stop.is_set():
                event.wait(timeout=check_stop_interval_s)
            if stop.is_set():
                return
        func(*args)

    return in_thread(wait_then_call, daemon=daemon, silent=silent)
