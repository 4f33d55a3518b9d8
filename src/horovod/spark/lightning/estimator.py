"""``TorchEstimator`` -> ``TorchModel``: a Lightning module trained on a Spark DataFrame (upstream's
``horovod.spark.lightning.estimator``).

    from horovod.spark.common.store import Store
    from horovod.spark.lightning import TorchEstimator

    estimator = TorchEstimator(num_proc=2, store=Store.create("/tmp/hvd"), model=LitNet(),
                               feature_cols=["features"], label_cols=["label"], input_shapes=[[-1, 1, 8, 8]],
                               batch_size=32, epochs=5, validation=0.2)
    lightning_model = estimator.fit(df)                 # a TorchModel
    predictions = lightning_model.transform(df)         # adds "label__output"

The module's own ``configure_optimizers``, ``training_step`` and ``validation_step`` define the training; each
rank runs a Lightning ``Trainer`` on Horovod (``remote.py``, ``strategy.py``).
"""
from __future__ import annotations

import copy
from typing import Any

from pyspark import keyword_only

from horovod.spark.common.estimator import HorovodEstimator, TrainingJob
from horovod.spark.common.params import _declare, init_params
from horovod.spark.common.serialization import HorovodParamsReadable, HorovodParamsWritable
from horovod.spark.lightning.remote import LightningTrainSpec, lightning_package, train
from horovod.spark.torch.estimator import TorchModel as _TorchModel
from horovod.spark.torch.estimator import check_input_shapes

LIGHTNING_ESTIMATOR_PARAMS = [
    ("input_shapes", None, "the shape of each feature column's batches, batch dimension (-1) first", None),
    ("loss_constructors", None, "accepted for upstream compatibility: the module's training_step computes "
     "the loss", None),
    ("train_minibatch_fn", None, "accepted for upstream compatibility: the module's training_step trains",
     None),
    ("transformation_edit_fields", None, "accepted for upstream compatibility (petastorm)", None),
    ("transformation_removed_fields", None, "accepted for upstream compatibility (petastorm)", None),
    ("num_gpus", None, "accepted for upstream compatibility; training runs on the CPU", None),
    ("logger", None, "a Lightning logger for the Trainer of every rank (default: none)", None),
    ("log_every_n_steps", 50, "the Trainer's log_every_n_steps", None),
    ("data_module", None, "upstream's petastorm DataModule class; not supported (the data is read from the "
     "store's Parquet files)", None),
    ("loader_num_epochs", None, "accepted for upstream compatibility (petastorm reader epochs)", None),
    ("terminate_on_nan", False, "stop with an error on a NaN or infinite loss (the Trainer's detect_anomaly)",
     None),
    ("profiler", None, "the Trainer's profiler", None),
    ("debug_data_loader", False, "accepted for upstream compatibility", None),
    ("train_async_data_loader_queue_size", None, "accepted for upstream compatibility", None),
    ("val_async_data_loader_queue_size", None, "accepted for upstream compatibility", None),
    ("trainer_args", None, "extra keyword arguments of every rank's lightning Trainer", None),
]


class TorchEstimator(HorovodEstimator, HorovodParamsWritable, HorovodParamsReadable):
    """Spark ML Estimator that trains a ``LightningModule`` data-parallel with Horovod; ``fit`` ->
    TorchModel."""

    RUN_ID_PREFIX = "lightning"
    REQUIRES_LOSS = False

    @keyword_only
    def __init__(self, num_proc=None, model=None, backend=None, store=None, optimizer=None, loss=None,
                 loss_constructors=None, metrics=None, loss_weights=None, sample_weight_col=None,
                 gradient_compression=None, feature_cols=None, continuous_cols=None, categorical_cols=None,
                 input_shapes=None, validation=None, label_cols=None, callbacks=None, batch_size=None,
                 val_batch_size=None, epochs=None, verbose=1, random_seed=None, shuffle_buffer_size=None,
                 partitions_per_process=None, run_id=None, train_minibatch_fn=None,
                 train_steps_per_epoch=None, validation_steps_per_epoch=None, transformation_fn=None,
                 transformation_edit_fields=None, transformation_removed_fields=None,
                 train_reader_num_workers=None, trainer_reader_pool_type=None, val_reader_num_workers=None,
                 reader_pool_type=None, label_shapes=None, inmemory_cache_all=False, num_gpus=None,
                 logger=None, log_every_n_steps=50, data_module=None, loader_num_epochs=None,
                 terminate_on_nan=False, profiler=None, debug_data_loader=False,
                 train_async_data_loader_queue_size=None, val_async_data_loader_queue_size=None, use_gpu=True,
                 mp_start_method=None, trainer_args=None, shuffle=None,
                 backward_passes_per_step=None) -> None:
        super().__init__()
        # trainer_reader_pool_type: upstream's misspelt twin of reader_pool_type, accepted and ignored
        init_params(self, LIGHTNING_ESTIMATOR_PARAMS, ignored=("trainer_reader_pool_type",))

    def setParams(self, **kwargs: Any) -> TorchEstimator:
        """Set several params at once (upstream's ``setParams``)."""
        return self._set(**kwargs)

    def _check_params(self, metadata: Any = None) -> None:
        super()._check_params(metadata)
        check_lightning_module(self.getModel())
        if self.getDataModule() is not None:
            raise ValueError("data_module is not supported: the estimator feeds the module batches read from "
                             "the store's Parquet files (dicts of tensors by column); drop data_module")
        check_input_shapes(self.getInputShapes(), self.getFeatureCols())

    def _train_spec(self, job: TrainingJob) -> LightningTrainSpec:
        return LightningTrainSpec(
            model=self.getModel(), input_shapes=self.getInputShapes(), logger=self.getLogger(),
            log_every_n_steps=self.getLogEveryNSteps(), profiler=self.getProfiler(),
            terminate_on_nan=bool(self.getTerminateOnNan()), trainer_args=dict(self.getTrainerArgs() or {}),
            **self._data_spec_kwargs(job))

    def _fit_on_prepared_data(self, job: TrainingJob) -> TorchModel:
        result = job.backend.run(train, args=(self._train_spec(job),))[0]
        model = copy.deepcopy(self.getModel())
        model.load_state_dict(result["state_dict"])
        return TorchModel(history=result["history"], model=model, feature_columns=self.getFeatureCols(),
                          label_columns=self.getLabelCols(), input_shapes=self.getInputShapes(),
                          run_id=job.run_id, _metadata=job.dataset.metadata)


def check_lightning_module(model: Any) -> None:
    """Raise ValueError unless ``model`` is a LightningModule that defines what training needs."""
    pl = lightning_package(model)
    needs = {"training_step": "training_step(self, batch, batch_idx) returning the loss (a batch is a dict "
                              "of tensors by column name, e.g. batch['features'], batch['label'])",
             "configure_optimizers": "configure_optimizers(self) returning its optimizer(s), e.g. "
                                     "torch.optim.SGD(self.parameters(), lr=0.1)"}
    for name, how in needs.items():
        if getattr(type(model), name, None) is getattr(pl.LightningModule, name):
            raise ValueError(f"the LightningModule {type(model).__name__} has no {name}: the estimator "
                             "trains with the module's own training_step and configure_optimizers; "
                             f"define {how}")


class TorchModel(_TorchModel):
    """Spark ML Model holding a trained ``LightningModule``; ``transform`` adds the predictions of its
    ``forward`` (as horovod.spark.torch's TorchModel)."""


_declare(TorchEstimator, LIGHTNING_ESTIMATOR_PARAMS)
