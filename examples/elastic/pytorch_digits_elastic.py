"""Elastic data-parallel PyTorch training on scikit-learn's bundled digits data: workers may come and go.

Launch with (see README.md in this folder)::

    horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script examples/elastic/discover_hosts.sh \
        python examples/elastic/pytorch_digits_elastic.py

It is upstream's ``pytorch_mnist_elastic.py`` program shape on the network and data of
``examples/pytorch/pytorch_digits.py``: ``hvd.init()``, an ``ElasticSampler`` that splits what is left of each
epoch among the current workers, a ``TorchState`` holding the model, the optimizer, the sampler and the epoch,
committed every ``--batches-per-commit`` batches, and a training function under ``@hvd.elastic.run``. When a
worker fails, the others restore the last commit, re-form without it and continue; when a host is added, the job
re-forms at the next commit and the new workers receive rank 0's state. After every reset the learning rate is
scaled to the new number of workers.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Tuple

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

import horovod.torch as hvd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytorch"))
from pytorch_digits import Net, load_data  # the model and data of the non-elastic example

log = logging.getLogger("pytorch_digits_elastic")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--batches-per-commit", type=int, default=5,
                        help="commit the state every this many batches (a failure loses at most as many)")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one worker (scaled by size)")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    return parser.parse_args()


def train_epoch(state: hvd.elastic.TorchState, loader: DataLoader, batches_per_commit: int) -> Tuple[float, int]:
    """Train on this worker's part of what is left of the epoch; returns (summed loss, batches)."""
    state.model.train()
    total_loss, batches = 0.0, 0
    for batch_idx, (data, target) in enumerate(loader):
        state.optimizer.zero_grad()
        loss = F.cross_entropy(state.model(data), target)
        loss.backward()
        state.optimizer.step()
        total_loss += loss.item()
        batches += 1
        state.train_sampler.record_batch(batch_idx, loader.batch_size)
        if (batch_idx + 1) % batches_per_commit == 0:
            state.commit()
    return total_loss, batches


def evaluate(model: torch.nn.Module, test_set: TensorDataset) -> Tuple[float, int]:
    """Every worker scores its shard of the test set; returns (accuracy over all shards, digits scored)."""
    rank, size = hvd.rank(), hvd.size()
    model.eval()
    correct, seen = 0, 0
    with torch.no_grad():
        for data, target in DataLoader(Subset(test_set, range(rank, len(test_set), size)), batch_size=256):
            correct += int((model(data).argmax(1) == target).sum())
            seen += len(target)
    totals = hvd.allreduce(torch.tensor([correct, seen], dtype=torch.int64), op=hvd.Sum, name="accuracy")
    return float(totals[0]) / float(totals[1]), int(totals[1])


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    train_set, test_set = load_data()

    model = Net()
    # Horovod: scale the learning rate by the number of workers (the global batch is size times larger).
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    # Horovod: the sampler re-partitions the rest of the epoch whenever the set of workers changes.
    train_sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)

    # Horovod: what survives a reset; every worker gets rank 0's copy before training (re)starts.
    state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=0, batch=0)

    def on_state_reset() -> None:
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        state.train_sampler.reset()

    state.register_reset_callbacks([on_state_reset])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            total_loss, batches = train_epoch(state, train_loader, args.batches_per_commit)
            mean_loss = float(hvd.allreduce(torch.tensor(total_loss / max(batches, 1)), name="avg_loss"))
            if hvd.rank() == 0:
                log.info("epoch %d/%d: loss %.4f on %d workers", state.epoch + 1, args.epochs, mean_loss,
                         hvd.size())
            # The epoch is done: the next one starts from its beginning, on every worker, after any reset.
            state.train_sampler.set_epoch(state.epoch + 1)
            state.epoch += 1
            state.commit()

    train(state)
    accuracy, scored = evaluate(model, test_set)
    if hvd.rank() == 0:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", scored, 100 * accuracy, hvd.size())
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
