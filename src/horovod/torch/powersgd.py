"""PowerSGD gradient compression for torch's ``DistributedOptimizer`` (ours; DDP's ``powerSGD_hook``).

``hvd.Compression.powersgd(matrix_approximation_rank=R, ...)`` returns a ``PowerSGDCompressor``
(horovod/common/compression.py), which only carries the settings (DDP's ``PowerSGDState`` names and
defaults). The optimizer makes a :class:`PowerSGDState` from it, which holds the per-parameter state and runs
the algorithm of Vogels et al. (2019) as DDP does:

- Every gradient is viewed as a matrix ``M`` (n x m, ``grad.view(shape[0], -1)``: convolution kernels become
  out-channels x the rest). It is compressed when ``(n + m) * r * min_compression_rate < n * m`` with
  ``r = min(n, m, R)``; the others (biases, small layers) keep the optimizer's normal fused allreduce.
- For the first ``start_powerSGD_iter`` steps every gradient is allreduced plainly. After that, the hooks of
  compressed parameters start nothing; ``synchronize()`` runs, for all of them together: ``M += error``
  (error feedback), ``P = M Q``, one grouped allreduce (Sum) of every ``P``, Gram-Schmidt on each ``P``,
  ``Q = M^T P``, one grouped allreduce of every ``Q`` (the optimizer's op and scale factors: Average gives the
  mean), and ``M ~ P Q^T`` written into ``p.grad``; ``error = M - P Q^T`` stays on this rank for the next step.
- ``Q`` starts as standard-normal float32 values from a ``torch.Generator`` seeded with
  ``crc32(f"{random_seed}.{name}.{step}")`` (cast to the gradient's dtype, then orthogonalised), so every rank
  draws the same ``Q`` without a broadcast. With ``warm_start`` the averaged ``Q`` of the step before is reused
  (orthogonalised again); without it a new one is drawn every step.

The state (step count, every ``Q``, this rank's error feedback) is part of the optimizer's ``state_dict()``;
``broadcast_optimizer_state`` sends the step count and the ``Q``s from the root and leaves each rank its own error
feedback (a rank that has none starts from zeros). See docs/compression.md.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from horovod.common.compression import PowerSGDCompressor
from horovod.common.types import ReduceOp, Sum
from horovod.core.process_sets import ProcessSet

# The handle of a gradient whose exchange waits for synchronize()'s PowerSGD rounds.
DEFERRED = object()


def orthogonalize_(matrix: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
    """Make the columns of ``matrix`` (n x r, r <= n) orthonormal in place, by DDP's (modified) Gram-Schmidt.

    With ``epsilon`` 0 a column that is all zeros stays zero (DDP's intent: its division would give NaN);
    otherwise each column is divided by its norm plus ``epsilon``. Returns ``matrix``.
    """
    for i in range(matrix.shape[1]):
        col = matrix[:, i:i + 1]
        norm = torch.linalg.vector_norm(col)
        if epsilon == 0:
            col.mul_(torch.where(norm > 0, 1.0 / norm, torch.zeros_like(norm)))
        else:
            col.div_(norm + epsilon)
        if i + 1 < matrix.shape[1]:
            rest = matrix[:, i + 1:]
            rest.sub_(col * torch.sum(col * rest, dim=0, keepdim=True))
    return matrix


@dataclasses.dataclass
class _Work:
    """One compressed gradient in flight during a step. P and Q are held transposed (r x n, r x m, contiguous):
    ``Q^T M^T`` and ``P^T M`` are wide products, which CPU BLAS runs 5 to 40 times faster than the tall ``M Q``
    and ``M^T P`` at r = 2 to 8 (measured on the reference VM)."""

    name: str
    grad: torch.Tensor          # the dense gradient the approximation is written into
    matrix: torch.Tensor        # its n x m view (or copy), with the error feedback added
    qt: torch.Tensor            # Q^T, r x m
    pt: torch.Tensor            # P^T, r x n


class PowerSGDState:
    """One optimizer's PowerSGD state: the step count, and per compressed parameter (by name) the warm-start
    ``Q`` and this rank's error feedback. The three phases of a step (:meth:`compress`, :meth:`project`,
    :meth:`decompress`) are separate so that one process can run several ranks' states in lockstep (the unit
    tests do); :meth:`reduce` runs them with the two grouped allreduces between."""

    def __init__(self, settings: PowerSGDCompressor, named_parameters: Sequence[Tuple[str, torch.Tensor]]) -> None:
        self.settings = settings
        self.step = 0
        self.q: Dict[str, torch.Tensor] = {}                    # name -> Q^T (r x m, contiguous)
        self.error: Dict[str, torch.Tensor] = {}
        self.names: Dict[torch.Tensor, str] = {}
        self.shapes: Dict[str, Tuple[int, int, int]] = {}       # name -> (n, m, r)
        for name, p in named_parameters:
            r = settings.approximation_rank(p.shape)
            if r:
                self.names[p] = name
                self.shapes[name] = (int(p.shape[0]), p.numel() // int(p.shape[0]), r)
        digest = zlib.crc32("\n".join(sorted(self.shapes)).encode()) & 0xFFFFFFFF
        self.tag = f"powersgd.{len(self.shapes)}.{digest:08x}"
        self._work: List[_Work] = []

    # ------------------------------------------------------------------ the optimizer's questions
    def defers(self, p: torch.Tensor, sparse_as_dense: bool) -> bool:
        """True when ``p``'s gradient goes through this step's PowerSGD rounds (its allreduce is not started
        now). A sparse gradient is refused unless ``sparse_as_dense`` (then its dense form is compressed)."""
        if p.grad is not None and p.grad.is_sparse and not sparse_as_dense and p in self.names:
            raise ValueError(f"Compression.powersgd compresses dense matrices, but parameter "
                             f"{self.names[p]!r} has a sparse gradient. Pass sparse_as_dense=True to "
                             "DistributedOptimizer (its dense form is then compressed), make the layer dense "
                             "(nn.Embedding(..., sparse=False)), or use Compression.none or fp16.")
        return self.step >= self.settings.start_powerSGD_iter and p in self.names

    def ungrouped(self, groups: Optional[List[List[torch.Tensor]]]) -> Optional[List[List[torch.Tensor]]]:
        """``groups`` without the parameters PowerSGD compresses (their exchange is PowerSGD's own group)."""
        if groups is None:
            return None
        kept = [[p for p in group if p not in self.names] for group in groups]
        return [group for group in kept if group] or None

    # ------------------------------------------------------------------ one step, in three phases
    def compress(self, named_grads: Sequence[Tuple[str, torch.Tensor]]) -> List[torch.Tensor]:
        """Start a step on dense gradients (name, grad): add the error feedback, prepare ``Q``; the ``P = M Q``
        to sum across ranks, in the order given."""
        s = self.settings
        self._work = []
        for name, grad in named_grads:
            n, m, r = self.shapes[name]
            matrix = grad.reshape(n, m)
            if s.use_error_feedback:
                error = self.error.get(name)
                if error is not None:
                    matrix.add_(error)
            qt = self.q.get(name) if s.warm_start else None
            if qt is None:
                seed = zlib.crc32(f"{s.random_seed}.{name}.{self.step}".encode())
                generator = torch.Generator().manual_seed(seed)
                qt = torch.randn(m, r, generator=generator, dtype=torch.float32).to(grad).t().contiguous()
            orthogonalize_(qt.t(), s.orthogonalization_epsilon)
            self._work.append(_Work(name, grad, matrix, qt, torch.mm(qt, matrix.t())))
        return [w.pt for w in self._work]

    def project(self) -> List[torch.Tensor]:
        """After the ``P``s were summed: orthogonalise each, and the ``Q = M^T P`` to reduce across ranks (both
        transposed, see :class:`_Work`)."""
        for w in self._work:
            orthogonalize_(w.pt.t(), self.settings.orthogonalization_epsilon)
            torch.mm(w.pt, w.matrix, out=w.qt)
        return [w.qt for w in self._work]

    def decompress(self) -> None:
        """After the ``Q``s were reduced: write ``P Q^T`` into each gradient, keep the error and ``Q``. The
        approximation is written into the gradient's own memory and the error into last step's buffer: no
        gradient-sized allocation per step (one costs as much as the products here)."""
        s = self.settings
        for w in self._work:
            error = None
            if s.use_error_feedback:
                error = self.error.get(w.name)
                if error is None:
                    error = self.error[w.name] = torch.empty_like(w.matrix, memory_format=torch.contiguous_format)
                error.copy_(w.matrix)
            torch.mm(w.pt.t(), w.qt, out=w.matrix)                  # M ~ P Q^T
            if error is not None:
                error.sub_(w.matrix)                                # error = M - P Q^T
            if not (w.grad.is_contiguous() and w.matrix.data_ptr() == w.grad.data_ptr()):
                w.grad.copy_(w.matrix.reshape(w.grad.shape))        # reshape had to copy the gradient
            if s.warm_start:
                self.q[w.name] = w.qt
        self._work = []

    def reduce(self, params: Sequence[torch.Tensor], op: ReduceOp, prescale: float, postscale: float,
               process_set: ProcessSet) -> None:
        """One PowerSGD step for ``params`` (the deferred ones, the same on every rank; none before
        ``start_powerSGD_iter``): their approximated reduced gradients end up in ``p.grad``. Counts the step."""
        from horovod.torch.mpi_ops import grouped_allreduce_

        if params:
            ordered = sorted(params, key=lambda p: self.names[p])
            grads = [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in ordered]
            ps = self.compress([(self.names[p], g) for p, g in zip(ordered, grads)])
            grouped_allreduce_(ps, name=f"{self.tag}.p", op=Sum, process_set=process_set)
            qs = self.project()
            grouped_allreduce_(qs, name=f"{self.tag}.q", op=op, prescale_factor=prescale, postscale_factor=postscale,
                               process_set=process_set)
            self.decompress()
            for p, grad in zip(ordered, grads):
                if p.grad.is_sparse:
                    p.grad = grad.to_sparse(p.grad.sparse_dim())
        self.step += 1

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The step count and, by parameter name, every ``Q`` (m x r) and this rank's error feedback (n x m):
        the tensors themselves (``Q`` as a view), as torch's ``Optimizer.state_dict`` gives its own."""
        return {"step": self.step, "q": {name: qt.t() for name, qt in self.q.items()}, "error": dict(self.error)}

    def load_state_dict(self, state: Optional[dict]) -> None:
        """Restore :meth:`state_dict`'s output (copies of it); None (a state saved without PowerSGD) starts
        afresh at step 0."""
        state = state or {"step": 0, "q": {}, "error": {}}
        loaded = {}
        for key, columns in (("q", 1), ("error", 0)):
            loaded[key] = {}
            for name, tensor in state[key].items():
                if name not in self.shapes:
                    raise ValueError(f"the PowerSGD state holds {key!r} for parameter {name!r}, which this "
                                     "optimizer does not compress: load a state saved with the same model, "
                                     "named_parameters and matrix_approximation_rank")
                n, m, r = self.shapes[name]
                expected = (m, r) if columns else (n, m)
                if tuple(tensor.shape) != expected:
                    raise ValueError(f"the PowerSGD {key!r} of {name!r} has shape {tuple(tensor.shape)}, this "
                                     f"optimizer expects {expected}: load a state saved with the same model and "
                                     "matrix_approximation_rank")
                tensor = tensor.detach().t() if columns else tensor.detach()
                loaded[key][name] = tensor.clone(memory_format=torch.contiguous_format)
        self.step, self.q, self.error = int(state["step"]), loaded["q"], loaded["error"]
        self._work = []

    def broadcast(self, root_rank: int, process_set: ProcessSet) -> None:
        """Give every rank the root's step count and ``Q``s (each rank keeps its own error feedback)."""
        from horovod.torch.functions import broadcast_object, broadcast_parameters

        step, names = broadcast_object((self.step, sorted(self.q)), root_rank, name=f"{self.tag}.sync",
                                       process_set=process_set)
        params = {name: p for p, name in self.names.items()}
        q = {}
        for name in names:
            n, m, r = self.shapes[name]
            q[name] = self.q.get(name)
            if q[name] is None:
                q[name] = torch.zeros(r, m, dtype=params[name].dtype, device=params[name].device)
        broadcast_parameters([(f"{self.tag}.q.{name}", q[name]) for name in names], root_rank,
                             process_set=process_set)
        self.step, self.q = step, q


def state_for(compression: object, named_parameters: Sequence[Tuple[str, torch.Tensor]]) -> Optional[PowerSGDState]:
    """A fresh :class:`PowerSGDState` when ``compression`` is PowerSGD, else None."""
    if isinstance(compression, PowerSGDCompressor):
        return PowerSGDState(compression, named_parameters)
    return None
