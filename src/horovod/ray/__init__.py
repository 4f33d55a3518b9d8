"""Horovod on Ray (issue 16): ``RayExecutor`` (static and elastic) and the deprecated ``ElasticRayExecutor``.

See docs/ray.md. Importing this package imports ``ray``; it is the ``ray`` extra (``pip install horovod[ray]``).
"""
from . import _framework  # noqa: F401  (first: a missing Ray is named with its extra)
from .callbacks import log_to_driver
from .discovery import RayHostDiscovery
from .elastic import ElasticRayExecutor
from .errors import RayWorkerError
from .executor import RayExecutor
from .worker import BaseHorovodWorker

__all__ = ["RayExecutor", "ElasticRayExecutor", "RayHostDiscovery", "BaseHorovodWorker", "RayWorkerError",
           "log_to_driver"]
