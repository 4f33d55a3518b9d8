"""``horovod.torch.elastic``: elastic training for PyTorch (upstream's module): ``run``, ``TorchState`` and
``ElasticSampler``. See :mod:`horovod.common.elastic` for the loop and the state protocol."""
from __future__ import annotations

from typing import Any, Callable

from horovod.common.elastic import run_fn
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.elastic.state import TorchState
from horovod.torch.mpi_ops import init, shutdown

__all__ = ["TorchState", "ElasticSampler", "run"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a training function ``func(state, ...)`` so that it keeps running as workers come and go.

    After a failed collective the state is restored to its last commit, the job re-forms (``shutdown()`` then
    ``init()``) and every rank syncs from rank 0 before ``func`` runs again; after an announced change of hosts
    it re-forms without restoring. ``func`` itself must not start with a collective: a new worker would run it
    while the others sync.
    """
    return run_fn(func, _reset)


def _reset() -> None:
    shutdown()
    init()
