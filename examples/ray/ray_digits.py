"""Train the digits network (examples/pytorch/pytorch_digits.py) with Horovod on Ray, through ``RayExecutor``.

    python examples/ray/ray_digits.py                       # starts a local Ray with 2 CPUs for this run
    python examples/ray/ray_digits.py --address auto        # joins a running cluster (``ray start --head``)

The training function is the Horovod program of pytorch_digits.py: ``hvd.init()``, a ``DistributedSampler``
sharding the data by rank, the learning rate scaled by ``hvd.size()``, ``hvd.DistributedOptimizer``, rank 0's
weights broadcast, metrics averaged with ``hvd.allreduce``. ``RayExecutor`` starts one Ray actor per worker and
returns each rank's result; rank 0 reports every epoch's loss to this process through ``log_to_driver``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any, Dict

import ray

import horovod.ray
from horovod.ray import RayExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pytorch"))
import pytorch_digits  # the network and the data of the PyTorch example

# The workers cannot import the example's module from their own path: ship it with the function instead.
ray.cloudpickle.register_pickle_by_value(pytorch_digits)

log = logging.getLogger("ray_digits")


def train(epochs: int, batch_size: int, lr: float, seed: int = 42) -> Dict[str, Any]:
    """One worker's part of the job; returns its rank, the test accuracy, and its training throughput."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Subset
    from torch.utils.data.distributed import DistributedSampler

    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    torch.manual_seed(seed + rank)
    train_set, test_set = pytorch_digits.load_data()
    sampler = DistributedSampler(train_set, num_replicas=size, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    model = pytorch_digits.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * size, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    samples, began = 0, time.perf_counter()
    for epoch in range(epochs):
        model.train()
        sampler.set_epoch(epoch)
        total = 0.0
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            total += loss.item()
            samples += len(target)
        mean_loss = pytorch_digits.metric_average(total / len(loader), "avg_loss")
        horovod.ray.log_to_driver({"epoch": epoch, "loss": mean_loss})
    seconds = time.perf_counter() - began
    model.eval()
    shard = DataLoader(Subset(test_set, range(rank, len(test_set), size)), batch_size=256)
    with torch.no_grad():
        correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in shard)
    totals = hvd.allreduce(torch.tensor([correct, len(shard.dataset)]), op=hvd.Sum, name="accuracy")
    return {"rank": rank, "accuracy": float(totals[0]) / float(totals[1]), "samples_per_s": samples / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=None, help="Ray cluster to join (default: start a local one)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate for one worker (scaled by size)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--min-accuracy", type=float, default=0.9,
                        help="exit non-zero when the held-out accuracy is below this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_workers, include_dashboard=False, logging_level="WARNING")
    try:
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=args.num_workers,
                               cpus_per_worker=1)
        executor.start()
        try:
            results = executor.run(train, kwargs={"epochs": args.epochs, "batch_size": args.batch_size,
                                                  "lr": args.lr, "seed": args.seed},
                                   callbacks=[lambda m: log.info("epoch %d: loss %.4f", m["epoch"], m["loss"])])
        finally:
            executor.shutdown()
    finally:
        ray.shutdown()
    accuracy = results[0]["accuracy"]
    log.info("test accuracy: %.2f%% with %d workers (%s samples/s per worker)", 100 * accuracy, len(results),
             ", ".join(f"{r['samples_per_s']:.0f}" for r in results))
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} is below the expected {args.min_accuracy}")


if __name__ == "__main__":
    main()
