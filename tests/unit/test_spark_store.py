"""The estimators' stores (LocalStore, an fsspec memory:// store, HDFSStore's errors) and the ranks' Parquet
reader, without Spark: paths laid out as upstream's, bytes written and read back, every row read by exactly
one rank, and equal steps per epoch on every rank."""
from __future__ import annotations

import pickle
import sys
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horovod.spark.common.reader import batches, read_shard, steps_per_epoch
from horovod.spark.common.store import FilesystemStore, HDFSStore, LocalStore, Store


@pytest.fixture
def memory_store():
    prefix = f"memory://hvd-test-{uuid.uuid4().hex}"
    store = Store.create(prefix)
    yield store
    store.delete(prefix)


def test_create_picks_the_store_by_url(tmp_path):
    assert type(Store.create(str(tmp_path))) is LocalStore
    assert type(Store.create(f"file://{tmp_path}")) is LocalStore
    assert type(Store.create("memory://bucket/prefix")) is FilesystemStore


def test_local_store_lays_out_upstreams_paths(tmp_path):
    store = Store.create(str(tmp_path / "store"))
    prefix = f"file://{tmp_path}/store"
    assert store.prefix_path == prefix
    assert store.get_train_data_path() == f"{prefix}/intermediate_train_data"
    assert store.get_train_data_path(3) == f"{prefix}/intermediate_train_data.3"
    assert store.get_val_data_path("run1") == f"{prefix}/intermediate_val_data.run1"
    assert store.get_test_data_path(0) == f"{prefix}/intermediate_test_data.0"
    assert store.get_runs_path() == f"{prefix}/runs"
    assert store.get_run_path("r") == f"{prefix}/runs/r"
    assert store.get_checkpoint_path("r") == f"{prefix}/runs/r/checkpoint"
    assert store.get_logs_path("r") == f"{prefix}/runs/r/logs"
    assert store.saving_runs()
    assert Store.create(str(tmp_path), save_runs=False).get_checkpoint_path("r") is None


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_write_read_exists_delete(kind, tmp_path, memory_store):
    store = Store.create(str(tmp_path)) if kind == "local" else memory_store
    path = store.get_checkpoint_path("run7")
    assert not store.exists(path)
    store.write(path, b"weights")
    assert store.exists(path) and store.read(path) == b"weights"
    store.write(path, b"newer")
    assert store.read(path) == b"newer"
    store.write(store.get_run_path("run7") + "/b.ckpt", b"")
    store.write(store.get_run_path("run7") + "/a.ckpt", b"")
    assert [p.rsplit("/", 1)[1] for p in store.get_checkpoints("run7")] == ["a.ckpt", "b.ckpt"]
    store.delete(store.get_run_path("run7"))
    assert not store.exists(path)


def test_a_store_pickles_without_its_filesystem_handle(memory_store):
    memory_store.write(memory_store.get_logs_path("r") + "/x", b"1")
    assert memory_store._fs is not None
    copy = pickle.loads(pickle.dumps(memory_store))
    assert copy._fs is None and copy.read(copy.get_logs_path("r") + "/x") == b"1"


def test_hdfs_store_needs_an_hdfs_url_and_says_what_it_needs():
    with pytest.raises(ValueError, match=r"HDFSStore needs an hdfs:// URL, not 's3://b/p'; use Store.create"):
        HDFSStore("s3://b/p")
    store = Store.create("hdfs://namenode.invalid:8020/user/me/hvd")
    assert type(store) is HDFSStore
    prefix = "hdfs://namenode.invalid:8020/user/me/hvd"
    assert store.get_train_data_path(1) == f"{prefix}/intermediate_train_data.1"
    expected = rf"HDFSStore could not connect to '{prefix}' through fsspec's HDFS filesystem: .* needs pyarrow's"
    with pytest.raises(RuntimeError, match=expected):
        store.exists(store.get_train_data_path())


