"""Digits training under horovodrun, for the elastic benchmarks: the CNN of ``examples/pytorch/pytorch_digits.py``
for a fixed number of steps, either under ``hvd.elastic.run`` (``TorchState`` + ``ElasticSampler``, a commit
every ``--commit-every`` steps) or, with ``--plain``, as a plain ``hvd.DistributedOptimizer`` loop.

Timestamps it writes to ``OUT`` (see :func:`benchmarks.workers.elastic_common.stamp`):

- ``kill``: with ``--kill-step K``, the worker on host ``--kill-host`` SIGKILLs itself before step K+1;
- ``error_<pid>``: a survivor's collective failed (HorovodInternalError);
- ``reset_<pid>``: a survivor re-formed the job (its reset callback, before the state sync);
- ``first_step_<pid>``: a survivor completed its first step at a new size;
- ``throughput``: rank 0's time at step ``--warmup`` and at the last step, and the time its commits took
  in between.

    horovodrun -np 3 --min-np 2 -H localhost:2,127.0.0.1:1 python benchmarks/workers/elastic_digits.py OUT \
        --steps 60 --kill-step 25
    horovodrun -np 2 -H localhost:1,127.0.0.1:1 python benchmarks/workers/elastic_digits.py OUT --plain
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import horovod.torch as hvd
from benchmarks.workers.elastic_common import add_training_args, digits_example, kill_self, stamp
from horovod.common.exceptions import HorovodInternalError


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_args(parser, steps=300, interval="--commit-every")
    parser.add_argument("--warmup", type=int, default=20, help="steps before the throughput clock starts")
    parser.add_argument("--kill-host", default="127.0.0.1", help="the host whose worker kills itself")
    parser.add_argument("--plain", action="store_true", help="no elastic: a plain DistributedOptimizer loop")
    return parser.parse_args()


class Clock:
    """Rank 0's throughput stamps and every worker's first step at a new size."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.first_size = hvd.size()
        self.new_size_seen = False
        self.started = 0.0
        self.commit_seconds = 0.0
        self.commits = 0

    def commit(self, state: hvd.elastic.TorchState) -> None:
        """``state.commit()``, timed once the throughput clock runs."""
        began = time.perf_counter()
        state.commit()
        if self.started:
            self.commit_seconds += time.perf_counter() - began
            self.commits += 1

    def after_step(self, step: int) -> None:
        """Called after each completed step (``step`` counts them from 1)."""
        if not self.new_size_seen and hvd.size() != self.first_size:
            self.new_size_seen = True
            stamp(self.args.out, f"first_step_{os.getpid()}", step=step, size=hvd.size(), rank=hvd.rank())
        if hvd.rank() != 0:
            return
        if step == self.args.warmup:
            self.started = time.time()
        if step == self.args.steps and self.started:
            stamp(self.args.out, "throughput", start=self.started, steps=self.args.steps - self.args.warmup,
                  size=hvd.size(), commit_seconds=self.commit_seconds, commits=self.commits)


def make_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable:
    def step(data: torch.Tensor, target: torch.Tensor) -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
    return step


def run_plain(args: argparse.Namespace, model: torch.nn.Module, train_set) -> None:
    """Upstream's non-elastic program shape: broadcast once, then train."""
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=42)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    step, clock, epoch = make_step(model, optimizer), Clock(args), 0
    done = 0
    while done < args.steps:
        sampler.set_epoch(epoch)
        for data, target in loader:
            if done >= args.steps:
                break
            step(data, target)
            done += 1
            clock.after_step(done)
        epoch += 1


def run_elastic(args: argparse.Namespace, model: torch.nn.Module, train_set) -> None:
    """Upstream's elastic program shape (its ``pytorch_mnist_elastic.py``): state, sampler, commits, a reset
    callback that rescales the learning rate."""
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=42)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    step, clock = make_step(model, optimizer), Clock(args)
    host = os.environ.get("HOROVOD_HOSTNAME", "")

    def on_reset() -> None:
        stamp(args.out, f"reset_{os.getpid()}", size=hvd.size(), rank=hvd.rank())
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < args.steps:
            for data, target in loader:
                if state.step >= args.steps:
                    return
                if args.kill_step and state.step == args.kill_step and host == args.kill_host:
                    kill_self(args.out, step=state.step, rank=hvd.rank())
                try:
                    step(data, target)
                except HorovodInternalError:
                    stamp(args.out, f"error_{os.getpid()}", step=state.step)
                    raise
                state.step += 1
                sampler.record_batch(0, args.batch_size)
                if state.step % args.commit_every == 0:
                    clock.commit(state)
                clock.after_step(state.step)
            state.epoch += 1
            sampler.set_epoch(state.epoch)

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0)
    state.register_reset_callbacks([on_reset])
    train(state)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(42)
    digits = digits_example()
    train_set, _ = digits.load_data()
    model = digits.Net()
    if args.plain:
        run_plain(args, model, train_set)
    else:
        run_elastic(args, model, train_set)
    hvd.shutdown()


if __name__ == "__main__":
    main()
