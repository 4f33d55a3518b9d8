"""``SyncBatchNorm``: batch normalization with statistics computed over the global batch of all ranks.

Upstream requires CUDA; this one works on CPU (and on GPU through host staging). The forward pass allreduces
per-channel sums, squared sums and counts. Because that allreduce is differentiable (its gradient is an
allreduce of the gradient), autograd produces exactly the gradient of batch normalization over the global
batch, with no hand-written backward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from horovod.torch.mpi_ops import Sum, allreduce, size


class SyncBatchNorm(_BatchNorm):
    """Drop-in replacement for ``torch.nn.BatchNorm{1,2,3}d`` that normalizes over all ranks' samples."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum
        if self.momentum is None:
            momentum = 1.0 / float(self.num_batches_tracked) if self.num_batches_tracked is not None else 0.0
        if not self.training or size() == 1:
            use_batch_stats = self.training or not self.track_running_stats
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                use_batch_stats, momentum, self.eps)

        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        local_count = torch.full((channels,), float(input.numel() // channels), dtype=x.dtype, device=x.device)
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), local_count])
        total = allreduce(stats, op=Sum, name=None)
        sums, sqsums, count = total[:channels], total[channels:2 * channels], total[2 * channels:]
        mean = sums / count
        var = (sqsums / count - mean * mean).clamp_min(0.0)
        if self.track_running_stats:
            with torch.no_grad():
                unbiased = var * count / (count - 1).clamp_min(1.0)
                self.running_mean.mul_(1 - momentum).add_(mean.detach().to(self.running_mean.dtype), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.detach().to(self.running_var.dtype),
                                                         alpha=momentum)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)
