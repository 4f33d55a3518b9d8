"""The estimators' Spark ML params, without Spark: upstream's names, defaults and accessors, keyword-only
constructors, and the checks that stop a fit before it starts."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from horovod.spark.common.backend import Backend, SparkBackend
from horovod.spark.common.data import check_columns
from horovod.spark.common.params import ESTIMATOR_PARAMS
from horovod.spark.common.serialization import dumps, loads
from horovod.spark.keras import KerasEstimator, KerasModel
from horovod.spark.torch import TorchEstimator, TorchModel

UPSTREAM_DEFAULTS = {
    "batch_size": 32, "epochs": 1, "verbose": 1, "shuffle": True, "partitions_per_process": 10,
    "validation": None, "backward_passes_per_step": 1, "train_reader_num_workers": 2,
    "val_reader_num_workers": 2, "reader_pool_type": "thread", "inmemory_cache_all": False, "use_gpu": True,
    "compress_sparse_cols": False, "metrics": [], "callbacks": [], "num_proc": None, "store": None,
}


@pytest.mark.parametrize("cls", [TorchEstimator, KerasEstimator])
def test_upstreams_params_and_defaults(cls):
    estimator = cls()
    names = {param.name for param in estimator.params}
    assert {name for name, *_ in ESTIMATOR_PARAMS} <= names
    for name, default in UPSTREAM_DEFAULTS.items():
        assert estimator.getOrDefault(name) == default, name
    assert estimator.getBatchSize() == 32 and estimator.getShufflingBufferSize() is None
    assert estimator.getTrainReaderNumWorker() == 2


def test_constructor_and_setters_set_params():
    model = torch.nn.Linear(4, 2)
    estimator = TorchEstimator(num_proc=3, model=model, feature_cols=["f"], label_cols=["y"], batch_size=8,
                               validation=0.25, input_shapes=[[-1, 4]])
    assert (estimator.getNumProc(), estimator.getModel(), estimator.getBatchSize()) == (3, model, 8)
    assert (estimator.getValidation(), estimator.getInputShapes()) == (0.25, [[-1, 4]])
    assert estimator.setEpochs(4).setRandomSeed(7) is estimator
    assert (estimator.getEpochs(), estimator.getRandomSeed()) == (4, 7)
    assert TorchEstimator().getMetrics() is not TorchEstimator().getMetrics(), "no shared mutable defaults"
    with pytest.raises(TypeError, match="forces keyword arguments"):
        TorchEstimator(3)


def _torch_estimator(**overrides):
    model = torch.nn.Linear(4, 2)
    params = dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loss=torch.nn.MSELoss(),
                  feature_cols=["f"], label_cols=["y"])
    params.update(overrides)
    return TorchEstimator(**params)


@pytest.mark.parametrize("overrides,message", [
    ({"model": None}, r"has no model: pass model="),
    ({"feature_cols": None}, r"has no feature_cols"),
    ({"label_cols": []}, r"has no label_cols"),
    ({"loss": None}, r"has no loss"),
    ({"batch_size": 0}, r"batch_size must be a positive integer"),
    ({"validation": 1.0}, r"validation must be a fraction in \[0, 1\)"),
    ({"validation": 3}, r"validation must be a float fraction or a column name"),
    ({"optimizer": "sgd"}, r"optimizer must be a torch.optim.Optimizer"),
    ({"model": "net"}, r"model must be a torch.nn.Module"),
    ({"input_shapes": [[-1, 4], [-1, 2]]}, r"input_shapes has 2 shape\(s\) but feature_cols names 1"),
])
def test_bad_params_are_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        _torch_estimator(**overrides)._check_params()


def test_transformation_fn_needs_pandas_and_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # as where pandas is not installed
    with pytest.raises(ValueError, match=r"as a pandas DataFrame .* pip install pandas"):
        _torch_estimator(transformation_fn=lambda frame: frame)._check_params()


def test_loss_constructors_stand_in_for_loss():
    _torch_estimator(loss=None, loss_constructors=[torch.nn.MSELoss])._check_params()


def test_store_and_backend_are_checked():
    estimator = _torch_estimator()
    with pytest.raises(ValueError, match=r"has no store: pass store=Store.create"):
        estimator._check_store()
    estimator.setStore("/tmp/somewhere")
    with pytest.raises(ValueError, match=r"store must be a horovod.spark.common.store.Store, not str"):
        estimator._check_store()
    estimator.setNumProc(2).setBackend(SparkBackend(num_proc=3))
    with pytest.raises(ValueError, match=r"num_proc=2 and the backend's 3 processes disagree"):
        estimator._get_or_create_backend()
    assert isinstance(_torch_estimator(num_proc=2)._get_or_create_backend(), SparkBackend)
    with pytest.raises(NotImplementedError):
        Backend().run(print)


def test_models_name_their_outputs_like_upstream():
    assert TorchModel(label_columns=["y", "z"]).getOutputCols() == ["y__output", "z__output"]
    assert KerasModel(label_columns=["y"], output_cols=["p"]).getOutputCols() == ["p"]
    assert TorchModel(history=[{"epoch": 0}]).getHistory() == [{"epoch": 0}]


def test_param_values_survive_the_persistence_codec():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    back = loads(dumps({"model": model, "optimizer": optimizer}))
    shared = {id(p) for p in back["model"].parameters()}
    assert {id(p) for group in back["optimizer"].param_groups for p in group["params"]} == shared


def test_a_missing_column_is_named_with_the_frames_columns():
    frame = SimpleNamespace(columns=["label", *[f"pixel{i}" for i in range(64)]])
    with pytest.raises(ValueError, match=r"named in feature_cols \['features'\]; label_cols \['y'\]; its columns "
                                         r"are \[label, pixel0, .*, pixel18, \.\.\. \(45 more\)\]\. Fix"):
        check_columns(frame, ["features", "pixel3"], ["y"])
    check_columns(frame, ["pixel3"], ["label"])
