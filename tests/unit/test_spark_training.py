"""Pieces of TorchEstimator's training step that need no ranks: weighting the loss by a sample-weight column."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from horovod.spark.torch.remote import _loss


def test_sample_weights_weight_each_rows_loss():
    spec = SimpleNamespace(losses=[torch.nn.MSELoss(reduction="none")], loss_weights=None)
    output, label = torch.tensor([[1.0], [3.0]]), torch.tensor([[0.0], [0.0]])
    assert float(_loss(spec, [output], [label], None).mean()) == pytest.approx(5.0)
    assert float(_loss(spec, [output], [label], torch.tensor([1.0, 0.0]))) == pytest.approx(0.5)
    assert float(_loss(spec, [output], [label], torch.tensor([0.0, 2.0]))) == pytest.approx(9.0)


def test_weights_with_a_reduced_loss_say_what_to_change():
    spec = SimpleNamespace(losses=[torch.nn.MSELoss()], loss_weights=None)
    with pytest.raises(ValueError, match=r"sample_weight_col needs a loss that returns one value per row"):
        _loss(spec, [torch.ones(2, 1)], [torch.zeros(2, 1)], torch.ones(2))


def test_loss_weights_combine_several_outputs():
    spec = SimpleNamespace(losses=[torch.nn.L1Loss(), torch.nn.MSELoss()], loss_weights=[0.5, 2.0])
    outputs, labels = [torch.full((2,), 2.0), torch.full((2,), 3.0)], [torch.zeros(2), torch.zeros(2)]
    assert float(_loss(spec, outputs, labels, None)) == pytest.approx(0.5 * 2.0 + 2.0 * 9.0)
