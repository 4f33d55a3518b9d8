"""How an estimator runs its training function on Horovod ranks (upstream's ``horovod.spark.common.backend``).

A ``Backend`` runs ``fn(*args, **kwargs)`` on ``num_processes()`` ranks and returns the results by rank. The
default, ``SparkBackend``, runs it in Spark tasks through ``horovod.spark.run``; ``HorovodRunBackend`` runs it
on local processes through ``horovod.run`` (useful where the data lives in a store the local machine reaches
and no Spark executors should be taken).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence


class Backend:
    """Interface of a training backend: ``run`` a function on the ranks, and say how many there are."""

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Dict[str, Any]] = None,
            env: Optional[Dict[str, str]] = None) -> List[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank with ``env`` added to its environment; results by
        rank."""
        raise NotImplementedError()

    def num_processes(self) -> int:
        """The number of ranks ``run`` starts."""
        raise NotImplementedError()


class SparkBackend(Backend):
    """Runs the training function in Spark tasks with ``horovod.spark.run`` (upstream's ``SparkBackend``).

    ``kwargs`` are passed on to ``horovod.spark.run`` (start_timeout, stdout, stderr, verbose, nics,
    prefix_output_with_timestamp, use_mpi, use_gloo, extra_mpi_args, ...).
    """

    def __init__(self, num_proc: Optional[int] = None, env: Optional[Dict[str, str]] = None,
                 **kwargs: Any) -> None:
        self._num_proc = num_proc
        self._env = env
        self._kwargs = kwargs

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Dict[str, Any]] = None,
            env: Optional[Dict[str, str]] = None) -> List[Any]:
        import horovod.spark

        full_env = dict(self._env or {})
        full_env.update(env or {})
        return horovod.spark.run(fn, args=tuple(args), kwargs=dict(kwargs or {}), num_proc=self._num_proc,
                                 env=full_env or None, **self._kwargs)

    def num_processes(self) -> int:
        if self._num_proc is not None:
            return self._num_proc
        from pyspark.sql import SparkSession

        return SparkSession.active().sparkContext.defaultParallelism


class HorovodRunBackend(Backend):
    """Runs the training function on ``num_proc`` local processes with ``horovod.run`` (no Spark tasks)."""

    def __init__(self, num_proc: int, **kwargs: Any) -> None:
        self._num_proc = num_proc
        self._kwargs = kwargs

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Dict[str, Any]] = None,
            env: Optional[Dict[str, str]] = None) -> List[Any]:
        from horovod.runner import run as horovod_run

        def with_env(*fn_args: Any, **fn_kwargs: Any) -> Any:
            import os

            os.environ.update(env or {})
            return fn(*fn_args, **fn_kwargs)

        return horovod_run(with_env, args=tuple(args), kwargs=dict(kwargs or {}), num_proc=self._num_proc,
                           **self._kwargs)

    def num_processes(self) -> int:
        return self._num_proc
