"""``DistributedOptimizer`` (an ``mx.optimizer.Optimizer`` that allreduces in ``update``) and
``DistributedTrainer`` (a Gluon ``Trainer`` that allreduces in ``_allreduce_grads``), as upstream's."""
from __future__ import annotations

import collections
import warnings
from typing import Optional

import mxnet as mx

from horovod.common.types import Average, ReduceOp
from horovod.core.process_sets import ProcessSet, global_process_set
from horovod.mxnet.compression import Compression
from horovod.mxnet.gradients import GradientReducer


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps ``optimizer`` so that every ``update`` first averages the gradients across ranks.

    Upstream's arguments, plus ``compression`` and ``op`` (ours, as torch's ``DistributedOptimizer`` has them).
    Every attribute not defined here is the wrapped optimizer's; ``rescale_grad`` too, also when a Gluon
    ``Trainer`` sets it.
    """

    def __init__(self, optimizer: mx.optimizer.Optimizer, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, process_set: ProcessSet = global_process_set,
                 compression=Compression.none, op: ReduceOp = Average) -> None:
        self._optimizer = optimizer
        self._reducer = GradientReducer(op, gradient_predivide_factor, num_groups, compression, process_set)
        self._optimizer.rescale_grad *= self._reducer.rescale

    def __getattr__(self, item):
        if item == "_optimizer":            # not set yet (unpickling): never recurse
            raise AttributeError(item)
        return getattr(self._optimizer, item)

    @property
    def rescale_grad(self) -> float:
        return self._optimizer.rescale_grad

    @rescale_grad.setter
    def rescale_grad(self, value: float) -> None:
        self._optimizer.rescale_grad = value

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _do_allreduce(self, index, grad) -> None:
        if isinstance(index, (tuple, list)):
            self._reducer.reduce(list(grad), f"DistributedOptimizer.{index[0]}:{index[-1]}")
        else:
            self._reducer.reduce([grad], f"DistributedOptimizer.{index}")

    def update(self, index, weight, grad, state) -> None:
        self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state) -> None:
        self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult) -> None:
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult) -> None:
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """A Gluon ``Trainer`` that averages the gradients across ranks in ``step()`` / ``allreduce_grads()``.

    Upstream's arguments, plus ``op`` (ours). It runs without an MXNet kvstore. As upstream, the average's
    division by the number of ranks is folded into the optimizer's rescale factor.
    """

    def __init__(self, params, optimizer, optimizer_params: Optional[dict] = None, compression=Compression.none,
                 gradient_predivide_factor: float = 1.0, prefix: Optional[str] = None, num_groups: int = 0,
                 process_set: ProcessSet = global_process_set, op: ReduceOp = Average) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its optimizer. We have "
                          "unwrapped it for you.", stacklevel=2)
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError(f"prefix must be a str or None, got {type(prefix).__name__}")
        if isinstance(params, dict):      # one order on every rank, as MXNet's distributed kvstore has it
            params = collections.OrderedDict(sorted(params.items()))
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._reducer = GradientReducer(op, gradient_predivide_factor, num_groups, compression, process_set)
        self._scale *= self._reducer.rescale
        self._prefix = prefix or ""

    def _allreduce_grads(self) -> None:
        grads = [param.list_grad()[0] for param in self._params if param.grad_req != "null"]
        self._reducer.reduce(grads, f"{self._prefix}DistributedTrainer")
