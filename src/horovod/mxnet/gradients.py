"""How ``DistributedOptimizer`` and ``DistributedTrainer`` reduce gradients: upstream's scaling rule and the
shared grouping and compression loop (``horovod.common.gradient_groups``)."""
from __future__ import annotations

from typing import List, Optional

import mxnet as mx

from horovod.common.gradient_groups import allreduce_in_groups, check_groups, check_predivide
from horovod.common.types import Average, ReduceOp, Sum
from horovod.core import ops
from horovod.core.process_sets import ProcessSet
from horovod.mxnet.mpi_ops import grouped_allreduce_


class GradientReducer:
    """Reduces lists of gradient NDArrays in place across ``process_set``.

    With ``op=Average`` (the default) it does what upstream does: the wire op is Sum with a prescale of
    ``1 / gradient_predivide_factor``, and the average's division is folded into the optimizer's ``rescale_grad``
    (``rescale`` is the factor to multiply it by: ``gradient_predivide_factor / size``), which is cheaper than a
    separate division. Any other op (Sum, Adasum, Min, Max, Product) is applied as it is, unscaled.
    ``num_groups`` > 0 splits the gradients into that many grouped allreduces; 0 sends them as one.
    """

    def __init__(self, op: ReduceOp, gradient_predivide_factor: float, num_groups: int, compression,
                 process_set: ProcessSet) -> None:
        op = ReduceOp(op)
        check_predivide(op, gradient_predivide_factor)
        self.size = ops.set_size(process_set)
        self.process_set = process_set
        self.compression = compression
        self.groups = check_groups(None, num_groups)
        self.op = Sum if op == Average else op
        self.prescale = 1.0 / gradient_predivide_factor if op == Average else 1.0
        # One rank reduces nothing (as upstream), so no predivide was applied either: upstream's rescale by
        # predivide / size would scale the gradients by the factor there.
        self.rescale = gradient_predivide_factor / self.size if op == Average and self.size > 1 else 1.0

    def _grouped(self, tensors: List[mx.nd.NDArray], name: str) -> List[mx.nd.NDArray]:
        return grouped_allreduce_(tensors, name=name, op=self.op, prescale_factor=self.prescale,
                                  process_set=self.process_set)

    def reduce(self, grads: List[mx.nd.NDArray], name: str, variables: Optional[list] = None) -> None:
        """Replace each of ``grads`` by its reduction (one rank: nothing to do, as upstream)."""
        if self.size == 1 or not grads:
            return
        out = list(grads)
        allreduce_in_groups(out, list(range(len(out))), variables, self.groups, self.compression, self._grouped,
                            name)
        for grad, reduced in zip(grads, out):
            if reduced is not grad:
                grad[:] = reduced
