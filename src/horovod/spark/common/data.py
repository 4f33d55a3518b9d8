"""The driver's side of the data path: check the columns, split off validation rows, write Parquet to the
store.

The DataFrame's feature, label and sample-weight columns are written as Parquet under the store's
``intermediate_train_data.<idx>`` (and ``intermediate_val_data.<idx>``), ``num_proc * partitions_per_process``
files each, so that every rank reads a similar share of whole files (see ``reader.py``). Vector columns
(``pyspark.ml.linalg`` dense or sparse vectors) are written as arrays of doubles; arrays and numbers as they
are.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

log = logging.getLogger(__name__)
MAX_COLUMNS_SHOWN = 20


@dataclass
class DatasetInfo:
    """What the ranks need to know about the prepared data: where it is, its row counts and column
    metadata."""

    idx: str
    train_rows: int
    val_rows: int
    metadata: Dict[str, Dict[str, Any]]


def check_columns(df, feature_cols: Sequence[str], label_cols: Sequence[str],
                  sample_weight_col: Optional[str] = None,
                  validation: Union[None, float, str] = None) -> None:
    """ValueError naming every param whose column is not in ``df`` (raised before any training starts)."""
    present = set(df.columns)
    shown = ", ".join(df.columns[:MAX_COLUMNS_SHOWN]) + (
        f", ... ({len(df.columns) - MAX_COLUMNS_SHOWN} more)" if len(df.columns) > MAX_COLUMNS_SHOWN else "")
    wanted = [("feature_cols", list(feature_cols)), ("label_cols", list(label_cols))]
    if sample_weight_col:
        wanted.append(("sample_weight_col", [sample_weight_col]))
    if isinstance(validation, str):
        wanted.append(("validation", [validation]))
    problems = [f"{param} {missing}" for param, cols in wanted
                if (missing := [col for col in cols if col not in present])]
    if problems:
        raise ValueError(f"the DataFrame has no column(s) named in {'; '.join(problems)}; its columns are "
                         f"[{shown}]. Fix the estimator's params or add the columns to the DataFrame")


def column_metadata(df, cols: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Per column: its kind (``vector``, ``array`` or ``scalar``) and Spark type, as the estimator saw
    them."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType

    metadata = {}
    for col in cols:
        dtype = df.schema[col].dataType
        kind = ("vector" if isinstance(dtype, VectorUDT) else "array" if isinstance(dtype, ArrayType)
                else "scalar")
        metadata[col] = {"kind": kind, "spark_type": dtype.simpleString()}
    return metadata


def _arrays_for_vectors(df, metadata: Dict[str, Dict[str, Any]]):
    """``df`` with its vector columns turned into arrays of doubles (Parquet has no vector type)."""
    from pyspark.ml.functions import vector_to_array

    for col, meta in metadata.items():
        if meta["kind"] == "vector":
            df = df.withColumn(col, vector_to_array(df[col], "float64"))
    return df


def _split(df, validation: Union[None, float, str], seed: Optional[int]):
    """(train, validation or None): a random fraction of the rows, or the rows whose column is true."""
    from pyspark.sql import functions as F

    if validation is None or validation == 0:
        return df, None
    if isinstance(validation, str):
        flag = F.col(validation).cast("boolean")
        return df.filter(~flag | flag.isNull()).drop(validation), df.filter(flag).drop(validation)
    train, val = df.randomSplit([1.0 - float(validation), float(validation)], seed=seed)
    return train, val


def prepare_data(store, df, feature_cols: Sequence[str], label_cols: Sequence[str], idx: str,
                 num_processes: int, validation: Union[None, float, str] = None,
                 sample_weight_col: Optional[str] = None, partitions_per_process: int = 10,
                 seed: Optional[int] = None) -> DatasetInfo:
    """Write the training (and validation) rows of ``df`` to the store as Parquet; their counts and
    metadata."""
    cols: List[str] = list(dict.fromkeys([*feature_cols, *label_cols,
                                          *([sample_weight_col] if sample_weight_col else [])]))
    check_columns(df, feature_cols, label_cols, sample_weight_col, validation)
    metadata = column_metadata(df, cols)
    selected = df.select(*cols, *([validation] if isinstance(validation, str) else []))
    train, val = _split(_arrays_for_vectors(selected, metadata), validation, seed)
    partitions = max(1, num_processes * (partitions_per_process or 1))
    counts = []
    for part, path in ((train, store.get_train_data_path(idx)), (val, store.get_val_data_path(idx))):
        if part is None:
            counts.append(0)
            continue
        part.repartition(partitions).write.mode("overwrite").parquet(path)
        counts.append(store.get_parquet_dataset(path).count_rows())
        log.debug("wrote %d rows to %s", counts[-1], path)
    if counts[0] == 0:
        raise ValueError("the DataFrame has no training rows (after the validation split): nothing to "
                         "train on")
    if validation is not None and validation != 0 and counts[1] == 0:
        raise ValueError(f"validation={validation!r} selected no rows: give a larger fraction, or a column "
                         "that is true for some rows")
    return DatasetInfo(idx=idx, train_rows=counts[0], val_rows=counts[1], metadata=metadata)
