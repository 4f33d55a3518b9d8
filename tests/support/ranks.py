"""Helpers for test bodies that run inside every rank (``tests/parallel``)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

import horovod.numpy as hvd

INT_DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64]
FLOAT_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES + [np.bool_]


def dtype_id(dtype) -> str:
    return np.dtype(dtype).name


def is_float(dtype) -> bool:
    return np.dtype(dtype) in {np.dtype(d) for d in FLOAT_DTYPES}


def tolerance(dtype) -> dict:
    """rtol/atol for comparing a reduction of small values against a float64 reference."""
    dt = np.dtype(dtype)
    if dt == np.dtype(np.float16):
        return dict(rtol=2e-3, atol=2e-3)
    if dt == np.dtype(ml_dtypes.bfloat16):
        return dict(rtol=1.6e-2, atol=1.6e-2)
    if dt == np.dtype(np.float32):
        return dict(rtol=1e-6, atol=1e-6)
    return dict(rtol=1e-12, atol=1e-12)


def gather_rows(arr: np.ndarray) -> np.ndarray:
    """Every rank's copy of ``arr`` as the rows of one array (rank order), via allgather of the raw bytes."""
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).reshape(1, -1)
    return hvd.allgather(raw)


def assert_same_on_all_ranks(arr: np.ndarray) -> None:
    """The bytes of ``arr`` are identical on every rank."""
    rows = gather_rows(arr)
    for r in range(1, rows.shape[0]):
        assert np.array_equal(rows[r], rows[0]), f"rank {r}'s result differs from rank 0's bitwise"


def to_f64(arr: np.ndarray) -> np.ndarray:
    return np.asarray(arr).astype(np.float64)
