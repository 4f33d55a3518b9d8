"""``import horovod.torch as hvd``: Horovod's PyTorch API on this project's engine.

Every name upstream's ``horovod.torch`` exports is here with the same signature. CPU tensors are exchanged
zero-copy; CUDA tensors of a job on one host go GPU to GPU through CUDA IPC (docs/gpu.md).
"""
from __future__ import annotations

from horovod.common.util import check_extension, gpu_available, split_list  # noqa: F401  (as upstream's)
from horovod.torch import (
    _framework,  # noqa: F401  (first: a missing PyTorch is named with its extra)
    elastic,  # noqa: F401  (hvd.elastic.run, TorchState, ElasticSampler, as upstream)
)
from horovod.torch.compression import Compression  # noqa: F401
from horovod.torch.functions import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from horovod.torch.mpi_ops import *  # noqa: F403  (the op layer's names and the collectives: mpi_ops.__all__)
from horovod.torch.optimizer import DistributedOptimizer  # noqa: F401
from horovod.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from horovod.torch.zero_optimizer import ZeroRedundancyOptimizer  # noqa: F401
