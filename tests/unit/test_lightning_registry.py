"""``import horovod.lightning`` registers ``strategy="horovod"`` in every installed Lightning 2.x package, and a
Trainer built with that name at one rank gets Horovod's ranks, devices and sampler settings."""
from __future__ import annotations

import importlib
import importlib.util

import pytest

pytest.importorskip("lightning", reason="horovod.lightning needs Lightning 2.x (pip install lightning)")
torch = pytest.importorskip("torch")

PACKAGES = [name for name in ("lightning.pytorch", "pytorch_lightning") if importlib.util.find_spec(name)]


@pytest.mark.parametrize("name", PACKAGES)
def test_importing_horovod_lightning_registers_strategy_horovod(name):
    import horovod.lightning

    pl = importlib.import_module(name)
    entry = pl.strategies.StrategyRegistry["horovod"]
    cls = horovod.lightning.strategy_class(pl)
    assert entry["strategy"] is cls and entry["init_params"] == {}
    assert issubclass(cls, pl.strategies.ParallelStrategy) and cls.strategy_name == "horovod"
    assert horovod.lightning.register(pl) is cls and pl.strategies.StrategyRegistry["horovod"] is entry, \
        "registering again changes nothing"


def test_the_public_class_is_lightning_pytorchs():
    import lightning.pytorch

    import horovod.lightning

    assert horovod.lightning.HorovodStrategy is horovod.lightning.strategy_class(lightning.pytorch)


@pytest.fixture
def one_rank(monkeypatch):
    """horovod.torch at one rank in this process (started by the strategy), shut down afterwards, the
    'horovod' logger and Lightning's rank-zero rank restored."""
    import logging

    from lightning_utilities.core.rank_zero import rank_zero_only

    import horovod.torch as hvd

    for name in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    logger = logging.getLogger("horovod")
    saved = (list(logger.handlers), logger.level, logger.propagate, rank_zero_only.rank)
    yield hvd
    if hvd.is_initialized():
        hvd.shutdown()
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]
    rank_zero_only.rank = saved[3]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", PACKAGES)
def test_a_trainer_with_strategy_horovod_runs_on_horovods_ranks(one_rank, name):
    import horovod.lightning

    pl = importlib.import_module(name)
    trainer = pl.Trainer(strategy="horovod", accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    strategy = trainer.strategy
    assert type(strategy) is horovod.lightning.strategy_class(pl) and one_rank.is_initialized()
    assert (trainer.global_rank, trainer.world_size, trainer.is_global_zero) == (0, 1, True)
    assert strategy.root_device == torch.device("cpu")
    assert trainer.distributed_sampler_kwargs == {"num_replicas": 1, "rank": 0}
    assert trainer._accelerator_connector.is_distributed, "Lightning adds the sampler and honours sync_dist"
    strategy.parallel_devices = [torch.device("cuda", 0)]
    assert strategy.root_device == torch.device("cuda", one_rank.local_rank()), "a GPU per rank, by local rank"


def test_learning_rates_scale_as_lightning_1_did():
    from types import SimpleNamespace

    from horovod.lightning.strategy import _scale_learning_rates

    net = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    _scale_learning_rates(optimizer, [SimpleNamespace(scheduler=scheduler)], 4)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.4)
    assert optimizer.param_groups[0]["initial_lr"] == pytest.approx(0.4)
    assert scheduler.base_lrs == [pytest.approx(0.4)]
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2)


def test_reduce_ops_map_onto_horovods():
    from torch.distributed import ReduceOp

    import horovod.torch as hvd
    from horovod.lightning.strategy import _reduce_op

    assert [_reduce_op(hvd, op) for op in (None, "mean", "avg", "sum", ReduceOp.SUM, "max", ReduceOp.MIN)] == [
        hvd.Average, hvd.Average, hvd.Average, hvd.Sum, hvd.Sum, hvd.Max, hvd.Min]
    with pytest.raises(ValueError, match=r"unsupported reduce_op .*PRODUCT.* 'mean' \(or 'avg'\), 'sum'"):
        _reduce_op(hvd, ReduceOp.PRODUCT)
