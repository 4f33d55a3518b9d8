"""Requests (a rank asks for a collective) and responses (the coordinator says what every rank runs).

Both travel as plain msgpack lists, so encoding is a list build and decoding needs no pickle. A request is
compared field by field on the coordinator; a :class:`TensorResponse` is what every rank needs to execute one
tensor, including the per-rank facts (allgather first dimensions, alltoall splits) that negotiation learned.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

from horovod.common.types import DataType, ReduceOp, RequestType

# Request list layout (index constants keep the hot path free of attribute lookups).
R_NAME, R_TYPE, R_DTYPE, R_SHAPE, R_OP, R_PRE, R_POST, R_ROOT, R_GROUP, R_GROUP_SIZE, R_SPLITS, R_DEVICE = range(12)

# Where a request's buffers live (R_DEVICE): host memory, or a device whose plane is registered in
# horovod.backends.device_ipc (CUDA; the CPU emulation its tests use). Ranks must agree, and a batch never mixes.
HOST = 0


def make_request(name: str, rtype: RequestType, dtype: DataType, shape: Sequence[int],
                 reduce_op: ReduceOp = ReduceOp.SUM, prescale: float = 1.0, postscale: float = 1.0,
                 root: int = -1, group: str = "", group_size: int = 0,
                 splits: Optional[Sequence[int]] = None, device: int = HOST) -> list:
    """A request as the list that goes on the wire."""
    return [name, int(rtype), int(dtype), [int(d) for d in shape], int(reduce_op), float(prescale),
            float(postscale), int(root), group, int(group_size), None if splits is None else [int(s) for s in splits],
            int(device)]


class TensorResponse:
    """The negotiated description of one tensor's collective, identical on every rank."""

    __slots__ = ("name", "rtype", "dtype", "shape", "reduce_op", "prescale", "postscale", "root", "extra", "device")

    def __init__(self, name: str, rtype: int, dtype: int, shape: List[int], reduce_op: int, prescale: float,
                 postscale: float, root: int, extra, device: int = HOST) -> None:
        self.name = name
        self.rtype = rtype
        self.dtype = dtype
        self.shape = shape          # allreduce/broadcast/reducescatter: the full shape; others: the row shape
        self.reduce_op = reduce_op
        self.prescale = prescale
        self.postscale = postscale
        self.root = root
        self.extra = extra          # allgather: dim0 per rank; alltoall: splits matrix [src][dst]
        self.device = device        # HOST, or the device plane the buffers live on (R_DEVICE)

    def to_wire(self) -> list:
        return [self.name, self.rtype, self.dtype, self.shape, self.reduce_op, self.prescale, self.postscale,
                self.root, self.extra, self.device]

    @classmethod
    def from_wire(cls, item: list) -> TensorResponse:
        return cls(*item)

    def fusion_key(self) -> tuple:
        """Responses with equal keys may share one fused buffer."""
        return (self.rtype, self.dtype, self.reduce_op, self.prescale, self.postscale, self.device)

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def request_matches(self, rank: int, request: list) -> bool:
        """True when ``request`` from ``rank`` is exactly what produced this response (cache fast path)."""
        if request[R_TYPE] != self.rtype or request[R_DTYPE] != self.dtype or request[R_OP] != self.reduce_op:
            return False
        if request[R_PRE] != self.prescale or request[R_POST] != self.postscale or request[R_ROOT] != self.root:
            return False
        if request[R_DEVICE] != self.device:
            return False
        shape = request[R_SHAPE]
        if self.rtype == RequestType.ALLGATHER:
            return bool(shape) and shape[0] == self.extra[rank] and shape[1:] == self.shape
        if self.rtype == RequestType.ALLTOALL:
            return bool(shape) and shape[1:] == self.shape and request[R_SPLITS] == self.extra[rank]
        return shape == self.shape


# Response list items: a tensor batch is ["T", [item, ...]] where each item is a cache id (int) or a
# wire TensorResponse (list); errors are ["E", [names], message]; join completion is ["J", last_joined_rank];
# new tunable values from the autotuner are ["P", {name: value}], applied by every rank at that point.
BATCH, ERROR, JOIN, PARAMS = "T", "E", "J", "P"
