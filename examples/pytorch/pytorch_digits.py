"""Data-parallel PyTorch training of a small network on scikit-learn's bundled digits data.

Launch with ``horovodrun -np 2 python examples/pytorch/pytorch_digits.py``. It is upstream's
``pytorch_mnist.py`` program shape on data that ships with scikit-learn (nothing is downloaded):
``hvd.init()``, a ``DistributedSampler`` that shards the training set by rank, the learning rate scaled by
``hvd.size()``, ``hvd.DistributedOptimizer`` with named parameters, parameters and optimizer state broadcast
from rank 0, metrics averaged with ``hvd.allreduce``, and checkpoints and progress output from rank 0 only.
"""
from __future__ import annotations

import argparse
import logging
import os
from typing import Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import horovod.torch as hvd

log = logging.getLogger("pytorch_digits")


class Net(nn.Module):
    """A small CNN for 8x8 single-channel digit images."""

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def load_data() -> Tuple[TensorDataset, TensorDataset]:
    """The digits as (N, 1, 8, 8) float tensors in [0, 1], split 75/25 with a fixed seed."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0,
                                                        stratify=digits.target)
    return (TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train).long()),
            TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test).long()))


def metric_average(value: float, name: str) -> float:
    """The mean of a scalar over all ranks."""
    return float(hvd.allreduce(torch.tensor(value, dtype=torch.float64), name=name, op=hvd.Average))


def make_compression(args: argparse.Namespace):
    """The compression ``--compression`` (or ``--fp16-allreduce``) asks for."""
    name = args.compression or ("fp16" if args.fp16_allreduce else "none")
    if name == "powersgd":
        return hvd.Compression.powersgd(matrix_approximation_rank=args.powersgd_rank,
                                        start_powerSGD_iter=args.powersgd_start_iter)
    return getattr(hvd.Compression, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate for one rank (scaled by size)")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads per rank")
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 on the wire")
    parser.add_argument("--compression", choices=["none", "fp16", "bf16", "powersgd"], default=None,
                        help="gradient compression (default: none, or fp16 with --fp16-allreduce); powersgd is "
                             "DDP's low-rank PowerSGD (docs/compression.md)")
    parser.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD's matrix_approximation_rank")
    parser.add_argument("--powersgd-start-iter", type=int, default=50,
                        help="PowerSGD's start_powerSGD_iter: plain allreduce for this many steps first")
    parser.add_argument("--checkpoint", default="checkpoints/pytorch_digits.pt",
                        help="rank 0 writes the model and optimizer state here after every epoch")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed + rank)  # deliberately different per rank until rank 0's weights are broadcast

    train_set, test_set = load_data()
    # Each rank sees its own 1/size of the training set (and of the test set) every epoch.
    train_sampler = DistributedSampler(train_set, num_replicas=size, rank=rank, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    # The test set is split into disjoint shards (no padding, unlike DistributedSampler) so counts add up.
    test_loader = DataLoader(Subset(test_set, range(rank, len(test_set), size)), batch_size=256)

    model = Net()
    # Horovod: scale the learning rate by the number of ranks (the global batch is size times larger).
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = make_compression(args)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    epochs = range(args.epochs)
    if rank == 0:
        from tqdm import tqdm

        epochs = tqdm(epochs, desc="epochs", unit="epoch", mininterval=0.5)
    for epoch in epochs:
        model.train()
        train_sampler.set_epoch(epoch)
        total_loss, batches = 0.0, 0
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            batches += 1
        mean_loss = metric_average(total_loss / max(batches, 1), "avg_loss")
        if rank == 0:
            epochs.set_postfix(loss=f"{mean_loss:.4f}", refresh=False)
            os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
            torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       args.checkpoint)

    # Evaluate: every rank scores its shard of the test set; the counts are summed across ranks.
    model.eval()
    correct, seen = 0, 0
    with torch.no_grad():
        for data, target in test_loader:
            correct += int((model(data).argmax(1) == target).sum())
            seen += len(target)
    totals = hvd.allreduce(torch.tensor([correct, seen], dtype=torch.int64), op=hvd.Sum, name="accuracy")
    accuracy = float(totals[0]) / float(totals[1])
    if rank == 0:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", int(totals[1]), 100 * accuracy, size)
        log.info("compression: %s", compression)
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
