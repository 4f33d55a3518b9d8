"""Data-parallel PyTorch Lightning training on scikit-learn's bundled digits with ``Trainer(strategy="horovod")``.

Launch with ``horovodrun -np 2 python examples/pytorch/pytorch_lightning_digits.py`` (or
``python -m horovod.runner -np 2 ...``). It is upstream's ``pytorch_lightning_mnist.py`` program shape on data
that ships with scikit-learn (nothing is downloaded). Lightning 2 has no Horovod strategy of its own:
``import horovod.lightning`` registers one, and the module below is plain Lightning. The strategy shards the
data with a ``DistributedSampler`` (``num_replicas=hvd.size()``, ``rank=hvd.rank()``), scales the learning rate
by ``hvd.size()`` (as Lightning 1.x's did), broadcasts the parameters and optimizer state from rank 0, wraps the
optimizer in ``hvd.DistributedOptimizer``, and averages ``self.log(..., sync_dist=True)`` values and gathers
``self.all_gather(...)`` tensors with Horovod's collectives. Only rank 0 reports.
"""
from __future__ import annotations

import argparse
import logging
import os
import warnings
from typing import Tuple

import lightning
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import horovod.lightning  # noqa: F401  (registers Trainer(strategy="horovod"))
import horovod.torch as hvd

log = logging.getLogger("pytorch_lightning_digits")


class LitDigits(lightning.LightningModule):
    """A small CNN on the 8x8 single-channel digit images, written as any Lightning module is."""

    def __init__(self, lr: float = 0.02, momentum: float = 0.9, hidden: int = 128) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        self.test_counts = torch.zeros(2, dtype=torch.int64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)  # averaged over the ranks
        return loss

    def on_test_epoch_start(self) -> None:
        self.test_counts = torch.zeros(2, dtype=torch.int64)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.test_counts += torch.tensor([int((self(x).argmax(1) == y).sum()), len(y)])

    def on_test_epoch_end(self) -> None:
        # Every rank scored its shard; all_gather stacks the ranks' [correct, seen] into (size, 2).
        self.test_counts = self.all_gather(self.test_counts).sum(0)

    def configure_optimizers(self):
        # The learning rate for one rank: the strategy multiplies it by hvd.size().
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)


class EpochReport(lightning.Callback):
    """Rank 0 logs how the data is split and each epoch's training loss (already averaged over the ranks)."""

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            log.info("training on %d ranks: %d batches per rank per epoch", trainer.world_size,
                     trainer.num_training_batches)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            log.info("epoch %d/%d: loss %.4f", trainer.current_epoch + 1, trainer.max_epochs,
                     float(trainer.callback_metrics["train_loss"]))


def load_data() -> Tuple[TensorDataset, TensorDataset]:
    """The digits as (N, 1, 8, 8) float tensors in [0, 1], split 75/25 with a fixed seed."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0,
                                                        stratify=digits.target)
    return (TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train).long()),
            TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test).long()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate for one rank (scaled by size)")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads per rank")
    parser.add_argument("--accelerator", default="cpu", help="Lightning's accelerator: cpu, or gpu (one per rank)")
    parser.add_argument("--save-weights", metavar="DIR",
                        help="every rank writes its final parameters to DIR/rank<N>.npy (to compare the ranks)")
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # The digits are in memory: loader worker processes would only add start-up time.
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")

    torch.set_num_threads(args.num_threads)
    lightning.seed_everything(args.seed, workers=True, verbose=False)  # the same seed on every rank

    train_set, test_set = load_data()
    # Plain loaders: the strategy gives each its DistributedSampler (num_replicas=hvd.size(), rank=hvd.rank()).
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=256)

    model = LitDigits(lr=args.lr, momentum=args.momentum)
    trainer = lightning.Trainer(strategy="horovod", accelerator=args.accelerator, devices=1,
                                max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, callbacks=[EpochReport()])
    trainer.fit(model, train_dataloaders=train_loader)
    if args.save_weights:
        os.makedirs(args.save_weights, exist_ok=True)
        weights = torch.cat([p.detach().cpu().flatten() for p in model.parameters()]).numpy()
        np.save(os.path.join(args.save_weights, f"rank{hvd.rank()}.npy"), weights)

    # Every rank scores its shard of the test set (450 digits split evenly at 2 ranks; at sizes that do not
    # divide 450 the sampler repeats a few to even the shards, and they are counted).
    trainer.test(model, dataloaders=test_loader, verbose=False)
    correct, seen = (int(n) for n in model.test_counts)
    accuracy = correct / seen
    if trainer.is_global_zero:
        log.info("test accuracy on %d held-out digits: %.2f%% (%d ranks)", seen, 100 * accuracy, hvd.size())
    hvd.shutdown()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