def _write_parquet(store, path: str, files: int, rows_per_file: int) -> None:
    fs = store.fs
    local = store.get_localized_path(path)
    fs.makedirs(local, exist_ok=True)
    for i in range(files):
        ids = np.arange(i * rows_per_file, (i + 1) * rows_per_file)
        table = pa.table({"id": ids, "features": pa.array([[float(v), -float(v)] for v in ids])})
        with fs.open(f"{local}/part-{i:05d}.parquet", "wb") as f:
            pq.write_table(table, f)
    with fs.open(f"{local}/_SUCCESS", "wb") as f:
        f.write(b"")


@pytest.mark.parametrize("files,size", [(6, 2), (5, 3), (2, 3)])
def test_every_row_is_read_by_exactly_one_rank(memory_store, files, size):
    path = memory_store.get_train_data_path("t")
    _write_parquet(memory_store, path, files, rows_per_file=7)
    assert memory_store.is_parquet_dataset(path)
    shards = [read_shard(memory_store, path, rank, size, ["id", "features"]) for rank in range(size)]
    ids = np.concatenate([shard["id"] for shard in shards])
    assert sorted(ids.tolist()) == list(range(files * 7))
    for shard in shards:
        assert shard["features"].shape == (len(shard["id"]), 2)
        np.testing.assert_array_equal(shard["features"][:, 1], -shard["id"])
        assert len(shard["id"]) > 0


def test_empty_files_leave_no_rank_without_rows(memory_store):
    path = memory_store.get_train_data_path("t")
    _write_parquet(memory_store, path, 2, rows_per_file=3)
    empty = pa.table({"id": pa.array([], pa.int64()), "features": pa.array([], pa.list_(pa.float64()))})
    for name in ("part-00002", "part-00003"):  # sorted after the full ones: rank 1 would get only empties
        with memory_store.fs.open(f"{memory_store.get_localized_path(path)}/{name}.parquet", "wb") as f:
            pq.write_table(empty, f)
    shards = [read_shard(memory_store, path, rank, 3, ["id"])["id"].tolist() for rank in range(3)]
    assert sorted(sum(shards, [])) == list(range(6)) and all(shards)


def test_transformation_fn_without_pandas_says_what_to_install(memory_store, monkeypatch):
    path = memory_store.get_train_data_path("t")
    _write_parquet(memory_store, path, 2, rows_per_file=3)
    monkeypatch.setitem(sys.modules, "pandas", None)  # as where pandas is not installed
    with pytest.raises(RuntimeError, match=r"as a pandas DataFrame .* pip install pandas"):
        read_shard(memory_store, path, 0, 1, ["id"], transformation_fn=lambda frame: frame)


def test_transformation_fn_gets_each_ranks_rows_as_a_pandas_frame(memory_store):
    path = memory_store.get_train_data_path("t")
    _write_parquet(memory_store, path, 2, rows_per_file=3)
    seen = []

    def transform(frame):
        seen.append(type(frame).__name__)
        frame = frame[frame["id"] % 2 == 0].copy()                  # drop rows, change a column
        frame["features"] = frame["features"].apply(lambda v: [2.0 * x for x in v])
        return frame

    plain = read_shard(memory_store, path, 0, 1, ["id", "features"])
    got = read_shard(memory_store, path, 0, 1, ["id", "features"], transformation_fn=transform)
    assert seen == ["DataFrame"]
    keep = plain["id"] % 2 == 0
    np.testing.assert_array_equal(got["id"], plain["id"][keep])
    np.testing.assert_allclose(got["features"], 2.0 * plain["features"][keep])   # back as a 2-D array


def test_every_rank_runs_the_same_number_of_steps():
    assert steps_per_epoch(1000, 32, 2) == 15
    assert steps_per_epoch(10, 32, 4) == 1
    assert steps_per_epoch(1000, 32, 2, given=3) == 3
    shard = {"x": np.arange(10)}
    seen = list(batches(shard, batch_size=4, steps=5, shuffle=True, rng=np.random.default_rng(0)))
    assert [len(batch["x"]) for batch in seen] == [4, 4, 4, 4, 4]
    first_pass = np.concatenate([batch["x"] for batch in seen[:2]])
    assert len(set(first_pass.tolist())) == 8, "a pass through the shard does not repeat rows"
    with pytest.raises(RuntimeError, match="shard of the training data is empty"):
        list(batches({"x": np.arange(0)}, 4, 1, False, np.random.default_rng(0)))
