"""Digits training under torchrun, the peer of the elastic recovery benchmark: the CNN of
``examples/pytorch/pytorch_digits.py`` with torch.distributed (Gloo) and DistributedDataParallel, the usual
fault-tolerance recipe for torchrun's ``--max-restarts``: rank 0 saves a checkpoint (``torch.save``) every
``--checkpoint-every`` steps, and every worker reloads it at start when it exists.

With ``--kill-step K`` the last rank SIGKILLs itself before step K+1 in the first attempt
(``TORCHELASTIC_RESTART_COUNT`` 0); torchrun then stops the other workers and restarts all of them. Timestamps it
writes to ``OUT`` (see :func:`benchmarks.workers.elastic_common.stamp`): ``kill``, and for every restarted worker
``first_step_<rank>`` with the times it started (before its imports), joined the process group, had the data
(sklearn's digits) and had the checkpoint loaded.

    python -m torch.distributed.run --nnodes 1:1 --nproc-per-node 3 --max-restarts 1 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:29411 benchmarks/workers/torchrun_digits.py OUT --steps 60 --kill-step 25

with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in the environment: torch 2.13's torchrun otherwise shares its agent's
store with the workers without a per-attempt prefix, and the restarted workers read the dead attempt's Gloo
addresses (``Gloo connectFullMesh failed ... Connection refused``).
"""
from __future__ import annotations

import time

STARTED = time.time()  # before the imports: a restarted worker's import time is part of the recovery

import argparse  # noqa: E402
import itertools  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Tuple  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from benchmarks.workers.elastic_common import add_training_args, digits_example, kill_self, stamp  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_args(parser, steps=60, interval="--checkpoint-every")
    return parser.parse_args()


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Put the checkpoint's model and optimizer state back; the number of steps it had done (0 without one)."""
    if not path.exists():
        return 0
    checkpoint = torch.load(path, map_location="cpu")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return int(checkpoint["step"])


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)    # a crash while saving leaves the previous checkpoint whole


def position(step: int, batches_per_epoch: int) -> Tuple[int, int]:
    """The (epoch, batch within the epoch) at which training resumes after ``step`` steps."""
    return step // batches_per_epoch, step % batches_per_epoch


def main() -> None:
    args = parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    joined = time.time()
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(42)
    digits = digits_example()
    train_set, _ = digits.load_data()
    data_loaded = time.time()
    net = digits.Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr * size, momentum=0.9)
    checkpoint = Path(args.out) / "torchrun_digits.pt"
    done = load_checkpoint(checkpoint, net, optimizer)
    checkpoint_loaded = time.time()
    model = DistributedDataParallel(net)
    sampler = DistributedSampler(train_set, num_replicas=size, rank=rank, shuffle=True, seed=42)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    epoch, skip = position(done, len(loader))
    resumed_from = done
    while done < args.steps:
        sampler.set_epoch(epoch)
        for data, target in itertools.islice(loader, skip, None):
            if done >= args.steps:
                break
            if args.kill_step and done == args.kill_step and rank == size - 1 and attempt == 0:
                kill_self(args.out, step=done, rank=rank)
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
            done += 1
            if attempt > 0 and done == resumed_from + 1:
                stamp(args.out, f"first_step_{rank}", started=STARTED, joined=joined, data_loaded=data_loaded,
                      checkpoint_loaded=checkpoint_loaded, resumed_from=resumed_from, attempt=attempt)
            if rank == 0 and done % args.checkpoint_every == 0:
                save_checkpoint(checkpoint, net, optimizer, done)
        epoch, skip = epoch + 1, 0
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
