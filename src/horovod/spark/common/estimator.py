"""The Spark ML Estimator and Model that the framework estimators share (upstream's ``common/estimator.py``).

``HorovodEstimator.fit(df)`` checks the params and the DataFrame's columns (before anything runs), writes the
data to the store as Parquet (``data.prepare_data``), and hands the framework subclass a ``TrainingJob``: the
backend, the store, the run id and the prepared data. The subclass runs its training function on the backend's
ranks and builds its Model from rank 0's result.

``HorovodModel.transform(df)`` adds one prediction column per output column, computed in the Spark tasks in
batches by the function the framework subclass gives (``_make_predict_fn``).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Sequence

import numpy as np
from pyspark.ml import Estimator, Model

from horovod.spark.common.backend import Backend, SparkBackend
from horovod.spark.common.data import DatasetInfo, check_columns, prepare_data
from horovod.spark.common.params import EstimatorParams, ModelParams
from horovod.spark.common.store import Store

PREDICT_BATCH_ROWS = 256


@dataclass
class TrainingJob:
    """Everything a framework's fit needs once the data is in the store."""

    backend: Backend
    store: Store
    run_id: str
    dataset: DatasetInfo


class HorovodEstimator(Estimator, EstimatorParams):
    """Base of TorchEstimator and KerasEstimator: params, validation, the data path and the backend."""

    RUN_ID_PREFIX = "horovod"

    def fit_on_parquet(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("fit_on_parquet is not available here: fit on a DataFrame (fit(df))")

    def _get_or_create_backend(self) -> Backend:
        backend = self.getBackend()
        if backend is None:
            return SparkBackend(self.getNumProc())
        if self.getNumProc() is not None and self.getNumProc() != backend.num_processes():
            raise ValueError(f"num_proc={self.getNumProc()} and the backend's {backend.num_processes()} "
                             "processes disagree: give one of them only")
        return backend

    def _check_store(self) -> Store:
        store = self.getStore()
        if store is None:
            raise ValueError("the estimator has no store: pass store=Store.create('/shared/path') (a path or "
                             "URL every Spark executor and training process can reach)")
        if not isinstance(store, Store):
            raise ValueError(f"store must be a horovod.spark.common.store.Store, not {type(store).__name__}; "
                             "make one with Store.create(path)")
        return store

    def _fit(self, df) -> Model:
        self._check_params()
        store = self._check_store()
        validation = self.getValidation()
        check_columns(df, self.getFeatureCols(), self.getLabelCols(), self.getSampleWeightCol(), validation)
        backend = self._get_or_create_backend()
        run_id = self.getRunId() or (f"{self.RUN_ID_PREFIX}_{time.strftime('%Y%m%d_%H%M%S')}_"
                                     f"{uuid.uuid4().hex[:8]}")
        dataset = prepare_data(store, df, self.getFeatureCols(), self.getLabelCols(), idx=run_id,
                               num_processes=backend.num_processes(), validation=validation,
                               sample_weight_col=self.getSampleWeightCol(),
                               partitions_per_process=self.getPartitionsPerProcess(),
                               seed=self.getRandomSeed())
        return self._fit_on_prepared_data(TrainingJob(backend, store, run_id, dataset))

    def _fit_on_prepared_data(self, job: TrainingJob) -> Model:
        raise NotImplementedError()

    def _data_spec_kwargs(self, job: TrainingJob) -> Dict[str, Any]:
        """The fields every framework's training spec shares: the columns, the prepared data, the epochs and
        batches, and the training params every estimator has."""
        return dict(
            feature_cols=list(self.getFeatureCols()), label_cols=list(self.getLabelCols()),
            sample_weight_col=self.getSampleWeightCol(), label_shapes=self.getLabelShapes(), store=job.store,
            run_id=job.run_id, dataset_idx=job.dataset.idx, train_rows=job.dataset.train_rows,
            val_rows=job.dataset.val_rows, batch_size=self.getBatchSize(),
            val_batch_size=self.getValBatchSize() or self.getBatchSize(), epochs=self.getEpochs(),
            train_steps_per_epoch=self.getTrainStepsPerEpoch(),
            validation_steps_per_epoch=self.getValidationStepsPerEpoch(), shuffle=self.getShuffle(),
            random_seed=self.getRandomSeed(), compression=self.getGradientCompression(),
            backward_passes_per_step=self.getBackwardPassesPerStep() or 1,
            transformation_fn=self.getTransformationFn(), callbacks=list(self.getCallbacks() or []),
            verbose=self.getVerbose())


class HorovodModel(Model, ModelParams):
    """Base of TorchModel and KerasModel: ``transform`` adds the prediction columns."""

    def getHistory(self) -> Any:
        return self.getOrDefault(self.history)

    def _make_predict_fn(self) -> Callable[[Dict[str, np.ndarray]], List[np.ndarray]]:
        """A picklable function: a batch of feature arrays by column -> one output array per output column."""
        raise NotImplementedError()

    def _transform(self, df):
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import SparkSession
        from pyspark.sql.types import DoubleType, StructField, StructType

        feature_cols, output_cols = list(self.getFeatureColumns()), self.getOutputCols()
        check_columns(df, feature_cols, [])
        predict = self._make_predict_fn()
        sample = df.select(*feature_cols).limit(1).collect()
        if not sample:
            raise ValueError("transform() needs a DataFrame with at least one row")
        outputs = predict(_features([sample[0].asDict()], feature_cols))
        if len(outputs) != len(output_cols):
            raise ValueError(f"the model returns {len(outputs)} output(s) but output_cols names "
                             f"{len(output_cols)}: {output_cols}; set output_cols to one column per model "
                             "output")
        vector = [int(np.prod(out.shape[1:])) != 1 for out in outputs]
        fields = [StructField(col, VectorUDT() if is_vector else DoubleType(), True)
                  for col, is_vector in zip(output_cols, vector)]
        schema = StructType(df.schema.fields + fields)
        rdd = df.rdd.mapPartitions(_predict_partition_fn(predict, feature_cols, vector))
        return SparkSession.active().createDataFrame(rdd, schema)


def _features(rows: Sequence[dict], feature_cols: Sequence[str]) -> Dict[str, np.ndarray]:
    """Feature arrays by column from rows (vectors and lists stacked into 2-d arrays)."""
    out = {}
    for col in feature_cols:
        values = [row[col] for row in rows]
        values = [v.toArray() if hasattr(v, "toArray") else v for v in values]
        out[col] = np.stack([np.asarray(v) for v in values])
    return out


def _predict_partition_fn(predict: Callable, feature_cols: Sequence[str], vector: Sequence[bool]) -> Callable:
    def predict_partition(rows: Iterator) -> Iterator[tuple]:
        from pyspark.ml.linalg import DenseVector

        def emit(chunk: list) -> Iterator[tuple]:
            outputs = predict(_features([row.asDict() for row in chunk], feature_cols))
            for i, row in enumerate(chunk):
                values = [DenseVector(np.asarray(out[i], dtype=np.float64).ravel()) if is_vector
                          else float(np.asarray(out[i]).ravel()[0])
                          for out, is_vector in zip(outputs, vector)]
                yield tuple(row) + tuple(values)

        chunk: list = []
        for row in rows:
            chunk.append(row)
            if len(chunk) == PREDICT_BATCH_ROWS:
                yield from emit(chunk)
                chunk = []
        if chunk:
            yield from emit(chunk)

    return predict_partition
