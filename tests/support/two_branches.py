"""A model whose second branch only rank 0 uses, for the optimizer bodies that check a parameter without a
gradient on some ranks (tests/parallel/test_torch_optimizer.py, test_torch_zero.py): the model, and the
single-process SGD step on the whole batch that a distributed step must equal."""
import torch
import torch.nn.functional as F
from torch import nn


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.a = nn.Linear(4, 2).double()
        self.b = nn.Linear(4, 2).double()

    def forward(self, x, use_b):
        return self.a(x) + (self.b(x) if use_b else 0)


def reference_sgd_step(x, y, size, per, lr=0.1):
    """A fresh TwoBranches after one SGD step on the mean of every rank's loss (rank ``r``'s rows
    ``r * per:(r + 1) * per``; only rank 0 uses branch b)."""
    ref = TwoBranches()
    loss = sum(F.mse_loss(ref(x[r * per:(r + 1) * per], use_b=(r == 0)), y[r * per:(r + 1) * per])
               for r in range(size)) / size
    loss.backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= lr * p.grad
    return ref
