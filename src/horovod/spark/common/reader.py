"""The ranks' side of the data path: read this rank's shard of the Parquet data and cut it into batches.

Each rank reads every ``size``-th non-empty Parquet file of the dataset (files sorted by path) with pyarrow's
datasets, so the ranks' shards are disjoint and of similar size; with fewer such files than ranks each rank takes
every ``size``-th row instead. The shard is held in memory as one numpy array per column. Every epoch runs the same
number of steps on every rank (the driver computes it from the total row count), cycling through the shard, so
that no rank waits in an allreduce for a rank that has run out of rows.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

Arrays = Dict[str, np.ndarray]
TRANSFORMATION_NEEDS_PANDAS = ("transformation_fn is given each rank's rows as a pandas DataFrame (as "
                               "upstream's); pandas is not installed here: pip install pandas, or drop "
                               "transformation_fn")


def pandas_available() -> bool:
    """True when pandas can be imported (transformation_fn needs it; nothing else here does)."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


def _is_list(arrow_type) -> bool:
    import pyarrow as pa

    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(
        arrow_type)


def column_to_numpy(column) -> np.ndarray:
    """A pyarrow column as numpy: numbers as a 1-d array, lists of equal length (vectors, arrays) as the rows
    of a 2-d array, lists of lists as a deeper one."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not _is_list(array.type):
        return array.to_numpy(zero_copy_only=False)
    if len(array) == 0:
        return np.zeros((0, 0), dtype=np.float64)
    if _is_list(array.type.value_type):
        return np.stack([np.asarray(value) for value in array.to_pylist()])
    lengths = array.value_lengths().to_numpy(zero_copy_only=False)
    if len(set(lengths.tolist())) != 1:
        raise ValueError("a feature or label column holds arrays of different lengths; every row must have "
                         "the same shape to be batched")
    return array.flatten().to_numpy(zero_copy_only=False).reshape(len(array), int(lengths[0]))


def pandas_to_arrays(frame, columns: Sequence[str]) -> Arrays:
    """Columns of a pandas DataFrame (after a transformation_fn) as numpy arrays; cells holding arrays
    stacked."""
    arrays = {}
    for col in columns:
        values = frame[col].to_numpy()
        if values.dtype == object and len(values) and hasattr(values[0], "__len__"):
            values = np.stack([np.asarray(v) for v in values])
        arrays[col] = values
    return arrays


def read_shard(store, path: str, rank: int, size: int, columns: Sequence[str],
               transformation_fn: Optional[Callable] = None) -> Arrays:
    """This rank's rows of the Parquet dataset at ``path``: one numpy array per column."""
    import pyarrow as pa

    dataset = store.get_parquet_dataset(path)
    # empty files (Spark may write some for empty partitions) would leave a rank with no rows
    fragments = [fragment for fragment in sorted(dataset.get_fragments(), key=lambda fragment: fragment.path)
                 if fragment.count_rows() > 0]
    if len(fragments) >= size:
        tables = [fragment.to_table(columns=list(columns)) for fragment in fragments[rank::size]]
        table = pa.concat_tables(tables) if tables else dataset.schema.empty_table().select(list(columns))
    else:
        table = dataset.to_table(columns=list(columns))
        table = table.take(pa.array(range(rank, table.num_rows, size), type=pa.int64()))
    if transformation_fn is not None:
        if not pandas_available():
            raise RuntimeError(TRANSFORMATION_NEEDS_PANDAS)
        return pandas_to_arrays(transformation_fn(table.to_pandas()), columns)
    return {col: column_to_numpy(table.column(col)) for col in columns}


def read_splits(spec: Any, rank: int, size: int) -> Tuple[Arrays, Optional[Arrays], int, int]:
    """This rank's training shard, its validation shard (None without validation rows) and the steps per epoch
    of each, for a training spec with the estimators' data fields (``Estimator._data_spec_kwargs``)."""
    cols = list(dict.fromkeys([*spec.feature_cols, *spec.label_cols,
                               *([spec.sample_weight_col] if spec.sample_weight_col else [])]))
    store, idx = spec.store, spec.dataset_idx
    train = read_shard(store, store.get_train_data_path(idx), rank, size, cols, spec.transformation_fn)
    val = (read_shard(store, store.get_val_data_path(idx), rank, size, cols, spec.transformation_fn)
           if spec.val_rows else None)
    return (train, val, steps_per_epoch(spec.train_rows, spec.batch_size, size, spec.train_steps_per_epoch),
            steps_per_epoch(spec.val_rows, spec.val_batch_size, size, spec.validation_steps_per_epoch))


def steps_per_epoch(rows: int, batch_size: int, size: int, given: Optional[int] = None) -> int:
    """Steps each rank runs per epoch: as given, or the rows one rank would see, in whole batches (at least
    1)."""
    if given is not None:
        return int(given)
    return max(1, int(math.floor(rows / batch_size / size)))


def batches(arrays: Arrays, batch_size: int, steps: int, shuffle: bool,
            rng: np.random.Generator) -> Iterator[Arrays]:
    """``steps`` batches from the shard, cycling through it (reshuffled on every pass when ``shuffle``)."""
    rows = len(next(iter(arrays.values()))) if arrays else 0
    if rows == 0:
        raise RuntimeError("this rank's shard of the training data is empty: give the DataFrame more rows "
                           "so that every rank gets some")
    order = rng.permutation(rows) if shuffle else np.arange(rows)
    position = 0
    for _ in range(steps):
        if position + batch_size > rows and position > 0:
            order = rng.permutation(rows) if shuffle else np.arange(rows)
            position = 0
        index = order[position:position + batch_size]
        position += batch_size
        yield {col: values[index] for col, values in arrays.items()}
