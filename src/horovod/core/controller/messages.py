"""Requests (a rank asks for a collective) and responses (the coordinator says what every rank runs).

Both travel as plain msgpack lists, so encoding is a list build and decoding needs no pickle. A request is
compared field by field on the coordinator; a :class:`TensorResponse` is what every rank needs to execute one
tensor, including the per-rank facts (allgather first dimensions, alltoall splits) that negotiation learned.
"""
from __future__ import annotations

import enum
from typing import List, NamedTuple, Optional, Sequence

from horovod.common.types import DataType, ReduceOp, RequestType


class Tag(str, enum.Enum):
    """The first element of every control message: what it is. One letter, one meaning (a ``str``, so it
    encodes as the letter it always was, and a decoded letter compares equal to its member)."""

    # worker -> coordinator
    REQUESTS = "R"          # [R, [request, ...](, wait flags(, [input bytes or None, ...]))]: collectives this
                            # rank submitted; a blocking call's wait notice; carried inputs (engine/carried.py)
    WAITING = "W"           # [W, [name, ...], in_fast_round?]: this rank waits on these tensors
    UNWAITING = "U"         # [U, [name, ...]]: a wait taken back
    PARKED = "P"            # [P, name, seconds]: this rank has waited that long on a fast round
    UNPARKED = "Q"          # [Q, name]: that fast round closed
    EXITING = "X"           # [X]: this rank shuts down
    # coordinator -> workers
    RESPONSES = "L"         # [L, [response list item, ...]]: what every rank runs next
    SHUTDOWN = "S"          # [S, reason]: every rank shuts down
    DEADLOCK = "D"          # [D, report]: every rank logs the deadlock report
    # either way
    ABORT = "A"             # [A, reason]: the sender aborts, and why
    # the items of a RESPONSES list, which every rank applies in order
    BATCH = "T"             # [T, [item, ...]]: run these tensors, each a response-cache id or a wire TensorResponse
    CARRIED = "C"           # [C, wire TensorResponse, result bytes]: a carried collective (engine/carried.py)
    ERROR = "E"             # [E, [name, ...], message]: these tensors fail with this message
    JOINED = "J"            # [J, last joined rank]: every rank has joined
    PARAMS = "V"            # [V, {name: value}]: the autotuner's new values, applied by every rank at this point


class Request(NamedTuple):
    """One rank's request for one collective. It goes on the wire as the list of its fields, in this order (a
    decoded list becomes a Request again with ``Request._make``)."""

    name: str
    rtype: int                      # RequestType
    dtype: int                      # DataType
    shape: List[int]
    reduce_op: int                  # ReduceOp
    prescale: float
    postscale: float
    root: int                       # a global rank; -1 when the op has none
    group: str                      # the grouped op this tensor belongs to ("" when alone)
    group_size: int
    splits: Optional[List[int]]     # alltoall's rows per destination
    device: int                     # HOST or a device plane (see below)


# Where a request's buffers live (Request.device): host memory, or a device whose plane is registered in
# horovod.backends.device_ipc (CUDA; the CPU emulation its tests use). Ranks must agree, and a batch never mixes.
HOST = 0


def make_request(name: str, rtype: RequestType, dtype: DataType, shape: Sequence[int],
                 reduce_op: ReduceOp = ReduceOp.SUM, prescale: float = 1.0, postscale: float = 1.0,
                 root: int = -1, group: str = "", group_size: int = 0,
                 splits: Optional[Sequence[int]] = None, device: int = HOST) -> Request:
    """A request, its fields in the types that go on the wire."""
    return Request(name, int(rtype), int(dtype), [int(d) for d in shape], int(reduce_op), float(prescale),
                   float(postscale), int(root), group, int(group_size),
                   None if splits is None else [int(s) for s in splits], int(device))


REQUESTS_KEPT = 1024           # requests kept for the next identical call (see single_request, group_requests)
_requests: dict = {}


def _keep(key: tuple, made):
    """Keep ``made`` (a request, or a group's list of them) under ``key`` for the next identical call, and return
    it; the memo starts over once it holds ``REQUESTS_KEPT``."""
    if len(_requests) >= REQUESTS_KEPT:
        _requests.clear()
    _requests[key] = made
    return made


def single_request(name: str, rtype: RequestType, dtype: DataType, shape: Sequence[int],
                   reduce_op: ReduceOp = ReduceOp.SUM, prescale: float = 1.0, postscale: float = 1.0,
                   root: int = -1, device: int = HOST) -> Request:
    """:func:`make_request` for one tensor outside a group, the same object again for the same arguments: a
    training loop repeats its collectives, and building a request costs a small blocking call a twentieth of its
    time (more inside a round than alone). Requests are never changed once made (the shape list included), so
    sharing one is safe. The memo starts over once it holds ``REQUESTS_KEPT`` (a program that makes a new name
    every call keeps no more)."""
    key = (name, rtype, dtype, shape, reduce_op, prescale, postscale, root, device)
    try:
        request = _requests.get(key)
    except TypeError:               # a shape that does not hash (a list): nothing kept
        return make_request(name, rtype, dtype, shape, reduce_op, prescale, postscale, root, device=device)
    if request is None:
        request = _keep(key, make_request(name, rtype, dtype, shape, reduce_op, prescale, postscale, root,
                                          device=device))
    return request


def group_requests(base: str, rtype: RequestType, dtypes: Sequence[DataType], shapes: Sequence[Sequence[int]],
                   reduce_op: ReduceOp = ReduceOp.SUM, prescale: float = 1.0, postscale: float = 1.0,
                   device: int = HOST) -> List[Request]:
    """The requests of a grouped op's members (``base``: the group's name; member ``i`` of ``n`` is named
    ``<base>_<i>of<n>``), the same list again for the same arguments, as :func:`single_request` keeps one (a
    training step's grouped allreduce of 32 gradients built 32 requests per step)."""
    n = len(dtypes)
    key = (base, rtype, tuple(dtypes), tuple(shapes), reduce_op, prescale, postscale, device)
    try:
        requests = _requests.get(key)
    except TypeError:               # a shape that does not hash (a list): nothing kept
        requests, key = None, None
    if requests is None:
        requests = [make_request(f"{base}_{i}of{n}", rtype, dtype, shape, reduce_op, prescale, postscale,
                                 group=base, group_size=n, device=device)
                    for i, (dtype, shape) in enumerate(zip(dtypes, shapes))]
        if key is not None:
            _keep(key, requests)
    return requests


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
        self.device = device        # HOST, or the device plane the buffers live on (Request.device)

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

    def request_matches(self, rank: int, request: Request) -> bool:
        """True when ``request`` from ``rank`` is exactly what produced this response (cache fast path)."""
        if request.rtype != self.rtype or request.dtype != self.dtype or request.reduce_op != self.reduce_op:
            return False
        if request.prescale != self.prescale or request.postscale != self.postscale or request.root != self.root:
            return False
        if request.device != self.device:
            return False
        shape = request.shape
        if self.rtype == RequestType.ALLGATHER:
            return bool(shape) and shape[0] == self.extra[rank] and shape[1:] == self.shape
        if self.rtype == RequestType.ALLTOALL:
            return bool(shape) and shape[1:] == self.shape and request.splits == self.extra[rank]
        return shape == self.shape
