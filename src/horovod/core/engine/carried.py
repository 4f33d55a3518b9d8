"""Small blocking allreduces reduced by the coordinator: the data travels with the negotiation.

Through the coordinator, an allreduce costs a round trip to rank 0 (the request, then the response) and then
the data plane's own steps: one exchange at 2 ranks, log2(n) for recursive doubling. For a few kilobytes the
steps cost as much as the negotiation, and across hosts each is a network latency. So where no fast round can
take a blocking call (its set spans hosts, or fast rounds are off), a worker sends a small allreduce's input
with its request (a *carried* request), rank 0 reduces every rank's input in rank order when the tensor is
ready, and the response carries the result: one round trip in all, and the data plane is never entered. The
timeline shows it as ``COORDINATOR_REDUCE``.

**When.** A request is carried when it is one host allreduce (not grouped) by a call that waits for it at once,
with an elementwise reduce op, and its bytes times the set's ranks less one fit ``HOROVOD_COORDINATOR_REDUCE_BYTES``
(rank 0 receives and sends that many; 0 turns it off). Every rank decides from the request alone, so identical
requests decide alike; rank 0 reduces only when every rank carried its input (none joined), and otherwise the
op runs on the data plane as any other, each rank's input still in place.

**Numbers.** Each input is scaled by the prescale factor, the inputs are combined in rank order with the data
plane's kernels, and the result is scaled by the postscale factor (Average: divided by the ranks), as one
data-plane algorithm does; every rank receives the same bytes, so the results are bitwise identical across
ranks (and, as between the data plane's algorithms, may differ from another algorithm's in the last bits).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from horovod.backends.reduce import combine, reduce_into, scale_inplace, scaled_copy
from horovod.common.exceptions import HorovodInternalError
from horovod.common.timeline import activity
from horovod.common.types import ReduceOp, RequestType, numpy_dtype
from horovod.core.controller.messages import HOST, Request, Tag, TensorResponse
from horovod.core.engine.layouts import summed

ACTIVITY = "COORDINATOR_REDUCE"
_OPS = frozenset({ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT})


def carries(request: Request, nbytes: int, size: int, budget: int) -> bool:
    """Whether a blocking call's ``request`` (``nbytes`` of input) goes with its input to rank 0 of a set of
    ``size`` ranks, under a budget of ``budget`` bytes through rank 0 (HOROVOD_COORDINATOR_REDUCE_BYTES)."""
    return (request.rtype == RequestType.ALLREDUCE and size > 1 and 0 < budget and nbytes * (size - 1) <= budget
            and request.reduce_op in _OPS and not request.group and request.device == HOST)


def payload(tensor: np.ndarray) -> bytes:
    """What a worker sends with a carried request: its input's bytes, in C order."""
    return tensor.tobytes()


def reduce_items(items: List[list], ranks: Sequence[int]) -> List[list]:
    """Rank 0, before it sends a response list: replace every carried item's inputs (one per rank, in rank
    order: a worker's bytes, rank 0's own array) with their reduction's bytes. ``ranks``: the set's global
    ranks, to name a rank whose input has the wrong size."""
    for item in items:
        if item[0] == Tag.REDUCED:
            item[2] = reduce_inputs(TensorResponse.from_wire(item[1]), item[2], ranks).tobytes()
    return items


def reduce_inputs(response: TensorResponse, inputs: Sequence[object], ranks: Sequence[int]) -> np.ndarray:
    """Every rank's input (bytes or an array, rank order) reduced as the data plane would (module docstring)."""
    dtype = numpy_dtype(response.dtype)
    count = response.numel()
    parts = []
    for position, data in enumerate(inputs):
        part = np.frombuffer(data, dtype) if isinstance(data, (bytes, bytearray)) else np.asarray(data).reshape(-1)
        if part.size != count:
            raise HorovodInternalError(
                f"ALLREDUCE of tensor '{response.name}': rank {ranks[position]} sent {part.size} elements with its "
                f"request, {count} expected; the ranks disagree on HOROVOD_COORDINATOR_REDUCE_BYTES or a tensor "
                "changed after it was submitted.")
        if response.prescale != 1.0:
            scaled = np.empty(count, dtype)
            scaled_copy(scaled, part, response.prescale)
            part = scaled
        parts.append(part)
    op, postscale = summed(response.reduce_op, response.postscale, len(parts))
    out = np.empty(count, dtype)
    combine(out, parts[0], parts[1], op)
    for part in parts[2:]:
        reduce_into(out, part, op)
    scale_inplace(out, postscale)
    return out


def finish(batch: List[TensorResponse], entries: List[Optional[object]], result: bytes) -> None:
    """Every rank: complete a carried allreduce with the result rank 0 sent."""
    response, entry = batch[0], entries[0]
    if entry is None:
        return
    with activity(ACTIVITY):
        np.copyto(entry.output, np.frombuffer(result, numpy_dtype(response.dtype)).reshape(entry.output.shape))
    entry.handle.set_result(entry.index, entry.output)
