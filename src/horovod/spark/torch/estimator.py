"""``TorchEstimator`` -> ``TorchModel``: PyTorch training on a Spark DataFrame (upstream's
``horovod.spark.torch.estimator``).

    from horovod.spark.common.store import Store
    from horovod.spark.torch import TorchEstimator

    model = Net()
    estimator = TorchEstimator(num_proc=2, store=Store.create("/tmp/hvd"), model=model,
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                               loss=lambda output, label: F.cross_entropy(output, label.long()),
                               feature_cols=["features"], label_cols=["label"], input_shapes=[[-1, 1, 8, 8]],
                               batch_size=32, epochs=5, validation=0.2)
    torch_model = estimator.fit(df)                    # a TorchModel
    predictions = torch_model.transform(df)            # adds "label__output"
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List

import numpy as np
from pyspark import keyword_only

from horovod.spark.common.estimator import HorovodEstimator, HorovodModel, TrainingJob
from horovod.spark.common.params import _declare, init_params
from horovod.spark.common.serialization import HorovodParamsReadable, HorovodParamsWritable
from horovod.spark.torch.remote import TorchTrainSpec, train

TORCH_ESTIMATOR_PARAMS = [
    ("input_shapes", None, "the shape of each feature column's batches, batch dimension (-1) first", None),
    ("loss_constructors", None, "functions that each return a loss function (instead of loss)", None),
    ("train_minibatch_fn", None, "a custom training step: fn(model, optimizer, transform_outputs, loss_fn, "
     "inputs, labels, sample_weights) -> (outputs, loss)", None),
    ("transformation_edit_fields", None, "accepted for upstream compatibility (petastorm)", None),
    ("transformation_removed_fields", None, "accepted for upstream compatibility (petastorm)", None),
]

TORCH_MODEL_PARAMS = [
    ("optimizer", None, "the optimizer, with the state training left it in", None),
    ("input_shapes", None, "the shape of each feature column's batches, batch dimension (-1) first", None),
]


def check_input_shapes(shapes: Any, feature_cols: List[str]) -> None:
    """Raise ValueError unless ``input_shapes`` (when given) has one shape per feature column."""
    if shapes is not None and len(shapes) != len(feature_cols):
        raise ValueError(f"input_shapes has {len(shapes)} shape(s) but feature_cols names "
                         f"{len(feature_cols)} column(s): give one shape per feature column")


class TorchEstimator(HorovodEstimator, HorovodParamsWritable, HorovodParamsReadable):
    """Spark ML Estimator that trains a ``torch.nn.Module`` data-parallel with Horovod; ``fit`` ->
    TorchModel."""

    RUN_ID_PREFIX = "torch"

    @keyword_only
    def __init__(self, num_proc=None, model=None, backend=None, store=None, optimizer=None, loss=None,
                 loss_constructors=None, metrics=None, loss_weights=None, sample_weight_col=None,
                 gradient_compression=None, feature_cols=None, input_shapes=None, validation=None,
                 label_cols=None, callbacks=None, batch_size=None, val_batch_size=None, epochs=None,
                 verbose=1,
                 random_seed=None, shuffle_buffer_size=None, partitions_per_process=None, run_id=None,
                 train_minibatch_fn=None, train_steps_per_epoch=None, validation_steps_per_epoch=None,
                 transformation_fn=None, transformation_edit_fields=None, transformation_removed_fields=None,
                 train_reader_num_workers=None, trainer_reader_pool_type=None, val_reader_num_workers=None,
                 reader_pool_type=None, label_shapes=None, inmemory_cache_all=False, use_gpu=True,
                 mp_start_method=None, backward_passes_per_step=1, shuffle=None, compress_sparse_cols=None,
                 continuous_cols=None, categorical_cols=None) -> None:
        super().__init__()
        # trainer_reader_pool_type: upstream's misspelt twin of reader_pool_type, accepted and ignored
        init_params(self, TORCH_ESTIMATOR_PARAMS, ignored=("trainer_reader_pool_type",))

    def setParams(self, **kwargs: Any) -> TorchEstimator:
        """Set several params at once (upstream's ``setParams``)."""
        return self._set(**kwargs)

    def _check_params(self, metadata: Any = None) -> None:
        import torch

        super()._check_params(metadata)
        if not isinstance(self.getModel(), torch.nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, not {type(self.getModel()).__name__}")
        if not isinstance(self.getOptimizer(), torch.optim.Optimizer):
            raise ValueError("optimizer must be a torch.optim.Optimizer built on the model's parameters, "
                             "e.g. torch.optim.SGD(model.parameters(), lr=0.1)")
        check_input_shapes(self.getInputShapes(), self.getFeatureCols())

    def _train_spec(self, job: TrainingJob) -> TorchTrainSpec:
        loss = self.getLoss()
        if loss is None:
            loss = [make() for make in self.getLossConstructors()]
        optimizer = self.getOptimizer()
        return TorchTrainSpec(
            model=self.getModel(), optimizer_cls=type(optimizer), optimizer_state=optimizer.state_dict(),
            losses=list(loss) if isinstance(loss, (list, tuple)) else [loss],
            loss_weights=self.getLossWeights(), metrics=list(self.getMetrics() or []),
            input_shapes=self.getInputShapes(), train_minibatch_fn=self.getTrainMinibatchFn(),
            **self._data_spec_kwargs(job))

    def _fit_on_prepared_data(self, job: TrainingJob) -> TorchModel:
        results = job.backend.run(train, args=(self._train_spec(job),))
        result = results[0]
        model = copy.deepcopy(self.getModel())
        model.load_state_dict(result["state_dict"])
        optimizer = type(self.getOptimizer())(model.parameters(), lr=1.0)
        optimizer.load_state_dict(result["optimizer_state"])
        return TorchModel(
            history=result["history"], model=model, optimizer=optimizer,
            feature_columns=self.getFeatureCols(),
            label_columns=self.getLabelCols(), input_shapes=self.getInputShapes(), run_id=job.run_id,
            _metadata=job.dataset.metadata)


class TorchModel(HorovodModel, HorovodParamsWritable, HorovodParamsReadable):
    """Spark ML Model holding a trained ``torch.nn.Module``; ``transform`` adds its predictions."""

    @keyword_only
    def __init__(self, history=None, model=None, feature_columns=None, input_shapes=None, label_columns=None,
                 optimizer=None, run_id=None, _metadata=None, loss=None, loss_constructors=None,
                 output_cols=None) -> None:
        super().__init__()
        init_params(self, TORCH_MODEL_PARAMS, ignored=("loss", "loss_constructors"))

    def setParams(self, **kwargs: Any) -> TorchModel:
        return self._set(**kwargs)

    def _make_predict_fn(self) -> Callable[[Dict[str, np.ndarray]], List[np.ndarray]]:
        model, shapes, cols = self.getModel(), self.getInputShapes(), list(self.getFeatureColumns())

        def predict(features: Dict[str, np.ndarray]) -> List[np.ndarray]:
            import torch

            model.eval()
            inputs = []
            for i, col in enumerate(cols):
                tensor = torch.from_numpy(np.ascontiguousarray(features[col], dtype=np.float32))
                inputs.append(tensor.reshape(list(shapes[i])) if shapes else tensor)
            with torch.no_grad():
                outputs = model(*inputs)
            outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
            return [output.detach().cpu().numpy() for output in outputs]

        return predict


_declare(TorchEstimator, TORCH_ESTIMATOR_PARAMS)
_declare(TorchModel, TORCH_MODEL_PARAMS)
