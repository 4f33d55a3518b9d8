"""``KerasEstimator`` -> ``KerasModel``: Keras 3 training on a Spark DataFrame (upstream's
``horovod.spark.keras.estimator``).

    from horovod.spark.common.store import Store
    from horovod.spark.keras import KerasEstimator

    estimator = KerasEstimator(num_proc=2, store=Store.create("/tmp/hvd"), model=keras_model,
                               optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy",
                               metrics=["accuracy"], feature_cols=["features"], label_cols=["label"],
                               batch_size=32, epochs=5, validation=0.2)
    keras_model = estimator.fit(df)                    # a KerasModel; getHistory() is Keras' History.history
    predictions = keras_model.transform(df)            # adds "label__output"
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import numpy as np
from pyspark import keyword_only

from horovod.spark.common.estimator import HorovodEstimator, HorovodModel, TrainingJob
from horovod.spark.common.params import _declare, init_params
from horovod.spark.common.serialization import Codecs, HorovodParamsReadable, HorovodParamsWritable
from horovod.spark.keras.remote import KerasTrainSpec, model_from_bytes, model_to_bytes, train

KERAS_ESTIMATOR_PARAMS = [
    ("custom_objects", {}, "custom layers, losses and metrics the model needs to be loaded (name -> object)",
     None),
    ("checkpoint_callback", None,
     "accepted for upstream compatibility: rank 0 always checkpoints to the store", None),
]

KERAS_MODEL_PARAMS = [
    ("custom_objects", {}, "custom layers, losses and metrics the model needs to be loaded (name -> object)",
     None),
    ("_floatx", None, "Keras' floatx when the model was trained", "Floatx"),
]


def _model_codecs() -> Codecs:
    def decode(data: bytes, params: Dict[str, Any]) -> Any:
        return model_from_bytes(data, params.get("custom_objects"))

    return {"model": (model_to_bytes, decode)}


def _optimizer_config(optimizer: Any) -> Any:
    import keras

    return optimizer if isinstance(optimizer, str) else keras.optimizers.serialize(optimizer)


class KerasEstimator(HorovodEstimator, HorovodParamsWritable, HorovodParamsReadable):
    """Spark ML Estimator that trains a Keras 3 model data-parallel with Horovod; ``fit`` -> KerasModel."""

    RUN_ID_PREFIX = "keras"

    @keyword_only
    def __init__(self, num_proc=None, model=None, backend=None, store=None, custom_objects=None,
                 optimizer=None, loss=None, loss_weights=None, sample_weight_col=None,
                 gradient_compression=None, metrics=None, feature_cols=None, label_cols=None,
                 continuous_cols=None, categorical_cols=None,
                 validation=None, callbacks=None, batch_size=None, val_batch_size=None, epochs=None,
                 verbose=1,
                 random_seed=None, shuffle_buffer_size=None, partitions_per_process=None, run_id=None,
                 train_steps_per_epoch=None, validation_steps_per_epoch=None, transformation_fn=None,
                 train_reader_num_workers=None, val_reader_num_workers=None, reader_pool_type=None,
                 label_shapes=None, checkpoint_callback=None, inmemory_cache_all=False, use_gpu=True,
                 mp_start_method=None, backward_passes_per_step=1, shuffle=None,
                 compress_sparse_cols=None) -> None:
        super().__init__()
        init_params(self, KERAS_ESTIMATOR_PARAMS)

    def setParams(self, **kwargs: Any) -> KerasEstimator:
        """Set several params at once (upstream's ``setParams``)."""
        return self._set(**kwargs)

    def _param_codecs(self) -> Codecs:
        return _model_codecs()

    def _check_params(self, metadata: Any = None) -> None:
        import keras

        super()._check_params(metadata)
        if not isinstance(self.getModel(), keras.Model):
            raise ValueError(f"model must be a keras.Model, not {type(self.getModel()).__name__}")
        if self.getOptimizer() is None:
            raise ValueError("the estimator has no optimizer: pass optimizer=keras.optimizers.SGD(...) or a "
                             "name")

    def _train_spec(self, job: TrainingJob) -> KerasTrainSpec:
        return KerasTrainSpec(
            model_bytes=model_to_bytes(self.getModel()), optimizer=_optimizer_config(self.getOptimizer()),
            loss=self.getLoss(), loss_weights=self.getLossWeights(), metrics=list(self.getMetrics() or []),
            custom_objects=dict(self.getCustomObjects() or {}), **self._data_spec_kwargs(job))

    def _fit_on_prepared_data(self, job: TrainingJob) -> KerasModel:
        import keras

        spec = self._train_spec(job)
        result = job.backend.run(train, args=(spec,))[0]
        model = model_from_bytes(spec.model_bytes, spec.custom_objects)
        model.set_weights(result["weights"])
        return KerasModel(history=result["history"], model=model, feature_columns=self.getFeatureCols(),
                          label_columns=self.getLabelCols(), custom_objects=spec.custom_objects,
                          run_id=job.run_id, _metadata=job.dataset.metadata, _floatx=keras.backend.floatx())


class KerasModel(HorovodModel, HorovodParamsWritable, HorovodParamsReadable):
    """Spark ML Model holding a trained Keras model; ``transform`` adds its predictions."""

    @keyword_only
    def __init__(self, history=None, model=None, feature_columns=None, label_columns=None,
                 custom_objects=None, run_id=None, _metadata=None, _floatx=None, output_cols=None) -> None:
        super().__init__()
        init_params(self, KERAS_MODEL_PARAMS)

    def setParams(self, **kwargs: Any) -> KerasModel:
        return self._set(**kwargs)

    def _param_codecs(self) -> Codecs:
        return _model_codecs()

    def _make_predict_fn(self) -> Callable[[Dict[str, np.ndarray]], List[np.ndarray]]:
        from horovod.spark.keras.remote import _model_inputs

        model_bytes, custom_objects = model_to_bytes(self.getModel()), dict(self.getCustomObjects() or {})
        cols = list(self.getFeatureColumns())
        loaded: List[Any] = []  # the model, loaded once per Python worker that runs this function

        def predict(features: Dict[str, np.ndarray]) -> List[np.ndarray]:
            if not loaded:
                loaded.append(model_from_bytes(model_bytes, custom_objects))
            model = loaded[0]
            outputs = model.predict_on_batch(_model_inputs(model, features, cols))
            outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
            return [np.asarray(output) for output in outputs]

        return predict


_declare(KerasEstimator, KERAS_ESTIMATOR_PARAMS)
_declare(KerasModel, KERAS_MODEL_PARAMS)
