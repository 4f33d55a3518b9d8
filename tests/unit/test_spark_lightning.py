"""The Lightning estimator's pieces that need no ranks: its params, the module checks, and how the history
files the losses and logged metrics."""
from __future__ import annotations

import lightning
import pytest
import torch

from horovod.spark.common.serialization import dumps, loads
from horovod.spark.lightning import TorchEstimator, TorchModel
from horovod.spark.lightning.estimator import check_lightning_module
from horovod.spark.lightning.remote import average_over_ranks, split_metrics, step_loss
from horovod.spark.lightning.strategy import _named_parameters
from horovod.spark.torch import TorchModel as PlainTorchModel


class Complete(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 2)
        self.frozen = torch.nn.Linear(2, 2)

    def training_step(self, batch, batch_idx):
        return self.net(batch["x"]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.1)


class NoOptimizers(lightning.LightningModule):
    def training_step(self, batch, batch_idx):
        return torch.tensor(0.0)


def test_upstreams_lightning_params_and_defaults():
    estimator = TorchEstimator(model=Complete(), feature_cols=["x"], label_cols=["y"], trainer_args={"a": 1})
    assert (estimator.getBatchSize(), estimator.getEpochs(), estimator.getLogEveryNSteps(),
            estimator.getTerminateOnNan(), estimator.getLoss(), estimator.getTrainerArgs()) == (
        32, 1, 50, False, None, {"a": 1})
    estimator._check_params()  # no loss param needed: the module's training_step computes it
    assert issubclass(TorchModel, PlainTorchModel)
    assert loads(dumps(estimator.getModel())).net.weight.shape == (2, 4)


def test_a_module_must_define_its_training_hooks():
    check_lightning_module(Complete())
    with pytest.raises(ValueError, match=r"NoOptimizers has no configure_optimizers: .* define "
                                         r"configure_optimizers\(self\)"):
        check_lightning_module(NoOptimizers())
    with pytest.raises(ValueError, match=r"model must be a lightning.LightningModule"):
        check_lightning_module(torch.nn.Linear(2, 2))
    estimator = TorchEstimator(model=Complete(), feature_cols=["x"], label_cols=["y"], data_module=object)
    with pytest.raises(ValueError, match=r"data_module is not supported"):
        estimator._check_params()
    estimator = TorchEstimator(model=Complete(), feature_cols=["x"], label_cols=["y"],
                               input_shapes=[[-1], [-1]])
    with pytest.raises(ValueError, match=r"input_shapes has 2 shape\(s\) but feature_cols names 1"):
        estimator._check_params()


def test_logged_metrics_are_filed_as_training_or_validation():
    logged = {"train_acc": 1.0, "val_acc": 0.5, "val/loss": 0.2, "Validation_f1": 0.1, "lr": 0.3}
    assert split_metrics(logged) == {"train": {"train_acc": 1.0, "lr": 0.3},
                                     "validation": {"val_acc": 0.5, "val/loss": 0.2, "Validation_f1": 0.1}}


def test_metrics_average_over_the_ranks_that_have_them():
    assert average_over_ranks([{"a": 1.0, "b": 4.0}, {"a": 3.0}]) == {"a": 2.0, "b": 4.0}


def test_step_loss_reads_what_a_step_returns():
    assert step_loss(torch.tensor(2.5)) == 2.5
    assert step_loss({"loss": torch.tensor(1.5), "other": 3}) == 1.5
    assert step_loss(None) is None and step_loss({"acc": torch.tensor(1.0)}) is None
    assert step_loss(torch.ones(3)) is None


def test_distributed_optimizer_names_only_the_optimizers_parameters():
    module = Complete()
    names = [name for name, _ in _named_parameters(module, module.configure_optimizers())]
    assert names == ["net.weight", "net.bias"]


@pytest.fixture
def hvd(monkeypatch):
    """horovod.torch at one rank in this process, shut down afterwards, the 'horovod' logger restored."""
    import logging

    import horovod.torch as hvd

    for name in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    logger = logging.getLogger("horovod")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    hvd.init()
    yield hvd
    hvd.shutdown()
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


class Scheduled(Complete):
    def validation_step(self, batch, batch_idx):
        self.log("val_seen", 1.0, sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


@pytest.mark.timeout(60)
def test_a_trainer_runs_on_the_horovod_strategy(hvd):
    from horovod.spark.lightning.strategy import strategy_class

    strategy = strategy_class(lightning.pytorch)()
    batches = [{"x": torch.randn(4, 4)} for _ in range(3)]
    trainer = lightning.Trainer(max_epochs=2, accelerator="cpu", devices=1, strategy=strategy, logger=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                enable_checkpointing=False, num_sanity_val_steps=0)
    module = Scheduled()
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None),
                val_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))

    optimizer = trainer.optimizers[0]
    assert hasattr(optimizer, "synchronize") and isinstance(optimizer, torch.optim.SGD), \
        "the module's optimizer wrapped in hvd.DistributedOptimizer"
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.optimizer is optimizer and optimizer.param_groups[0]["lr"] == pytest.approx(0.025)
    assert float(trainer.callback_metrics["val_seen"]) == 1.0
    assert (trainer.global_rank, trainer.world_size, trainer.is_global_zero) == (0, 1, True)
    assert float(strategy.reduce(torch.tensor(3.0), reduce_op="sum")) == 3.0
    assert float(strategy.reduce(torch.tensor(2), reduce_op="mean")) == 2.0
    assert strategy.all_gather(torch.tensor([1.0, 2.0])).shape == (1, 2)
    assert strategy.broadcast({"a": 1}) == {"a": 1}
    assert strategy.reduce_boolean_decision(True) and not strategy.reduce_boolean_decision(False, all=False)
