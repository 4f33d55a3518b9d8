"""The body of every Horovod worker actor (upstream's ``horovod.ray.worker.BaseHorovodWorker``).

The executors turn this class into a Ray actor (``ray.remote(BaseHorovodWorker).options(...)``); each actor is
its own process, so the environment it is given (``update_env_vars``: topology, the driver's rendezvous address
and the job secret, which travels as a Ray method argument, never on a command line) is what ``hvd.init()`` in
that process reads, exactly as under ``horovodrun``. ``SIGUSR1`` to a worker's process prints its threads' stacks.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import socket
from typing import Any, Callable, Dict, List, Optional

import ray


class BaseHorovodWorker:
    """One Horovod rank hosted by a Ray actor."""

    executable = None

    def __init__(self, world_rank: int = 0, world_size: int = 1) -> None:
        os.environ["HOROVOD_RANK"] = str(world_rank)
        os.environ["HOROVOD_SIZE"] = str(world_size)
        # ``kill -USR1 <pid>`` prints every thread's stack to the actor's stderr (Ray's worker log, which Ray also
        # forwards to the driver): how a hung job's workers are inspected, as horovodrun's ranks in the tests.
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def node_id(self) -> str:
        """The Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def placement(self) -> Dict[str, Any]:
        """Where this actor runs: its Ray node id and IP address, and its process id."""
        return {"node_id": self.node_id(), "node_ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def hostname(self) -> str:
        return socket.gethostname()

    def get_gpu_ids(self) -> List[int]:
        """The GPUs Ray gave this actor."""
        return ray.get_gpu_ids()

    def update_env_vars(self, env_vars: Dict[str, Any]) -> None:
        """Set environment variables in this worker's process (values are turned into strings)."""
        os.environ.update({str(k): str(v) for k, v in env_vars.items()})

    def env_vars(self) -> Dict[str, str]:
        return dict(os.environ)

    def start_executable(self, executable_cls: Optional[type] = None, executable_args: Optional[list] = None,
                         executable_kwargs: Optional[dict] = None) -> None:
        """Make the object that ``RayExecutor.execute`` functions receive: ``executable_cls(*args, **kwargs)``."""
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or []), **(executable_kwargs or {}))

    def execute(self, func: Callable[[Any], Any]) -> Any:
        """``func(executable)`` in this worker."""
        return func(self.executable)

    def run_elastic(self, env_vars: Dict[str, Any], func: Callable[[], Any]) -> Dict[str, Any]:
        """Run an elastic job's function once with its environment: ``{"value": ..., "rank": final rank}``, or
        ``{"exit": status}`` when Horovod ended the worker (its slot left the job) with ``SystemExit``."""
        self.update_env_vars(env_vars)
        try:
            value = func()
        except SystemExit as exc:
            code = exc.code
            return {"exit": code if isinstance(code, int) else (0 if code is None else 1)}
        return {"value": value, "rank": int(os.environ.get("HOROVOD_RANK", "0"))}
