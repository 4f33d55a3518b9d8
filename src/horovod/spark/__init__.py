"""Horovod on Spark (issue 16): ``horovod.spark.run``, ``run_elastic`` and the estimators.

Importing this package starts nothing and does not import pyspark; :func:`run` and :func:`run_elastic` use the
running SparkContext (or ``SparkSession.builder.getOrCreate()``). See docs/spark.md.
"""
from __future__ import annotations

from . import _framework  # noqa: F401  (first: a missing PySpark is named with its extra)
from .elastic import run_elastic
from .runner import run

__all__ = ["run", "run_elastic"]
