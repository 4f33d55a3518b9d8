"""A Lightning ``Strategy`` that runs an unchanged ``Trainer`` data-parallel on Horovod.

Lightning 2.x removed its ``strategy="horovod"``; this puts it back for the Spark Lightning estimator. It is
Lightning's single-device (CPU) strategy with Horovod's ranks: the rank and size come from ``horovod.torch``,
the module's parameters and optimizer state are broadcast from rank 0 once ``configure_optimizers`` has built
the optimizers, every optimizer is wrapped in ``hvd.DistributedOptimizer``, and ``reduce``, ``all_gather``,
``broadcast``, ``barrier`` and ``reduce_boolean_decision`` (``self.log(..., sync_dist=True)``, early
stopping) go through Horovod's collectives.

Lightning steps an optimizer with a closure that runs the forward and backward pass inside ``optimizer.step``,
so, as upstream's Horovod strategy did, the gradients are synchronized after each backward pass
(``post_backward``) and the step itself runs under ``skip_synchronize``.

``strategy_class(pl)`` builds the class for a Lightning package (``lightning.pytorch`` or
``pytorch_lightning``): a module must be trained by the Trainer of the package it subclasses.
"""
from __future__ import annotations

import contextlib
import functools
from types import ModuleType
from typing import Any, Dict

_CLASSES: Dict[str, type] = {}


def _named_parameters(module: Any, optimizer: Any) -> list:
    """The module's (name, parameter) pairs that ``optimizer`` updates (DistributedOptimizer names its
    allreduces by them)."""
    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return [(name, p) for name, p in module.named_parameters() if id(p) in owned]


def _track_step(optimizer: Any) -> None:
    """Mark ``optimizer.step`` as torch's LR schedulers mark their optimizer's, so that a scheduler moved onto
    the Horovod-wrapped optimizer knows its steps (and warns of nothing)."""
    step = optimizer.step

    @functools.wraps(step)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True
        return step(*args, **kwargs)

    tracked._wrapped_by_lr_sched = True
    optimizer.step = tracked


def strategy_class(pl: ModuleType) -> type:
    """``HorovodStrategy`` for the Lightning package ``pl`` (``lightning.pytorch`` or
    ``pytorch_lightning``)."""
    if pl.__name__ not in _CLASSES:
        _CLASSES[pl.__name__] = _build(pl)
    return _CLASSES[pl.__name__]


def _build(pl: ModuleType) -> type:
    import torch

    import horovod.torch as hvd

    class HorovodStrategy(pl.strategies.SingleDeviceStrategy):
        """Lightning's CPU strategy on Horovod's ranks (see the module docstring)."""

        strategy_name = "horovod"

        def __init__(self, compression: Any = None, backward_passes_per_step: int = 1) -> None:
            super().__init__(device=torch.device("cpu"))
            self.global_rank = hvd.rank()
            self.local_rank = hvd.local_rank()
            self.world_size = hvd.size()
            self.compression = compression or hvd.Compression.none
            self.backward_passes_per_step = backward_passes_per_step

        @property
        def is_global_zero(self) -> bool:
            return self.global_rank == 0

        def setup_optimizers(self, trainer: Any) -> None:
            super().setup_optimizers(trainer)
            module = self.lightning_module
            hvd.broadcast_parameters(module.state_dict(), root_rank=0)
            wrapped = []
            for optimizer in self.optimizers:
                hvd.broadcast_optimizer_state(optimizer, root_rank=0)
                distributed = hvd.DistributedOptimizer(
                    optimizer, named_parameters=_named_parameters(module, optimizer),
                    compression=self.compression, backward_passes_per_step=self.backward_passes_per_step)
                for config in self.lr_scheduler_configs:
                    if getattr(config.scheduler, "optimizer", None) is optimizer:
                        config.scheduler.optimizer = distributed
                        if not hasattr(distributed.step, "_wrapped_by_lr_sched"):
                            _track_step(distributed)
                wrapped.append(distributed)
            self.optimizers = wrapped

        def post_backward(self, closure_loss: Any) -> None:
            for optimizer in self.optimizers:
                optimizer.synchronize()

        def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
            inner = getattr(optimizer, "optimizer", optimizer)  # Lightning passes its LightningOptimizer
            context = (inner.skip_synchronize() if hasattr(inner, "skip_synchronize")
                       else contextlib.nullcontext())
            with context:
                return super().optimizer_step(optimizer, closure, model, **kwargs)

        def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
            if not isinstance(tensor, torch.Tensor):
                return tensor
            op = str(reduce_op).lower() if reduce_op is not None else "mean"
            if op.endswith("sum"):
                return hvd.allreduce(tensor, op=hvd.Sum)
            if op.endswith("max"):
                return hvd.allreduce(tensor, op=hvd.Max)
            if op.endswith("min"):
                return hvd.allreduce(tensor, op=hvd.Min)
            return hvd.allreduce(tensor.float() if not tensor.is_floating_point() else tensor, op=hvd.Average)

        def all_gather(self, tensor: Any, group: Any = None, sync_grads: bool = False) -> Any:
            return hvd.allgather(tensor.unsqueeze(0))  # (world_size, *tensor.shape), as Lightning's

        def barrier(self, *args: Any, **kwargs: Any) -> None:
            hvd.barrier()

        def broadcast(self, obj: Any, src: int = 0) -> Any:
            return hvd.broadcast_object(obj, root_rank=src)

        def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
            votes = hvd.allreduce(torch.tensor(int(bool(decision))), op=hvd.Sum)
            return bool(votes == self.world_size) if all else bool(votes > 0)

    return HorovodStrategy
