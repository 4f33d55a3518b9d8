"""``HorovodStrategy``: a Lightning 2.x ``Strategy`` that runs an unchanged ``Trainer`` data-parallel on Horovod.

Lightning 2 removed its ``strategy="horovod"``; this is that strategy again, with Lightning 1.x's behaviour for
its users. Each process is one Horovod rank (started by ``horovodrun``), so Lightning launches nothing:

- the rank, local rank and size are Horovod's (``hvd.init()`` runs when the strategy is built, if the program
  has not run it already), and Lightning's rank-zero-only output is rank 0's;
- the root device is the CPU, or ``cuda:<local rank>`` when the Trainer runs on GPUs (an explicit list of
  ``devices`` is indexed by the local rank, as Lightning 1.x did);
- the distributed sampler Lightning puts into the dataloaders shards by ``num_replicas=hvd.size()``,
  ``rank=hvd.rank()``;
- once ``configure_optimizers`` has built the optimizers, their learning rates (and their schedulers' base
  rates) are scaled by ``hvd.size()`` as Lightning 1.x did (``scale_lr=False`` keeps them), the module's
  parameters and buffers and each optimizer's state are broadcast from rank 0, and every optimizer is wrapped in
  ``hvd.DistributedOptimizer`` (named by the module's parameters);
- ``reduce`` (``self.log(..., sync_dist=True)``), ``all_gather``, ``broadcast``, ``barrier`` and
  ``reduce_boolean_decision`` (early stopping, checkpointing) go through Horovod's collectives.

Lightning steps an optimizer with a closure that runs the forward and backward pass inside ``optimizer.step``,
so, as Lightning 1.x's strategy did, the gradients are synchronized after each backward pass
(``post_backward``) and the step itself runs under ``skip_synchronize``.

A module is trained by the Trainer of the package it subclasses, so there is one class per Lightning package:
``strategy_class(pl)`` builds (once) the one for ``lightning.pytorch`` or ``pytorch_lightning``.
"""
from __future__ import annotations

import contextlib
import functools
from types import ModuleType
from typing import Any, Dict, List, Optional

_CLASSES: Dict[str, type] = {}
# Lightning's reduce ops (strings, or torch.distributed.ReduceOp, whose str() is "RedOpType.SUM") by Horovod's
# name for them.
_REDUCE_OPS = {"mean": "Average", "avg": "Average", "sum": "Sum", "max": "Max", "min": "Min"}


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


def _scale_learning_rates(optimizer: Any, scheduler_configs: List[Any], factor: float) -> None:
    """Lightning 1.x's learning-rate scaling: each group's rate (and the ``initial_lr`` a scheduler recorded),
    and the base rates of the optimizer's schedulers, times ``factor``."""
    for group in optimizer.param_groups:
        for key in ("lr", "initial_lr"):
            if key in group:
                group[key] *= factor
    for config in scheduler_configs:
        scheduler = config.scheduler
        if getattr(scheduler, "optimizer", None) is optimizer and hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]


def _reduce_op(hvd: ModuleType, reduce_op: Any) -> Any:
    name = "mean" if reduce_op is None else str(reduce_op).lower().rsplit(".", 1)[-1]
    if name not in _REDUCE_OPS:
        raise ValueError(f"HorovodStrategy.reduce: unsupported reduce_op {reduce_op!r}; Horovod reduces with "
                         "'mean' (or 'avg'), 'sum', 'max' or 'min'")
    return getattr(hvd, _REDUCE_OPS[name])


def _process_set(hvd: ModuleType, group: Any, what: str) -> Any:
    """Lightning's ``group`` as a Horovod process set: None is every rank; a ``hvd.ProcessSet`` is itself."""
    if group is None:
        return hvd.global_process_set
    if isinstance(group, hvd.ProcessSet):
        return group
    raise ValueError(f"HorovodStrategy.{what}: group must be None (every rank) or a horovod.torch.ProcessSet, "
                     f"not {group!r}")


def strategy_class(pl: ModuleType) -> type:
    """``HorovodStrategy`` for the Lightning package ``pl`` (``lightning.pytorch`` or ``pytorch_lightning``)."""
    if pl.__name__ not in _CLASSES:
        _CLASSES[pl.__name__] = _build(pl)
    return _CLASSES[pl.__name__]


