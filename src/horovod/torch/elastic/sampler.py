"""``ElasticSampler``: a ``DistributedSampler`` that remembers how much of the epoch was processed, so that after a
reset the rest of the epoch is split among the new set of workers and no sample is processed twice."""
from __future__ import annotations

import math
import random
from typing import Dict, Iterator, List

import torch.utils.data

from horovod.torch.mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions ``dataset`` across the ranks and re-partitions what is left of the epoch after a reset.

    Track it in a ``TorchState``, call :meth:`record_batch` after each batch and :meth:`set_epoch` at the *end* of
    each epoch (upstream's protocol). ``seed`` must be the same on every rank.
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set = set()        # upstream's attribute (unused there too)
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: List[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new order (when shuffling), nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count a processed batch of ``batch_size`` samples on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def load_state_dict(self, state_dict: Dict[str, int]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def reset(self) -> None:
        """Re-partition the rest of the epoch for the current rank and size."""
        self.num_replicas = size()
        self.rank = rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        self.indices = self.remaining_indices[:]
        self.indices += self.indices[:self.total_size - len(self.indices)]     # pad to divide evenly
        self.indices = self.indices[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
