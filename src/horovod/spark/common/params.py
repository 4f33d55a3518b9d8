"""The Spark ML params of the estimators and their models (upstream's ``horovod.spark.common.params``).

Each param is a ``pyspark.ml.param.Param`` named as upstream's, with upstream's default, and a ``setX`` /
``getX`` pair named as upstream's (``setNumProc`` / ``getNumProc``, ``setFeatureCols`` / ``getFeatureCols``,
...). The tables below declare them once; :func:`_declare` turns a table into class attributes and accessors.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from pyspark.ml.param import Param, Params

# (name, default, doc, accessor suffix or None for the CamelCase of the name)
ParamSpec = Tuple[str, Any, str, Any]

ESTIMATOR_PARAMS: List[ParamSpec] = [
    ("num_proc", None, "number of Horovod processes (default: the backend's, spark.default.parallelism)",
     None),
    ("model", None, "the model to train", None),
    ("backend", None, "the Backend that runs training (default: SparkBackend(num_proc))", None),
    ("store", None, "the Store for intermediate data, checkpoints and logs", None),
    ("metrics", [], "metrics to compute during training and validation", None),
    ("loss", None, "the loss function", None),
    ("gradient_compression", None, "Horovod gradient compression (hvd.Compression.none or .fp16)", None),
    ("compress_sparse_cols", False, "accepted for upstream compatibility; sparse vectors are densified",
     None),
    ("optimizer", None, "the optimizer (wrapped in hvd.DistributedOptimizer on every rank)", None),
    ("feature_cols", None, "the DataFrame columns fed to the model, in order", None),
    ("continuous_cols", None, "accepted for upstream compatibility (TabNet-style models); not used", None),
    ("categorical_cols", None, "accepted for upstream compatibility (TabNet-style models); not used", None),
    ("label_cols", None, "the DataFrame columns the model predicts, in order", None),
    ("validation", None, "a float fraction of rows, or the name of a column that is true for validation rows",
     None),
    ("callbacks", [], "framework callbacks run during training", None),
    ("batch_size", 32, "the batch size of each rank", None),
    ("val_batch_size", None, "the validation batch size of each rank (default: batch_size)", None),
    ("epochs", 1, "the number of epochs", None),
    ("train_steps_per_epoch", None, "training steps per epoch (default: training rows / batch_size / ranks)",
     None),
    ("validation_steps_per_epoch", None,
     "validation steps per epoch (default: validation rows / val_batch_size / ranks)", None),
    ("verbose", 1, "verbosity of rank 0's training output (0 silent, 1 and 2 per epoch)", None),
    ("shuffle_buffer_size", None, "accepted for upstream compatibility; every epoch shuffles the whole shard",
     "ShufflingBufferSize"),
    ("shuffle", True, "shuffle each rank's rows every epoch", None),
    ("random_seed", None, "the seed of the model initialisation and the shuffling", None),
    ("partitions_per_process", 10, "Parquet files written per training process", None),
    ("run_id", None, "the id of this run under the store's runs path (default: a fresh one)", None),
    ("transformation_fn", None,
     "a function of a pandas DataFrame applied to each rank's rows before training", None),
    ("train_reader_num_workers", 2, "accepted for upstream compatibility (petastorm reader threads)",
     "TrainReaderNumWorker"),
    ("val_reader_num_workers", 2, "accepted for upstream compatibility (petastorm reader threads)",
     "ValReaderNumWorker"),
    ("reader_pool_type", "thread", "accepted for upstream compatibility (petastorm reader pool)", None),
    ("inmemory_cache_all", False, "accepted for upstream compatibility: each rank always holds its shard in "
     "memory", None),
    ("use_gpu", True, "train on a GPU where the rank has one", None),
    ("mp_start_method", None, "accepted for upstream compatibility (petastorm's multiprocessing)", None),
    ("backward_passes_per_step", 1, "local gradient accumulations per allreduce", None),
    ("loss_weights", None, "weights of the losses of several label columns", None),
    ("sample_weight_col", None, "a column of per-row loss weights", None),
    ("label_shapes", None, "the shape of each label column's values (default: as read)", None),
]

MODEL_PARAMS: List[ParamSpec] = [
    ("history", None, "the training history", None),
    ("model", None, "the trained model", None),
    ("feature_columns", None, "the feature columns the model reads", None),
    ("label_columns", None, "the label columns the model was trained on", None),
    ("output_cols", None, "the prediction columns transform() adds (default: label + '__output')", None),
    ("run_id", None, "the run id of the training", None),
    ("_metadata", None, "the column metadata of the training data", "Metadata"),
]


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def _declare(cls: type, specs: Sequence[ParamSpec]) -> type:
    """Give ``cls`` a Param attribute and ``setX`` / ``getX`` accessors per spec (upstream's names)."""
    for name, _default, doc, suffix in specs:
        setattr(cls, name, Param(Params._dummy(), name, doc))
        suffix = suffix or _camel(name)

        def setter(self, value, _name=name):
            return self._set(**{_name: value})

        def getter(self, _name=name):
            return self.getOrDefault(getattr(self, _name))

        setter.__name__, getter.__name__ = f"set{suffix}", f"get{suffix}"
        setter.__doc__ = getter.__doc__ = doc
        if not hasattr(cls, f"set{suffix}"):
            setattr(cls, f"set{suffix}", setter)
        if not hasattr(cls, f"get{suffix}"):
            setattr(cls, f"get{suffix}", getter)
    return cls


def defaults(specs: Sequence[ParamSpec]) -> Dict[str, Any]:
    """The default of every param in ``specs`` (fresh lists, so instances never share a mutable default)."""
    return {name: (list(default) if isinstance(default, list) else default) for name, default, _, _ in specs}


def init_params(stage: Params, specs: Sequence[ParamSpec], ignored: Sequence[str] = ()) -> None:
    """Give a ``@keyword_only`` constructor's stage the defaults of ``specs`` and the keyword arguments it was
    called with, but those that are None or ``ignored``."""
    stage._setDefault(**defaults(specs))
    stage._set(**{name: value for name, value in stage._input_kwargs.items()
                  if value is not None and name not in ignored})


class EstimatorParams(Params):
    """The params every Horovod estimator has (upstream's ``EstimatorParams``)."""

    # False where the model defines its own loss (a LightningModule's training_step)
    REQUIRES_LOSS = True

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(**defaults(ESTIMATOR_PARAMS))

    def _check_params(self, metadata: Any = None) -> None:
        """Raise ValueError, naming the param and what to do, when the params cannot train a model."""
        if self.getModel() is None:
            raise ValueError("the estimator has no model: pass model=... (the network to train)")
        if not self.getFeatureCols():
            raise ValueError("the estimator has no feature_cols: pass the DataFrame columns the model reads")
        if not self.getLabelCols():
            raise ValueError("the estimator has no label_cols: pass the DataFrame columns the model predicts")
        constructors = self.getOrDefault("loss_constructors") if self.hasParam("loss_constructors") else None
        if self.REQUIRES_LOSS and self.getLoss() is None and not constructors:
            raise ValueError("the estimator has no loss: pass loss=... (a loss function)")
        if self.getBatchSize() is None or self.getBatchSize() < 1:
            raise ValueError(f"batch_size must be a positive integer, not {self.getBatchSize()!r}")
        if self.getEpochs() is None or self.getEpochs() < 1:
            raise ValueError(f"epochs must be a positive integer, not {self.getEpochs()!r}")
        if self.getTransformationFn() is not None:
            from horovod.spark.common.reader import TRANSFORMATION_NEEDS_PANDAS, pandas_available

            if not pandas_available():
                raise ValueError(TRANSFORMATION_NEEDS_PANDAS)
        validation = self.getValidation()
        if isinstance(validation, float) and not 0.0 <= validation < 1.0:
            raise ValueError(f"validation must be a fraction in [0, 1) or a column name, not {validation!r}")
        if validation is not None and not isinstance(validation, (float, str)):
            raise ValueError(f"validation must be a float fraction or a column name, not {validation!r}")


class ModelParams(Params):
    """The params every model returned by a Horovod estimator has (upstream's ``ModelParams``)."""

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(**defaults(MODEL_PARAMS))

    def getOutputCols(self) -> List[str]:
        """The prediction columns: as set, or each label column + ``__output`` (upstream's default)."""
        cols = self.getOrDefault(self.output_cols)
        return list(cols) if cols else [f"{col}__output" for col in self.getLabelColumns()]


_declare(EstimatorParams, ESTIMATOR_PARAMS)
_declare(ModelParams, MODEL_PARAMS)
