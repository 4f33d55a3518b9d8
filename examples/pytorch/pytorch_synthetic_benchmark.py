"""Upstream's PyTorch synthetic benchmark: training throughput on random data, in images per second.

Under Horovod (the default)::

    horovodrun -np 2 python examples/pytorch/pytorch_synthetic_benchmark.py --model resnet

Under torch.distributed DistributedDataParallel over Gloo (same model, data and loop, for comparison)::

    torchrun --nproc_per_node 2 examples/pytorch/pytorch_synthetic_benchmark.py --model resnet --ddp

Each iteration times ``--num-batches-per-iter`` training steps; rank 0 prints upstream's lines ("Iter #k: X
img/sec per CPU", "Img/sec per CPU: mean +-1.96*std", "Total img/sec on N CPU(s): ..."). There is no
torchvision here, so the models are built from ``torch.nn``: ``resnet`` is a ResNet-18 stack of BasicBlocks at
21/32 width (42-84-168-336 channels, about 4.8 M parameters) for 32x32 inputs, and ``mlp`` a 3-layer MLP.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import timeit
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

log = logging.getLogger("pytorch_synthetic_benchmark")


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with a residual connection (1x1 projection when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-18 layout (2-2-2-2 BasicBlocks) for small images; ``width=42`` gives about 4.8 M parameters."""

    def __init__(self, width: int = 42, num_classes: int = 10) -> None:
        super().__init__()
        widths = [width, 2 * width, 4 * width, 8 * width]
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks: List[nn.Module] = []
        cin = width
        for i, cout in enumerate(widths):
            for b in range(2):
                blocks.append(BasicBlock(cin if b == 0 else cout, cout, 2 if (b == 0 and i > 0) else 1))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def build_model(name: str, image_size: int, num_classes: int = 10) -> nn.Module:
    """``resnet`` (ResNet-18 layout, ~4.8 M parameters) or ``mlp`` (3 x 32 x 32 -> 1024 -> 1024 -> classes)."""
    if name == "resnet":
        return ResNet(42, num_classes)
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size * image_size, 1024), nn.ReLU(),
                             nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, num_classes))
    raise ValueError(f"unknown model {name!r}")


class Backend:
    """What the benchmark needs from the distributed library: Horovod or torch DDP."""

    name = ""

    def rank(self) -> int:
        raise NotImplementedError

    def size(self) -> int:
        raise NotImplementedError

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer, args: argparse.Namespace):
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError


class HorovodBackend(Backend):
    name = "horovod"

    def __init__(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        hvd.init()

    def rank(self) -> int:
        return self.hvd.rank()

    def size(self) -> int:
        return self.hvd.size()

    def wrap(self, model, optimizer, args):
        hvd = self.hvd
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression,
                                             op=hvd.Adasum if args.use_adasum else hvd.Average)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer

    def shutdown(self) -> None:
        self.hvd.shutdown()


class DDPBackend(Backend):
    name = "ddp"

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        dist.init_process_group("gloo")

    def rank(self) -> int:
        return self.dist.get_rank()

    def size(self) -> int:
        return self.dist.get_world_size()

    def wrap(self, model, optimizer, args):
        if args.use_adasum:
            raise NotImplementedError("Adasum is a Horovod reduction; it has no DDP counterpart here.")
        ddp = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's parameters on construction
        if args.fp16_allreduce:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return ddp, optimizer

    def shutdown(self) -> None:
        self.dist.destroy_process_group()


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Run the benchmark; returns the numbers (rank 0's are the ones reported)."""
    backend: Backend = DDPBackend() if args.ddp else HorovodBackend()
    rank, size = backend.rank(), backend.size()
    torch.set_num_threads(args.num_threads)
    cuda = not args.no_cuda and torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)

    model = build_model(args.model, args.image_size).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)  # upstream: lr scaled by size
    model, optimizer = backend.wrap(model, optimizer, args)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    target = torch.randint(0, 10, (args.batch_size,), device=device)

    def benchmark_step() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def say(msg: str, *a: Any) -> None:
        if rank == 0:
            log.info(msg, *a)

    device_name = "GPU" if cuda else "CPU"
    say("Model: %s (%.2f M parameters, %d tensors)", args.model, n_params / 1e6,
        len(list(model.parameters())))
    say("Batch size: %d", args.batch_size)
    say("Number of %ss: %d", device_name, size)
    say("Backend: %s", "torch DistributedDataParallel (gloo)" if args.ddp else "Horovod")

    say("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    say("Running benchmark...")
    img_secs: List[float] = []
    for x in range(args.num_iters):
        elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / elapsed
        say("Iter #%d: %.1f img/sec per %s", x, img_sec, device_name)
        img_secs.append(img_sec)

    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    say("Img/sec per %s: %.1f +-%.1f", device_name, mean, conf)
    say("Total img/sec on %d %s(s): %.1f +-%.1f", size, device_name, size * mean, size * conf)
    result = {"backend": backend.name, "model": args.model, "parameters": n_params, "batch_size": args.batch_size,
              "image_size": args.image_size, "size": size, "num_threads": args.num_threads,
              "img_sec_per_iter": img_secs, "img_sec_mean": mean, "img_sec_conf": conf, "total_img_sec": size * mean}
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(result, f)
    backend.shutdown()
    return result


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["resnet", "mlp"], default="resnet")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression during allreduce")
    parser.add_argument("--no-cuda", action="store_true", help="disable CUDA even if it is available")
    parser.add_argument("--use-adasum", action="store_true", help="combine updates with the Adasum reduction")
    parser.add_argument("--ddp", action="store_true",
                        help="torch DistributedDataParallel over gloo instead of Horovod (launch with torchrun)")
    parser.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads per rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="rank 0 writes the numbers here")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run(parse_args(argv))


if __name__ == "__main__":
    main()
