"""How ``horovod.torch`` hands torch tensors to the op layer: dtype checks, zero-copy numpy views of CPU tensors
(bfloat16 through an int16 view, since numpy has no native bfloat16), host staging of device tensors, and
allocators that create negotiated outputs as torch tensors."""
from __future__ import annotations

from typing import List, Optional

import ml_dtypes
import numpy as np
import torch

from horovod.core.engine import output_pool

# Dtypes each collective accepts (upstream's lists, plus bfloat16 everywhere and bool for data movement).
REDUCE_DTYPES = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                  torch.float32, torch.float64}
MOVE_DTYPES = REDUCE_DTYPES | {torch.bool}


def check_tensor(tensor: torch.Tensor, allowed: set, what: str) -> None:
    """Raise upstream's ValueError unless ``tensor`` is a dense, contiguous torch tensor of an ``allowed`` dtype."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what} expects a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.dtype not in allowed:
        names = ", ".join(sorted(str(d).replace("torch.", "") for d in allowed))
        raise ValueError(f"Tensor type {tensor.dtype} is not supported by {what}. Supported types: {names}. "
                         "Cast the tensor (for example tensor.float()) before the collective.")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous. Call tensor.contiguous() before the collective.")
    if tensor.is_sparse:
        raise ValueError(f"{what} does not take sparse tensors; use sparse_allreduce_async or densify it.")


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory (no copy)."""
    t = tensor.detach() if tensor.requires_grad else tensor      # detach() is costly; gradients never need it
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_array(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A torch tensor of ``dtype`` on ``array``'s memory, no copy (:func:`numpy_view`'s inverse: bfloat16 through
    an int16 view)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """CPU tensors as they are; device tensors staged into host memory."""
    return tensor if tensor.is_cpu else tensor.detach().to("cpu").contiguous()     # is_cpu: a sixth of .device


def torch_allocator(dtype: torch.dtype, made: List[Optional[torch.Tensor]], index: int = 0):
    """An op-layer allocator that creates the output as a torch tensor (kept in ``made[index]``)."""
    while len(made) <= index:
        made.append(None)

    def allocate(shape: tuple, np_dtype) -> np.ndarray:
        # Large outputs come from the op layer's pool (core/engine/output_pool.py): torch.empty maps fresh pages
        # on every call, which cost a 46 MB reducescatter or allgather most of its time. The tensor keeps the
        # array alive, so the pool reuses it only once the tensor is gone.
        array = output_pool.empty(tuple(shape), np_dtype)
        made[index] = from_array(array, dtype)
        return array

    return allocate


def to_device_of(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``result`` (a host tensor) on ``like``'s device."""
    return result if like.is_cpu else result.to(like.device)
