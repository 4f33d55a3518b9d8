"""``DistributedOptimizer(op=hvd.Adasum)``: upstream's delta optimizer (``_DistributedAdasumOptimizer``).

Adasum combines *updates*, not gradients: each rank applies the wrapped optimizer to its own gradient, and the
ranks' weight deltas are combined with Adasum and added to the weights they started from::

    start = current.copy()
    current = step(current, g)            # the wrapped optimizer, on this rank's gradient only
    delta = current - start
    delta = allreduce(delta, op=Adasum)
    current = start + delta

As upstream, the local step runs in each parameter's gradient hook, so that the Adasum allreduce of one
parameter's delta overlaps the rest of backward: the hook steps the wrapped optimizer on that parameter alone,
leaves the delta in the parameter's memory and starts an in-place allreduce of it; ``step()`` waits for every
allreduce and writes ``start + delta`` back. Upstream refuses process sets other than the global one; here the
deltas are combined over ``process_set`` (a rank outside it steps locally and exchanges nothing).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.torch.mpi_ops import Adasum, allreduce_async_, synchronize
from horovod.torch.optimizer_parts import (
    check_nothing_pending,
    checked_named_parameters,
    count_backward_pass,
    register_gradient_hooks,
    set_passes,
)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 process_set: ProcessSet = global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        named_parameters = checked_named_parameters(self.param_groups, named_parameters)
        self._parameter_names = {v: k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self.process_set = process_set
        self._handles: Dict[torch.Tensor, Tuple[Optional[int], object]] = {}
        self._hook_handles = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False) for _, p in named_parameters}
        if process_set.included():
            self._register_hooks()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before a delta is exchanged."""
        set_passes(self, passes)

    def _register_hooks(self) -> None:
        register_gradient_hooks(self, zero_grads=True)          # as upstream: every parameter has a gradient

    def _allreduce_grad_async(self, p: torch.Tensor):
        """Step the wrapped optimizer on ``p`` alone, leave the delta in ``p`` and start its Adasum allreduce.

        ``start`` is this step's starting value: delta = (start - lr * f(g)) - start, computed in place.
        """
        name = self._parameter_names.get(p)
        start = self._starting_models[p]
        stashed = []
        for group in self.param_groups:
            stashed.append(group["params"])
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            start.data.copy_(p)
            super(self.__class__, self).step()
            p.data.sub_(start)
        finally:
            for params, group in zip(stashed, self.param_groups):
                group["params"] = params
        compressed, ctx = self._compression.compress(p)
        handle = allreduce_async_(compressed.data, name=name, op=Adasum, process_set=self.process_set)
        return handle, ctx

    def _make_hook(self, p: torch.Tensor):
        def hook(*_ignore):
            handle, ctx = None, None
            if count_backward_pass(self._handles, self._allreduce_delay, p):
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    def synchronize(self) -> None:
        """Nothing to do (upstream's): the deltas are exchanged and applied by ``step()``."""

    def skip_synchronize(self):
        """Refused, as upstream: there is no separate synchronization to skip."""
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")

    def step(self, closure=None):
        """Exchange every parameter's delta (stepping locally first where its hook has not yet) and set each
        parameter to its starting value plus the combined delta. A rank outside the process set just steps."""
        if not self.process_set.included():
            return super(self.__class__, self).step(closure)
        loss = closure() if closure is not None else None
        for p in self._requires_update - set(self._handles):
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            if handle is None:           # step() before backward_passes_per_step passes: exchange now
                handle, ctx = self._allreduce_grad_async(p)
                self._handles[p] = (handle, ctx)
            delta = self._compression.decompress(synchronize(handle), ctx)
            start = self._starting_models[p]
            start.data.add_(delta.data)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def _horovod_inner_step(self):
        """Step the underlying optimizer without exchanging anything (used to materialise empty state)."""
        return super(self.__class__, self).step()

    def zero_grad(self, *args, **kwargs):
        check_nothing_pending(self._handles)
        return super(self.__class__, self).zero_grad(*args, **kwargs)
