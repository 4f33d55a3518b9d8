"""The gradient buckets of ``ZeroRedundancyOptimizer`` (``horovod.torch.zero_optimizer``) and their collectives.

Each bucket is one flat buffer, laid out by owner (``horovod.common.zero_layout``), that lives from step to step
and *is* the gradient memory: from the bucket's first exchange on, every trainable parameter's ``.grad`` is a
view into it, so backward accumulates straight into the buffer (a gradient that autograd made anew, at the first
step or after ``model.zero_grad()``, is copied in once and the view put in its place). A step then:

1. reduce-scatters the buffer: this rank receives the reduced gradients of its own parameters (``mine``) and
   copies them into its segment, where its parameters' ``.grad`` views read them;
2. (the optimizer steps this rank's parameters;)
3. writes this rank's updated parameters into ``mine`` (free by then) and allgathers it into the buffer, so the
   buffer holds every parameter, copies the other ranks' parameters out, and zeroes the buffer: after ``step()``
   every gradient reads zero.

So the gradients, the buffer and the gathered parameters share one allocation of the model's size; the
transients are ``mine`` (1/n of it) and, on GPUs, the staged allgather output.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Protocol, Tuple

import torch

from horovod.common.types import ReduceOp
from horovod.common.zero_layout import BucketLayout, layout
from horovod.core import ops
from horovod.core.process_sets import ProcessSet
from horovod.torch.mpi_ops import allgather_async, reducescatter_async, synchronize
from horovod.torch.tensors import numpy_view


class Sharded(Protocol):
    """What the exchange needs of its optimizer (``zero_optimizer.ZeroRedundancyOptimizer`` is one)."""

    rank: int                       # this rank's position in the process set
    world_size: int
    process_set: ProcessSet
    op: ReduceOp                    # Average or Sum
    _params: List[torch.Tensor]     # every parameter, in param_groups order
    _owner: Dict[int, int]          # parameter index -> the rank that owns it
    _buckets: List[List[int]]       # each bucket's parameter indices
    _scales: Tuple[float, float]    # the reducescatter's prescale and postscale
    _name: str                      # the prefix of the collectives' names


class BucketExchange:
    """The buffers, views and in-flight reducescatters of one optimizer's buckets."""

    def __init__(self, opt: Sharded) -> None:
        self.opt = opt
        self._layouts: Dict[Tuple[int, Tuple[int, ...]], BucketLayout] = {}
        self._flat: Dict[int, Tuple[Tuple[int, ...], torch.Tensor]] = {}
        self._dirty: set = set()
        self.clear()

    def clear(self) -> None:
        """Forget the exchange of this step (after it, or after a load_state_dict)."""
        self.handles: Dict[int, Tuple[int, BucketLayout]] = {}
        self._members: Dict[int, Tuple[int, ...]] = {}

    # ----------------------------------------------------------------- layout and memory
    def members(self, bucket: int) -> Tuple[int, ...]:
        """The bucket's trainable parameters (looked at once per step: a change of ``requires_grad`` takes
        effect at the next step, on every rank alike)."""
        members = self._members.get(bucket)
        if members is None:
            params = self.opt._params
            members = self._members[bucket] = tuple(i for i in self.opt._buckets[bucket] if params[i].requires_grad)
        return members

    def layout(self, bucket: int) -> BucketLayout:
        key = (bucket, self.members(bucket))
        if key not in self._layouts:
            opt = self.opt
            self._layouts[key] = layout(key[1], opt._owner, [p.numel() for p in opt._params], opt.world_size)
        return self._layouts[key]

    def _buffer(self, bucket: int) -> torch.Tensor:
        members = self.members(bucket)
        kept = self._flat.get(bucket)
        if kept is None or kept[0] != members:
            first = self.opt._params[members[0]]
            kept = self._flat[bucket] = (members, torch.zeros(self.layout(bucket).numel, dtype=first.dtype,
                                                              device=first.device))
        return kept[1]

    def _view(self, bucket: int, index: int, owner: int) -> torch.Tensor:
        p = self.opt._params[index]
        start = self.layout(bucket).padded_start(index, owner)
        return self._buffer(bucket)[start:start + p.numel()].view_as(p)

    def touched(self, bucket: int) -> None:
        """Backward wrote into the bucket (its gradient hook says so)."""
        self._dirty.add(bucket)

    def zero_grads(self, set_to_none: bool) -> None:
        """Zero the gradients that are views of a bucket in place (buckets nothing wrote to since they were last
        zeroed are skipped); any other gradient of a bucketed parameter (made by autograd before the bucket
        first started) is set to None or zeroed, as ``set_to_none`` says."""
        params = self.opt._params
        for bucket in range(len(self.opt._buckets)):
            members = self.members(bucket)
            kept = self._flat.get(bucket)
            in_place = kept is not None and kept[0] == members
            if in_place and bucket in self._dirty:
                kept[1].zero_()
            for i in members:
                grad = params[i].grad
                if grad is None or (in_place and grad.data_ptr() == self._view(bucket, i, self.opt._owner[i]).data_ptr()):
                    continue
                if set_to_none:
                    params[i].grad = None
                else:
                    grad.detach_().zero_()
        self._dirty.clear()

    # ----------------------------------------------------------------- collectives
    def start(self, bucket: int) -> None:
        """Put every gradient of the bucket in its place (zeros for a parameter without one) and start the
        reducescatter."""
        opt = self.opt
        if not self.members(bucket) or bucket in self.handles:
            return
        lay = self.layout(bucket)
        buffer = self._buffer(bucket)
        for owner, owned in enumerate(lay.per_rank):
            for i in owned:
                p, view = opt._params[i], self._view(bucket, i, owner)
                grad = p.grad
                if grad is not None and grad.is_sparse:
                    raise ValueError(f"ZeroRedundancyOptimizer needs dense gradients, but parameter {i} of the "
                                     "param_groups got a sparse one (nn.Embedding(sparse=True)?): make it dense "
                                     "(sparse=False), or use hvd.DistributedOptimizer, which reduces sparse "
                                     "gradients.")
                if grad is None:
                    view.zero_()
                elif grad.data_ptr() != view.data_ptr():
                    view.copy_(grad)
                if grad is None or grad.data_ptr() != view.data_ptr():
                    p.grad = view
        self._dirty.add(bucket)
        prescale, postscale = opt._scales
        handle = reducescatter_async(buffer, name=f"{opt._name}.grads.{bucket}", op=opt.op,
                                     process_set=opt.process_set, prescale_factor=prescale, postscale_factor=postscale)
        self.handles[bucket] = (handle, lay)

    def reduce_scatter(self) -> Dict[int, torch.Tensor]:
        """Start the buckets backward did not start, wait for all, and put this rank's reduced gradients in its
        segments (under its parameters' ``.grad``). Returns ``mine`` of each bucket, free for the allgather."""
        for bucket in range(len(self.opt._buckets)):
            self.start(bucket)
        received = {}
        for bucket, (handle, lay) in self.handles.items():
            mine = synchronize(handle)
            segment = self.opt.rank * lay.segment
            self._buffer(bucket)[segment:segment + lay.segment].copy_(mine)
            received[bucket] = mine
        return received

    @torch.no_grad()
    def allgather_parameters(self, received: Dict[int, torch.Tensor]) -> None:
        """Send this rank's updated parameters of each bucket (in ``mine``, padded to the segment), gather every
        rank's into the bucket, copy the others' out, and zero the bucket."""
        opt = self.opt
        finishers = []
        for bucket, mine in received.items():
            lay = self.layout(bucket)
            owned = [opt._params[i].reshape(-1) for i in lay.per_rank[opt.rank]]
            if owned:
                torch.cat(owned, out=mine[:lay.used[opt.rank]])
            mine[lay.used[opt.rank]:].zero_()
            finishers.append((bucket, self._gather_into(mine, self._buffer(bucket), f"{opt._name}.params.{bucket}")))
        for bucket, finish in finishers:
            finish()
            lay = self.layout(bucket)
            for owner, owned in enumerate(lay.per_rank):
                if owner != opt.rank:
                    for i in owned:
                        opt._params[i].copy_(self._view(bucket, i, owner))
            self._buffer(bucket).zero_()
        self._dirty.clear()

    def _gather_into(self, send: torch.Tensor, out: torch.Tensor, name: str) -> Callable[[], None]:
        """Start an allgather of ``send`` (the same size on every rank) into ``out``; returns the wait. Host
        tensors are gathered in place through the op layer; device tensors through the binding, then copied."""
        ps = self.opt.process_set
        if send.device.type == "cpu":
            handle = ops.allgather_async(numpy_view(send), ops.tensor_name("allgather", name, process_set=ps),
                                         lambda shape, _dtype: numpy_view(out).reshape(shape), ps)

            def wait() -> None:
                handle.wait()
        else:
            pending = allgather_async(send, name=name, process_set=ps)

            def wait() -> None:
                out.copy_(synchronize(pending))
        return wait

