"""Small blocking collectives carried by the negotiation: the data travels to rank 0 with the requests, and back
with the response.

Through the coordinator, a collective costs a round trip to rank 0 (the request, then the response) and then the
data plane's own steps: one exchange at 2 ranks, log2(n) for recursive doubling or a binomial broadcast, n - 1
for a ring. For a few kilobytes the steps cost as much as the negotiation, and across hosts each is a network
latency. So where no fast round can take a blocking call (its set spans hosts, or fast rounds are off), a small
allreduce, broadcast or allgather is *carried*: each rank that contributes data sends it with its request (every
rank for an allreduce or allgather, the root for a broadcast), rank 0 computes the result when the tensor is
ready (reduces the inputs, takes the root's, or concatenates them), and the response carries it: one round trip
in all, and the data plane is never entered. The timeline shows ``COORDINATOR_REDUCE``, ``COORDINATOR_BCAST`` or
``COORDINATOR_ALLGATHER``.

**When.** A request is carried when it is one host allreduce (with an elementwise reduce op), broadcast or
allgather, not grouped, by a call that waits for it at once, and the bytes that rank 0 sends to the others fit
``HOROVOD_COORDINATOR_CARRY_BYTES`` (the result times the ranks less one; an allgather's result counted as this
rank's input times the ranks; 0 turns it off). Every rank decides from its own request alone; rank 0 carries a
tensor only when every input it needs came (none joined), and otherwise the op runs on the data plane as any
other, each rank's buffers still in place.

**Numbers.** An allreduce scales each input by the prescale factor, combines them in rank order with the data
plane's kernels and scales the result by the postscale factor (Average: divided by the ranks), as the tcp
plane's direct exchange does, bit for bit; every rank receives the same bytes, so the results are identical
across ranks (and, as between the data plane's algorithms, may differ from another algorithm's in the last bits).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from horovod.backends.reduce import reduce_in_order, scaled_copy
from horovod.common.exceptions import HorovodInternalError
from horovod.common.timeline import activity
from horovod.common.types import ReduceOp, RequestType, numpy_dtype
from horovod.core.controller.messages import HOST, Request, Tag, TensorResponse
from horovod.core.engine.executors import allocate_output
from horovod.core.engine.layouts import row, summed

ACTIVITIES = {RequestType.ALLREDUCE: "COORDINATOR_REDUCE", RequestType.BROADCAST: "COORDINATOR_BCAST",
              RequestType.ALLGATHER: "COORDINATOR_ALLGATHER"}
_OPS = frozenset({ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT})


def carries(request: Request, nbytes: int, size: int, budget: int) -> bool:
    """Whether a blocking call's ``request`` (``nbytes`` of input) is carried in a set of ``size`` ranks under a
    budget of ``budget`` bytes sent by rank 0 (HOROVOD_COORDINATOR_CARRY_BYTES): see the module docstring."""
    if size < 2 or budget <= 0 or request.group or request.device != HOST:
        return False
    rtype = request.rtype
    if rtype == RequestType.ALLREDUCE:
        return request.reduce_op in _OPS and nbytes * (size - 1) <= budget
    if rtype == RequestType.BROADCAST:
        return nbytes * (size - 1) <= budget
    if rtype == RequestType.ALLGATHER:
        return nbytes * size * (size - 1) <= budget
    return False


def sends_input(request: Request, global_rank: int) -> bool:
    """Whether this rank's carried request takes its input along (a broadcast needs only the root's)."""
    return request.rtype != RequestType.BROADCAST or request.root == global_rank


def payload(tensor: np.ndarray) -> bytes:
    """What a worker sends with a carried request: its input's bytes, in C order."""
    return tensor.tobytes()


def finish_items(items: List[list], ranks: Sequence[int]) -> List[list]:
    """Rank 0, before it sends a response list: replace every carried item's inputs (a worker's bytes, rank 0's
    own array) with the result's bytes. ``ranks``: the set's global ranks, to name a rank whose input has the
    wrong size."""
    for item in items:
        if item[0] == Tag.CARRIED:
            response = TensorResponse.from_wire(item[1])
            if response.rtype == RequestType.ALLREDUCE:
                item[2] = reduce_inputs(response, item[2], ranks).tobytes()
            elif response.rtype == RequestType.BROADCAST:
                item[2] = _checked(response, item[2][0], response.numel(), response.root)
            else:
                per_row = row(response.shape)
                item[2] = b"".join(_checked(response, data, response.extra[p] * per_row, ranks[p])
                                   for p, data in enumerate(item[2]))
    return items


def _checked(response: TensorResponse, data: object, count: int, rank: int) -> bytes:
    """``data`` (bytes or an array) as bytes, after checking that it holds ``count`` elements."""
    raw = data if isinstance(data, (bytes, bytearray)) else np.ascontiguousarray(data).tobytes()
    if len(raw) != count * numpy_dtype(response.dtype).itemsize:
        raise _wrong_size(response, rank, len(raw) // numpy_dtype(response.dtype).itemsize, count)
    return raw


def _wrong_size(response: TensorResponse, rank: int, got: int, count: int) -> HorovodInternalError:
    return HorovodInternalError(
        f"{RequestType(response.rtype).name} of tensor '{response.name}': rank {rank} sent {got} elements with its "
        f"request, {count} expected by the negotiated shape: the tensor changed between its request and its copy.")


def reduce_inputs(response: TensorResponse, inputs: Sequence[object], ranks: Sequence[int]) -> np.ndarray:
    """Every rank's input (bytes or an array, rank order) reduced as the data plane would (module docstring)."""
    dtype = numpy_dtype(response.dtype)
    count = response.numel()
    parts = []
    for position, data in enumerate(inputs):
        part = np.frombuffer(data, dtype) if isinstance(data, (bytes, bytearray)) else np.asarray(data).reshape(-1)
        if part.size != count:
            raise _wrong_size(response, ranks[position], part.size, count)
        if response.prescale != 1.0:
            scaled = np.empty(count, dtype)
            scaled_copy(scaled, part, response.prescale)
            part = scaled
        parts.append(part)
    op, postscale = summed(response.reduce_op, response.postscale, len(parts))
    out = np.empty(count, dtype)
    reduce_in_order(out, parts, op, postscale)
    return out


def finish(batch: List[TensorResponse], entries: List[Optional[object]], result: bytes) -> None:
    """Every rank: complete a carried collective with the result rank 0 sent."""
    response, entry = batch[0], entries[0]
    if entry is None:
        return
    dtype = numpy_dtype(response.dtype)
    with activity(ACTIVITIES[response.rtype]):
        if response.rtype == RequestType.ALLGATHER:
            out = allocate_output(entry, (sum(response.extra), *response.shape), dtype)
        else:
            out = entry.output
        np.copyto(out, np.frombuffer(result, dtype).reshape(out.shape))
    entry.handle.set_result(entry.index, out)
