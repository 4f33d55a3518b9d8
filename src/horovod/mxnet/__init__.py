"""``import horovod.mxnet as hvd``: Horovod's MXNet API (MXNet 1.9) on this project's engine.

Every name upstream's ``horovod.mxnet`` exports is here with the same signature. Host NDArrays are exchanged
zero-copy, after MXNet's engine has finished producing them; see ``docs/mxnet.md`` for what differs from upstream.
"""
from __future__ import annotations

from horovod.mxnet import _framework  # noqa: F401  (first: a missing MXNet is named with its extra)
from horovod.mxnet.compression import Compression  # noqa: F401
from horovod.mxnet.functions import allgather_object, broadcast_object, broadcast_parameters  # noqa: F401
from horovod.mxnet.mpi_ops import *  # noqa: F403  (the op layer's names and the collectives: mpi_ops.__all__)
from horovod.mxnet.optimizer import DistributedOptimizer, DistributedTrainer  # noqa: F401
