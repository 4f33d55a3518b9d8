"""``DistributedOptimizer``: allreduce every gradient while backward is still running, then step.

The wrapper is a dynamic subclass of the user's optimizer class (upstream's design), so ``isinstance`` checks,
``param_groups`` and learning-rate schedulers keep working. A hook on each parameter starts that gradient's
allreduce as soon as autograd has accumulated it, so communication overlaps the rest of backward; ``step()``
waits for the outstanding allreduces, writes the averaged gradients back and steps.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import torch

from horovod.common import config
from horovod.common.compression import check_powersgd_op
from horovod.common.gradient_groups import check_predivide, fixed_groups, scale_factors
from horovod.core import basics, ops
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.torch import powersgd
from horovod.torch.adasum_optimizer import _DistributedAdasumOptimizer
from horovod.torch.compression import Compression
from horovod.torch.mpi_ops import (
    Adasum,
    Average,
    Sum,
    allreduce_async_,
    grouped_allreduce_,
    grouped_allreduce_async_,
    size,
    sparse_allreduce_async,
    synchronize,
)
from horovod.torch.optimizer_parts import (
    check_nothing_pending,
    checked_named_parameters,
    count_backward_pass,
    find_duplicates,
    register_gradient_hooks,
    set_passes,
)
from horovod.torch.unused_parameters import UnusedParameters, missing_parameters

log = logging.getLogger("horovod.torch")  # a named channel: see horovod.common.logging_setup
# Marks, in ``_handles``, a gradient kept for synchronize()'s one blocking grouped allreduce of small gradients.
SMALL = object()
SMALL_GROUP_NAME = "DistributedOptimizer.small_gradients"
_FLAG_BYTES = 4         # the unused-parameter flag that goes with them (float32)


class _SmallPlan(NamedTuple):
    """Which gradients go in synchronize()'s grouped allreduce of small gradients (see _small_gradients)."""

    engine: object                  # the engine it was planned for: planned again when that changes
    kept: set                       # the parameters, as a set
    order: List[torch.Tensor]       # and in the order every rank sends them
    flag: bool                      # the unused-parameter flag goes with them (see _small_allreduce)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        all_params = [p for group in self.param_groups for p in group["params"]]
        named_parameters = checked_named_parameters(self.param_groups, named_parameters)
        self._parameter_names = {v: k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles: Dict[torch.Tensor, Tuple[Optional[int], object]] = {}
        self._hook_handles: List = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = fixed_groups(groups, [p for p in all_params if p.requires_grad], torch.Tensor)
        # PowerSGD (Compression.powersgd): its state, and its matrices taken out of the groups (see powersgd.py).
        self._powersgd = powersgd.state_for(compression, named_parameters)
        self._compression = compression if self._powersgd is None else Compression.none
        if self._powersgd is not None:
            self._groups = self._powersgd.ungrouped(self._groups)
        self._group_of = {p: i for i, group in enumerate(self._groups or []) for p in group}
        self._group_ready: Dict[int, set] = {}
        trainable = {id(p) for p in all_params if p.requires_grad}
        self._unused = UnusedParameters([(k, v) for k, v in named_parameters if id(v) in trainable], process_set)
        # The gradients exchanged together at synchronize() (see _small_gradients), planned per engine from units:
        # each group whose parameters are all on the host, and each host parameter outside any group, in the
        # order the optimizer holds them.
        self._small_order = host = [p for p in all_params if p.requires_grad and p.is_cpu]
        self._small_units = [[p] for p in host if p not in self._group_of] + [
            group for group in (self._groups or []) if all(p.is_cpu for p in group)]
        self._small_plan = _SmallPlan(None, set(), [], False)
        self._flag = torch.zeros(1, dtype=torch.float32)     # see _small_allreduce
        if process_set.included() and (size() > 1 or config.get("HOROVOD_ELASTIC")):
            self._register_hooks()

    # ----------------------------------------------------------------- set-up
    @staticmethod
    def find_duplicates(lst) -> set:
        """The elements of ``lst`` that occur more than once (upstream's helper)."""
        return find_duplicates(lst)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before gradients are allreduced."""
        set_passes(self, passes)

    def _register_hooks(self) -> None:
        register_gradient_hooks(self)

    # ----------------------------------------------------------------- allreduce
    def _scale_factors(self) -> Tuple[float, float]:
        return scale_factors(self.op, self.gradient_predivide_factor)

    def _allreduce_grad_async(self, p: torch.Tensor):
        if p.grad is None:
            # A parameter that got no gradient on this rank still takes part, so that no rank waits for it.
            p.grad = torch.zeros_like(p)
        name = self._parameter_names.get(p)
        tensor = p.grad
        if self._powersgd is not None and self._powersgd.defers(p, self.sparse_as_dense):
            return powersgd.DEFERRED, None                  # exchanged by synchronize()'s PowerSGD rounds
        if tensor.is_sparse:
            if self.sparse_as_dense:
                tensor = tensor.to_dense()
            else:
                return self._sparse_allreduce_grad_async(p, name)
        compressed, ctx = self._compression.compress(tensor)
        prescale, postscale = self._scale_factors()
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=prescale,
                                  postscale_factor=postscale, process_set=self.process_set)
        return handle, (ctx, compressed, tensor)

    def _sparse_allreduce_grad_async(self, p: torch.Tensor, name: str):
        result = sparse_allreduce_async(p.grad, name=name, op=self.op, process_set=self.process_set)
        return result, "sparse"

    def _grouped_allreduce_async(self, group_index: int):
        params = self._groups[group_index]
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grad = p.grad.to_dense() if (p.grad.is_sparse and self.sparse_as_dense) else p.grad
            if grad.is_sparse:
                raise ValueError("sparse gradients in groups need sparse_as_dense=True")
            grads.append(grad)
        compressed = [self._compression.compress(g) for g in grads]
        prescale, postscale = self._scale_factors()
        handle = grouped_allreduce_async_([c[0] for c in compressed], name=f"grouped.{group_index}", op=self.op,
                                          prescale_factor=prescale, postscale_factor=postscale,
                                          process_set=self.process_set)
        return handle, [(c[1], c[0], g) for c, g in zip(compressed, grads)]

    def _small_gradients(self) -> Tuple[set, List[torch.Tensor]]:
        """The parameters whose gradients wait for synchronize() and go there in one blocking grouped allreduce,
        which one fast round takes (core/engine/fast_rounds.py; a 784-128-10 MLP's 4 gradients from their hooks
        added 1.8 ms to a 2-rank step through the coordinator, 0.6 ms this way: docs/torch.md). As a set and in
        a fixed order: the smallest host gradients that fit one round together, each of the ``groups`` counted
        whole, as one unit (``ops.fast_group``, by the parameters' sizes, so every rank plans alike; a group went
        from its hooks through the coordinator, and ``groups=2`` made a 2-rank MLP step 1.8x slower than none);
        none where the process set has no fast rounds (its ranks span hosts), for Adasum or PowerSGD. The larger
        gradients and groups still start from their hooks, overlapping the backward pass. Planned again when the
        engine changes (an elastic reset)."""
        engine = basics.engine_for(self.process_set)
        if self._small_plan.engine is not engine:
            chosen: List[torch.Tensor] = []
            flag = False
            if self.op != Adasum and self._powersgd is None:
                units = self._small_units
                # Whole units only (a group is not split); the unused-parameter flag (index 0) is planned with
                # them, so that every rank plans its room alike
                sizes = [_FLAG_BYTES] + [[p.numel() * p.element_size() for p in unit] for unit in units]
                fitting = ops.fast_group(sizes, self.process_set)
                kept = {id(p) for i in fitting if i for p in units[i - 1]}
                chosen = [p for p in self._small_order if id(p) in kept]
                flag = bool(chosen) and 0 in fitting and self.op in (Average, Sum)
            self._small_plan = _SmallPlan(engine, set(chosen), chosen, flag)
        return self._small_plan.kept, self._small_plan.order

    def _small_allreduce(self, params: List[torch.Tensor], missing: List[torch.Tensor]) -> Optional[float]:
        """Allreduce ``params``' gradients (kept by their hooks) in one blocking grouped allreduce, and write the
        results into ``p.grad`` (see _small_gradients).

        Where the plan has room for it (op Average or Sum), one more member goes with them: how many of the
        parameters ``missing`` (no gradient on this rank) the unused-parameter check follows, as a float32. Its
        reduction, returned, is zero exactly when no rank missed any (non-negative counts, positive scale
        factors), so the usual step needs no round of its own for that check (UnusedParameters.record); None
        when the flag did not go."""
        originals, tensors, contexts = [], [], []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grad = p.grad.to_dense() if p.grad.is_sparse else p.grad
            originals.append(grad)
            tensor, ctx = self._compression.compress(grad)
            tensors.append(tensor)
            contexts.append(ctx)
        flag = self._small_plan.flag
        if flag:
            self._flag.fill_(self._unused.count(missing))
            tensors.append(self._flag)
        prescale, postscale = self._scale_factors()
        grouped_allreduce_(tensors, name=SMALL_GROUP_NAME, op=self.op, prescale_factor=prescale,
                           postscale_factor=postscale, process_set=self.process_set)
        for p, tensor, ctx, original in zip(params, tensors, contexts, originals):
            self._write_back(p, tensor, ctx, tensor, original)
        return float(self._flag[0]) if flag else None

    def _keeps(self, p: torch.Tensor) -> bool:
        """Whether ``p``'s gradient waits for synchronize()'s grouped allreduce of small gradients: ``p`` is one
        of them (_small_gradients) and its gradient is dense, or goes dense (``sparse_as_dense``)."""
        return p in self._small_gradients()[0] and (p.grad is None or not p.grad.is_sparse or self.sparse_as_dense)

    def _make_hook(self, p: torch.Tensor):
        def hook(*_ignore):
            handle, ctx = None, None
            if count_backward_pass(self._handles, self._allreduce_delay, p):
                group_index = self._group_of.get(p)
                if self._keeps(p):
                    handle = SMALL
                elif group_index is None:
                    handle, ctx = self._allreduce_grad_async(p)
                else:
                    ready = self._group_ready.setdefault(group_index, set())
                    ready.add(p)
                    if len(ready) == len(self._groups[group_index]):
                        handle, ctx = self._grouped_allreduce_async(group_index)
                        for q in self._groups[group_index]:
                            self._handles[q] = (handle, ctx)
                        del self._group_ready[group_index]
                        return
            self._handles[p] = (handle, ctx)

        return hook

    # ----------------------------------------------------------------- step
    def synchronize(self) -> None:
        """Wait for every outstanding gradient allreduce and write the results into ``p.grad``."""
        if not self.process_set.included():
            self._synchronized = True
            return
        # Parameters whose hook never fired (no gradient on this rank): still allreduced (as zeros), so that no
        # rank waits; the ranks compare notes once the gradients are done (unused_parameters) and name them.
        missing = missing_parameters(self)
        if self._requires_update:
            for p in missing:
                self._handles[p] = (None, None)
        pending_groups = set()
        for p, (handle, _ctx) in list(self._handles.items()):
            if handle is not None:
                continue
            group_index = self._group_of.get(p)
            if self._keeps(p):
                self._handles[p] = (SMALL, None)
            elif group_index is None:
                self._handles[p] = self._allreduce_grad_async(p)
            else:
                pending_groups.add(group_index)
        for group_index in sorted(pending_groups):
            handle, ctx = self._grouped_allreduce_async(group_index)
            for q in self._groups[group_index]:
                self._handles[q] = (handle, ctx)
            self._group_ready.pop(group_index, None)
        if self._powersgd is not None:      # the P and Q rounds, while the other gradients' allreduces run
            deferred = [p for p, (handle, _ctx) in self._handles.items() if handle is powersgd.DEFERRED]
            self._powersgd.reduce(deferred, self.op, *self._scale_factors(), self.process_set)

        results = {}
        for p, (handle, ctx) in self._handles.items():
            if handle is powersgd.DEFERRED or handle is SMALL:
                pass                                        # written by the PowerSGD rounds above, or below
            elif ctx == "sparse":
                p.grad = handle()
            elif isinstance(ctx, list):                     # a group: one handle, one ctx per member
                if handle not in results:
                    results[handle] = synchronize(handle)
                group = self._groups[self._group_of[p]]
                index = next(i for i, q in enumerate(group) if q is p)     # identity: tensors compare elementwise
                self._write_back(p, results[handle][index], *ctx[index])
            else:
                output = synchronize(handle)
                self._write_back(p, output, *ctx)
            self._allreduce_delay[p] = self.backward_passes_per_step
        # The small gradients last, once this rank has nothing else in flight: one fast round takes them then.
        small = [p for p in self._small_gradients()[1] if self._handles.get(p, (None,))[0] is SMALL]
        missing_anywhere = self._small_allreduce(small, missing) if small else None
        self._handles.clear()
        self._unused.record(missing, missing_anywhere)
        self._synchronized = True

    def _write_back(self, p: torch.Tensor, output: torch.Tensor, ctx, compressed, original) -> None:
        reduced = self._compression.decompress(output, ctx)
        if p.grad.is_sparse:
            # sparse_as_dense: the allreduce ran on the dense form; the optimizer gets a sparse gradient back, as
            # upstream does (SparseAdam accepts nothing else). Rows that are zero on every rank are left out.
            p.grad = reduced.reshape(p.grad.shape).to_sparse(p.grad.sparse_dim())
        elif p.grad is not original or reduced.data_ptr() != p.grad.data_ptr():
            p.grad.copy_(reduced.reshape(p.grad.shape))

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this context ``step()`` does not synchronize (call ``synchronize()`` yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to "
                              "consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def _horovod_inner_step(self):
        """Step the underlying optimizer without synchronizing (used to materialise empty state)."""
        return super(self.__class__, self).step()

    def zero_grad(self, *args, **kwargs):
        check_nothing_pending(self._handles)
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def state_dict(self):
        """The wrapped optimizer's state dict; with PowerSGD also its state under ``"powersgd"``."""
        state = super(self.__class__, self).state_dict()
        if self._powersgd is not None:
            state["powersgd"] = self._powersgd.state_dict()
        return state

    def load_state_dict(self, state_dict):
        # As upstream: loading a state forgets outstanding allreduces and restarts the pass counters.
        self._handles = {}
        self._group_ready = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        state_dict = dict(state_dict)
        saved_powersgd = state_dict.pop("powersgd", None)
        if self._powersgd is not None:
            self._powersgd.load_state_dict(saved_powersgd)
        return super(self.__class__, self).load_state_dict(state_dict)

    def _horovod_broadcast_extra_state(self, root_rank: int, process_set: ProcessSet) -> None:
        """Called by ``broadcast_optimizer_state``: the PowerSGD step count and Qs from ``root_rank``."""
        if self._powersgd is not None:
            self._powersgd.broadcast(root_rank, process_set)


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                         compression=Compression.none, backward_passes_per_step: int = 1, op=Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                         sparse_as_dense: bool = False, process_set: ProcessSet = global_process_set):
    """Wrap ``optimizer`` so that gradients are averaged across ranks before every step.

    Arguments follow upstream Horovod: ``named_parameters`` (usually ``model.named_parameters()``) names the
    allreduces; ``compression`` (``Compression.none``, ``.fp16``, ``.bf16``, or ours, DDP's PowerSGD:
    ``Compression.powersgd(matrix_approximation_rank=...)``, see docs/compression.md); ``backward_passes_per_step``
    accumulates that many backward passes locally; ``op`` is the reduction (Average by default);
    ``gradient_predivide_factor`` splits the averaging into a division before and after the sum; ``groups``
    (an int, or lists of parameters) allreduces parameters together. Sparse gradients (``nn.Embedding(...,
    sparse=True)``) are allreduced as an allgather of their indices and values; ``sparse_as_dense=True``
    allreduces their dense form instead, and either way the optimizer steps on a sparse gradient.

    ``op=hvd.Adasum`` (on more than one rank) gives upstream's delta optimizer instead: each rank steps the
    wrapped optimizer on its own gradients as soon as they are ready, and the weight deltas are combined with
    Adasum (see ``horovod.torch.adasum_optimizer`` and docs/adasum.md); ``skip_synchronize`` is refused there.
    """
    check_predivide(op, gradient_predivide_factor)
    check_powersgd_op(compression, op)
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == Adasum and size() > 1:
        # Upstream's delta optimizer: each rank steps locally, the weight deltas are combined with Adasum.
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, process_set)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
