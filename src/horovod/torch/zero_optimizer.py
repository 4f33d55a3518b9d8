"""``ZeroRedundancyOptimizer``: ZeRO stage 1 for ``horovod.torch``: each rank of a process set keeps the optimizer
state of only the parameters it owns (about 1/n of it), with no DistributedDataParallel needed.

Parameters get owners and travel in buckets (``horovod.common.zero_layout``); each bucket is one flat buffer
that holds the gradients (``horovod.torch.zero_exchange``). Once every gradient of a bucket is ready (a
post-accumulate-grad hook counts the backward passes), or in ``step()`` at the latest, one reducescatter leaves
each rank the averaged gradients of the parameters it owns. ``step()`` waits for those, steps this rank's
``optimizer_class`` instance (``.optim``) on its parameters only, and allgathers the updated parameters. State
dicts are in ``horovod.torch.zero_state``. See docs/zero.md.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, List, Optional, Type

import torch

from horovod.common import config
from horovod.common.gradient_groups import scale_factors
from horovod.common.types import Average, ReduceOp, Sum
from horovod.common.zero_layout import Param, plan
from horovod.core import ops
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.torch import zero_state
from horovod.torch.optimizer_parts import check_nothing_pending
from horovod.torch.zero_exchange import BucketExchange

_TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                    "Increase backward_passes_per_step to accumulate gradients locally.")


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """Shard ``optimizer_class``'s state over the ranks of ``process_set`` (torch's
    ``torch.distributed.optim.ZeroRedundancyOptimizer`` signature, without DDP).

    ``params`` and ``**defaults`` are what ``optimizer_class`` takes. Beyond torch's arguments:
    ``bucket_cap_bytes`` (default ``HOROVOD_FUSION_THRESHOLD``) sizes the buckets; ``backward_passes_per_step``
    lets a bucket's exchange start during the N-th backward pass (gradients accumulate locally before, as in
    ``hvd.DistributedOptimizer``; ``step()`` always exchanges and steps); ``op`` is Average (default) or Sum,
    with ``gradient_predivide_factor`` as in ``hvd.DistributedOptimizer``; ``name`` names the collectives
    (default: one per instance, counted in construction order, the same on every rank).
    ``parameters_as_bucket_view`` and ``overlap_with_ddp`` are torch's, accepted only as False.
    """

    _instances = itertools.count()

    def __init__(self, params, optimizer_class: Type[torch.optim.Optimizer] = torch.optim.Adam,
                 process_set: ProcessSet = global_process_set, parameters_as_bucket_view: bool = False,
                 overlap_with_ddp: bool = False, *, bucket_cap_bytes: Optional[int] = None,
                 backward_passes_per_step: int = 1, op: ReduceOp = Average, gradient_predivide_factor: float = 1.0,
                 name: Optional[str] = None, **defaults: Any) -> None:
        if parameters_as_bucket_view or overlap_with_ddp:
            raise ValueError("ZeroRedundancyOptimizer here needs no DDP and keeps parameters as they are: pass "
                             "parameters_as_bucket_view=False and overlap_with_ddp=False (step() reduce-scatters the "
                             "gradients itself).")
        if isinstance(optimizer_class, torch.optim.Optimizer) or not isinstance(optimizer_class, type):
            raise TypeError("optimizer_class must be an optimizer class (torch.optim.Adam), not an instance; its "
                            "options go as keyword arguments: ZeroRedundancyOptimizer(params, torch.optim.Adam, lr=0.1)")
        if ReduceOp(op) not in (Average, Sum):
            raise ValueError(f"ZeroRedundancyOptimizer reduces with op=Average or op=Sum (a reducescatter), not "
                             f"op={ReduceOp(op).name.capitalize()}; use hvd.DistributedOptimizer for other ops.")
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        if process_set.process_set_id is None:
            raise ValueError(f"{process_set} is not registered: add it with hvd.add_process_set (or "
                             "hvd.init(process_sets=...)) before building the optimizer on it.")
        self._initialized = False
        super().__init__(params, defaults)
        self.optimizer_class = optimizer_class
        self.process_set = process_set
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.op = ReduceOp(op)
        self._scales = scale_factors(self.op, gradient_predivide_factor)
        self._bucket_bytes = int(config.get("HOROVOD_FUSION_THRESHOLD") if bucket_cap_bytes is None
                                 else bucket_cap_bytes)
        self._name = name or f"ZeroRedundancyOptimizer.{next(self._instances)}"
        self._defaults = defaults
        self._params: List[torch.Tensor] = []
        self._hooks: List[Any] = []
        self._consolidated: Optional[Dict[int, dict]] = None
        self._reshard()
        self._initialized = True

    # ----------------------------------------------------------------- partition
    def _reshard(self) -> None:
        """Partition every parameter for the process set's current membership and build a fresh ``.optim``
        (its state is empty). Run at construction, and by ``hvd.elastic.TorchState`` after a reset."""
        ps = self.process_set
        member = bool(ps.included())
        self.world_size = ops.set_size(ps) if member else 1
        self.rank = ops.set_rank(ps) if member else 0
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._owner: Dict[int, int] = {}
        self._buckets: List[List[int]] = []
        self._loads = [0] * self.world_size
        self._params = []
        self._exchange = BucketExchange(self)
        for group in self.param_groups:
            self._add_params(group["params"])
        self.optim = self.optimizer_class(self._local_groups(), **self._defaults)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)
        self._reset_exchange()

    def _add_params(self, params: List[torch.Tensor]) -> None:
        for p in params:
            if p.is_sparse:
                raise ValueError("ZeroRedundancyOptimizer shards dense parameters only; this one is sparse.")
        first = len(self._params)
        self._params.extend(params)
        described = [Param(p.numel(), p.element_size(), (p.dtype, p.device)) for p in self._params]
        made = plan(described, self.world_size, self._bucket_bytes,
                    indices=list(reversed(range(first, len(self._params)))), loads=self._loads)
        self._owner.update(made.owners)
        self._buckets.extend(made.buckets)
        self._loads = made.loads
        self._bucket_of = {i: b for b, members in enumerate(self._buckets) for i in members}
        for i in range(first, len(self._params)):
            if self._params[i].requires_grad:
                self._hooks.append(self._params[i].register_post_accumulate_grad_hook(self._make_hook(i)))

    def _local_groups(self) -> List[dict]:
        """``param_groups`` restricted to the parameters this rank owns (a group may be empty)."""
        groups, index = [], 0
        for group in self.param_groups:
            owned = []
            for p in group["params"]:
                if self._owner[index] == self.rank:
                    owned.append(p)
                index += 1
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": owned})
        return groups

    def _distributed(self) -> bool:
        return self.world_size > 1

    def _check_membership(self) -> None:
        member = bool(self.process_set.included())
        now = (ops.set_size(self.process_set), ops.set_rank(self.process_set)) if member else (1, 0)
        if now != (self.world_size, self.rank):
            raise RuntimeError(f"ZeroRedundancyOptimizer was partitioned for {self.world_size} ranks (this one "
                               f"{self.rank}), but {self.process_set} now has {now[0]} (this one {now[1]}): after "
                               "an elastic reset, track the optimizer in hvd.elastic.TorchState, whose sync() "
                               "re-partitions it and loads the committed state.")

    # ----------------------------------------------------------------- backward passes
    def _reset_exchange(self) -> None:
        self._exchange.clear()
        self._delay = {i: self.backward_passes_per_step for i in range(len(self._params))}
        self._ready: Dict[int, set] = {}

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(_param: torch.Tensor) -> None:
            if not self._distributed():
                return
            bucket = self._bucket_of[index]
            if bucket in self._exchange.handles or self._delay[index] <= 0:
                raise AssertionError(_TOO_MANY_PASSES)
            self._exchange.touched(bucket)
            self._delay[index] -= 1
            if self._delay[index] == 0:
                ready = self._ready.setdefault(bucket, set())
                ready.add(index)
                if len(ready) == len(self._exchange.members(bucket)):
                    self._exchange.start(bucket)
        return hook

    # ----------------------------------------------------------------- the optimizer's API
    def step(self, closure: Optional[Callable[[], float]] = None, **kwargs: Any) -> Optional[float]:
        """Reduce-scatter the gradients, step this rank's parameters, allgather every parameter. A ``closure`` is
        evaluated once, before the exchange (optimizers that call it several times, like LBFGS, are not
        supported on more than one rank)."""
        self._check_membership()
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        if not self._distributed():
            loss = self.optim.step(closure, **kwargs) if closure is not None else self.optim.step(**kwargs)
            self._sync_param_groups(self.optim.param_groups, self.param_groups)
            self._reset_exchange()
            return loss
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        received = self._exchange.reduce_scatter()
        self.optim.step(**kwargs)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)
        self._exchange.allgather_parameters(received)
        self._reset_exchange()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's, over every parameter, but on more than one rank the gradients that live in the buckets are
        zeroed in place whatever ``set_to_none`` says (they are views of the buckets; ``None`` would make
        backward allocate them again). Refused while a gradient exchange is in flight (as
        ``hvd.DistributedOptimizer``)."""
        check_nothing_pending(self._exchange.handles)
        if not self._distributed():
            super().zero_grad(set_to_none)
            return
        self._exchange.zero_grads(set_to_none)
        for p in self._params:
            if not p.requires_grad and p.grad is not None:      # (no bucket holds them)
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (on every rank of the set, in the same order); its parameters get owners of their own,
        the existing ones keep theirs, so no state moves."""
        super().add_param_group(param_group)
        if self._initialized:
            self._add_params(self.param_groups[-1]["params"])
            self.optim.add_param_group(self._local_groups()[-1])
            # The new group takes the defaults optimizer_class fills in; the other groups' options stay ours.
            self._sync_param_groups(self.optim.param_groups[-1:], self.param_groups[-1:])
            self._delay.update({i: self.backward_passes_per_step for i in range(len(self._params))
                                if i not in self._delay})

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before a bucket's exchange starts."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = int(passes)
        self._delay = {i: self.backward_passes_per_step for i in range(len(self._params))}

    def consolidate_state_dict(self, to: Optional[int] = 0) -> None:
        """Gather every rank's shard of the state to global rank ``to`` (``None``: to every rank of the set);
        call it on every rank of the set. ``state_dict()`` there then returns the whole state."""
        zero_state.consolidate(self, to)

    def state_dict(self) -> Dict[str, Any]:
        """The state consolidated to this rank (as of ``consolidate_state_dict``), in the layout of a plain
        ``optimizer_class`` over every parameter; RuntimeError on a rank it was not consolidated to."""
        return zero_state.full_state_dict(self)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a whole state dict (``state_dict()``'s, or a plain ``optimizer_class``'s over the same parameter
        groups) on every rank; each keeps copies of its own parameters' state only."""
        zero_state.load(self, state_dict)
        self._reset_exchange()

    @staticmethod
    def _sync_param_groups(source: List[dict], target: List[dict]) -> None:
        """Copy the options (``lr`` and the rest, everything but ``params``) group by group."""
        for src, dst in zip(source, target):
            for key, value in src.items():
                if key != "params":
                    dst[key] = value
