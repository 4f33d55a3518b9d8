"""Tensor Fusion planning: which ready responses share one buffer and one backend call.

The coordinator plans; every rank executes the plan. Allreduce and reducescatter responses with the same dtype,
reduce op and scale factors, and allgather responses with the same dtype, are packed greedily, in readiness order, while the
batch stays within the fusion threshold (an allgather counts with its whole output).
A response that does not match the open batch does not close it: later responses may still join it (the
look-ahead upstream uses for mixed fp16/fp32 sequences). Everything else runs alone.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from horovod.common.types import RequestType, numpy_dtype
from horovod.core.controller.messages import TensorResponse

FUSIBLE = frozenset({RequestType.ALLREDUCE, RequestType.ALLGATHER, RequestType.REDUCESCATTER})


def nbytes(response: TensorResponse) -> int:
    """The bytes a response puts in the fused buffer: an allreduce's tensor, an allgather's whole output."""
    elements = response.numel()
    if response.rtype == RequestType.ALLGATHER:
        elements *= sum(response.extra)         # numel() is one row; extra has every rank's row count
    return elements * numpy_dtype(response.dtype).itemsize


def plan(responses: List[TensorResponse], threshold: int) -> List[List[TensorResponse]]:
    """Group ``responses`` (in order) into batches that each run as one collective.

    ``threshold`` is in bytes; 0 disables fusion (every response runs alone). A single response larger than
    the threshold still runs, alone.
    """
    batches: List[List[TensorResponse]] = []
    open_batches: Dict[tuple, int] = {}     # fusion key -> index of the open batch for that key
    open_bytes: Dict[int, int] = {}
    for response in responses:
        if threshold <= 0 or response.rtype not in FUSIBLE:
            batches.append([response])
            continue
        key = response.fusion_key()
        size = nbytes(response)
        index = open_batches.get(key)
        if index is not None and open_bytes[index] + size <= threshold:
            batches[index].append(response)
            open_bytes[index] += size
            continue
        open_batches[key] = len(batches)
        open_bytes[len(batches)] = size
        batches.append([response])
    return batches


def aligned_threshold(threshold: int, local_size: int) -> int:
    """Round the threshold up to a multiple of ``local_size * 8 * 64`` bytes, as upstream does."""
    unit = max(1, local_size) * 8 * 64
    return int(np.ceil(threshold / unit) * unit) if threshold > 0 else 0
