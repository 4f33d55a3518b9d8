"""Horovod on Spark (issue 16): ``horovod.spark.run``, ``run_elastic`` and the estimators."""
