"""What the driver raises when a worker fails: the rank, its node and the worker's own traceback."""
from __future__ import annotations

from typing import Optional

from ray.exceptions import RayActorError, RayTaskError


class RayWorkerError(RuntimeError):
    """A Horovod worker on Ray failed: its function raised (``cause`` is the exception) or its actor died.

    ``rank``, ``hostname`` (Horovod's name of the Ray node) and ``node_id`` say where.
    """

    def __init__(self, message: str, rank: int, hostname: str, node_id: Optional[str] = None,
                 cause: Optional[BaseException] = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.hostname = hostname
        self.node_id = node_id
        self.cause = cause


def worker_failure(exc: BaseException, rank: int, hostname: str, node_id: Optional[str] = None,
                   what: str = "the function") -> RayWorkerError:
    """The error to raise in the driver for ``exc``, which ``ray.get`` raised for the worker of ``rank``."""
    where = f"rank {rank} (node {hostname}" + (f", Ray node id {node_id}" if node_id else "") + ")"
    if isinstance(exc, RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else None
        shown = repr(cause) if cause is not None else exc.cause_cls.__name__
        return RayWorkerError(f"{what} raised {shown} on {where}.\nTraceback from {where}:\n{exc}", rank,
                              hostname, node_id, cause)
    if isinstance(exc, RayActorError):
        return RayWorkerError(
            f"The Ray actor of {where} died while it ran {what} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'no details'}). Ray kills an actor when its process "
            "crashes, when it runs out of memory, or when its node is lost: check that node's Ray logs.",
            rank, hostname, node_id, exc)
    return RayWorkerError(f"{what} failed on {where}: {exc!r}", rank, hostname, node_id, exc)