def _build(pl: ModuleType) -> type:
    import torch

    import horovod.torch as hvd

    class HorovodStrategy(pl.strategies.ParallelStrategy):
        """Lightning data-parallel training on Horovod's ranks (see the module docstring).

        ``compression``: ``hvd.Compression`` for the gradients (none by default). ``backward_passes_per_step``:
        ``hvd.DistributedOptimizer``'s. ``scale_lr``: multiply the optimizers' learning rates by ``hvd.size()``
        (Lightning 1.x's behaviour, the default).
        """

        strategy_name = "horovod"

        def __init__(self, accelerator: Any = None, parallel_devices: Optional[List[torch.device]] = None,
                     checkpoint_io: Any = None, precision_plugin: Any = None, *, compression: Any = None,
                     backward_passes_per_step: int = 1, scale_lr: bool = True) -> None:
            if not hvd.is_initialized():
                hvd.init()
            super().__init__(accelerator=accelerator, parallel_devices=parallel_devices, cluster_environment=None,
                             checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
            self.compression = compression or hvd.Compression.none
            self.backward_passes_per_step = backward_passes_per_step
            self.scale_lr = scale_lr
            self.set_world_ranks()

        @classmethod
        def register_strategies(cls, strategy_registry: Any) -> None:
            strategy_registry.register(cls.strategy_name, cls, override=True,
                                       description="Data-parallel training on Horovod's ranks (horovodrun)")

        # -- who and where ---------------------------------------------------------------------------------
        @property
        def global_rank(self) -> int:
            return hvd.rank()

        @property
        def local_rank(self) -> int:
            return hvd.local_rank()

        @property
        def node_rank(self) -> int:
            return hvd.cross_rank()

        @property
        def world_size(self) -> int:
            return hvd.size()

        @property
        def is_distributed(self) -> bool:
            """Lightning's cue for the distributed sampler and for ``sync_dist``."""
            return True

        @property
        def root_device(self) -> torch.device:
            devices = self.parallel_devices or []
            if not devices or devices[0].type != "cuda":
                return torch.device("cpu")
            if len(devices) > self.local_rank:
                return devices[self.local_rank]
            return torch.device("cuda", self.local_rank)

        @property
        def distributed_sampler_kwargs(self) -> Dict[str, int]:
            return {"num_replicas": hvd.size(), "rank": hvd.rank()}

        def set_world_ranks(self) -> None:
            pl.utilities.rank_zero.rank_zero_only.rank = self.global_rank  # rank-zero-only output: rank 0's

        def model_to_device(self) -> None:
            if self.root_device.type == "cuda":
                torch.cuda.set_device(self.root_device)
            self.model.to(self.root_device)

        # -- training --------------------------------------------------------------------------------------
        def setup_optimizers(self, trainer: Any) -> None:
            super().setup_optimizers(trainer)
            module = self.lightning_module
            hvd.broadcast_parameters(module.state_dict(), root_rank=0)
            wrapped = []
            for optimizer in self.optimizers:
                if self.scale_lr:
                    _scale_learning_rates(optimizer, self.lr_scheduler_configs, hvd.size())
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
            inner = getattr(optimizer, "optimizer", optimizer)  # Lightning may pass its LightningOptimizer
            context = (inner.skip_synchronize() if hasattr(inner, "skip_synchronize")
                       else contextlib.nullcontext())
            with context:
                return super().optimizer_step(optimizer, closure, model, **kwargs)

        def teardown(self) -> None:
            trainer = getattr(self.lightning_module, "_trainer", None)
            if trainer is not None and not trainer.interrupted:
                hvd.barrier()  # every rank has finished before fit() returns, as Lightning 1.x's join did
            super().teardown()

        # -- collectives -----------------------------------------------------------------------------------
        def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
            if not isinstance(tensor, torch.Tensor):
                return tensor
            op = _reduce_op(hvd, reduce_op)
            if op == hvd.Average and not tensor.is_floating_point():
                tensor = tensor.float()
            return hvd.allreduce(tensor, op=op, process_set=_process_set(hvd, group, "reduce"))

        def all_gather(self, tensor: Any, group: Any = None, sync_grads: bool = False) -> Any:
            """``(world_size, *tensor.shape)``: every rank's tensor stacked, as Lightning 2's strategies
            return (Lightning 1.x's Horovod strategy concatenated them along dimension 0 instead)."""
            process_set = _process_set(hvd, group, "all_gather")
            with contextlib.nullcontext() if sync_grads else torch.no_grad():
                return hvd.allgather(tensor.unsqueeze(0), process_set=process_set)

        def barrier(self, name: Optional[str] = None) -> None:
            hvd.barrier()

        def broadcast(self, obj: Any, src: int = 0) -> Any:
            return hvd.broadcast_object(obj, root_rank=src)

        def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
            votes = hvd.allreduce(torch.tensor(int(bool(decision))), op=hvd.Sum)
            return bool(votes == self.world_size) if all else bool(votes > 0)

    return HorovodStrategy
