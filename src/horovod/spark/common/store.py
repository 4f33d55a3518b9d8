"""Where an estimator keeps its intermediate data, checkpoints and logs (upstream's
``horovod.spark.common.store``).

A store is a prefix path on a filesystem that both the Spark executors and the training ranks can reach. Under
it:

- ``intermediate_train_data[.<idx>]``, ``intermediate_val_data[.<idx>]``, ``intermediate_test_data[.<idx>]``:
  the Parquet copies of the DataFrame that the ranks read (one ``idx`` per prepared dataset);
- ``runs/<run_id>/checkpoint`` (the last checkpoint rank 0 wrote) and ``runs/<run_id>/logs`` (per-run logs).

``FilesystemStore`` works on any fsspec URL (``file://``, ``memory://``, ``s3://``, ``gs://``, ...);
``LocalStore`` is the local filesystem; ``HDFSStore`` needs an ``hdfs://`` URL and fsspec's HDFS support
(pyarrow's libhdfs). ``Store.create(prefix_path)`` picks the right one from the URL.
"""
from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tempfile
from typing import Any, Callable, Iterator, List, Optional

TRAIN_DATA = "intermediate_train_data"
VAL_DATA = "intermediate_val_data"
TEST_DATA = "intermediate_test_data"
RUNS = "runs"


class Store:
    """Storage for an estimator's materialized data, checkpoints and logs (upstream's abstract ``Store``)."""

    def __init__(self) -> None:
        self._train_data_to_key: dict = {}
        self._val_data_to_key: dict = {}

    def is_parquet_dataset(self, path: str) -> bool:
        """True when ``path`` holds a Parquet dataset written by Spark (a ``_SUCCESS`` marker or .parquet
        files)."""
        raise NotImplementedError()

    def get_parquet_dataset(self, path: str):
        """A ``pyarrow.dataset.Dataset`` over the Parquet files under ``path``."""
        raise NotImplementedError()

    def get_train_data_path(self, idx: Optional[Any] = None) -> str:
        raise NotImplementedError()

    def get_val_data_path(self, idx: Optional[Any] = None) -> str:
        raise NotImplementedError()

    def get_test_data_path(self, idx: Optional[Any] = None) -> str:
        raise NotImplementedError()

    def saving_runs(self) -> bool:
        raise NotImplementedError()

    def get_runs_path(self) -> str:
        raise NotImplementedError()

    def get_run_path(self, run_id: str) -> str:
        raise NotImplementedError()

    def get_checkpoint_path(self, run_id: str) -> Optional[str]:
        raise NotImplementedError()

    def get_checkpoints(self, run_id: str, suffix: str = ".ckpt") -> List[str]:
        raise NotImplementedError()

    def get_logs_path(self, run_id: str) -> Optional[str]:
        raise NotImplementedError()

    def get_checkpoint_filename(self) -> str:
        raise NotImplementedError()

    def get_logs_subdir(self) -> str:
        raise NotImplementedError()

    def exists(self, path: str) -> bool:
        raise NotImplementedError()

    def read(self, path: str) -> bytes:
        raise NotImplementedError()

    def write(self, path: str, data: bytes) -> None:
        raise NotImplementedError()

    def sync_fn(self, run_id: str) -> Callable[[str], None]:
        """A function that copies a rank's local run directory into this store's run path (for
        checkpoints)."""
        raise NotImplementedError()

    def get_local_output_dir_fn(self, run_id: str) -> Callable[[], Any]:
        """A function returning a context manager that yields a local scratch directory for the run's
        output."""
        raise NotImplementedError()

    def to_remote(self, run_id: str, dataset_idx: Optional[Any]):
        """What the training ranks need of the store: itself (stores are plain picklable objects)."""
        return self

    @staticmethod
    def create(prefix_path: str, *args: Any, **kwargs: Any) -> Store:
        """The store for ``prefix_path``: ``HDFSStore`` for hdfs://, ``LocalStore`` for a local path or
        file://, and ``FilesystemStore`` for any other fsspec URL."""
        protocol = _protocol(prefix_path)
        if protocol in ("hdfs", "viewfs"):
            return HDFSStore(prefix_path, *args, **kwargs)
        if protocol in ("", "file"):
            if prefix_path.startswith("/dbfs/"):
                return DBFSLocalStore(prefix_path, *args, **kwargs)
            return LocalStore(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


class AbstractFilesystemStore(Store):
    """A store laid out under one prefix path: the paths of upstream's stores, on a filesystem of a
    subclass."""

    def __init__(self, prefix_path: str, train_path: Optional[str] = None, val_path: Optional[str] = None,
                 test_path: Optional[str] = None, runs_path: Optional[str] = None, save_runs: bool = True,
                 storage_options: Optional[dict] = None, checkpoint_filename: str = "checkpoint",
                 logs_subdir: str = "logs", **kwargs: Any) -> None:
        super().__init__()
        self.prefix_path = self.get_full_path(prefix_path.rstrip("/") or prefix_path)
        self._train_path = self._get_full_path_or_default(train_path, TRAIN_DATA)
        self._val_path = self._get_full_path_or_default(val_path, VAL_DATA)
        self._test_path = self._get_full_path_or_default(test_path, TEST_DATA)
        self._runs_path = self._get_full_path_or_default(runs_path, RUNS)
        self._save_runs = save_runs
        self.storage_options = storage_options or {}
        self._checkpoint_filename = checkpoint_filename
        self._logs_subdir = logs_subdir
        self._fs = None

    # -- paths -----------------------------------------------------------------------------------------------
    def get_full_path(self, path: str) -> str:
        """``path`` as a URL of this store's filesystem (a subclass adds its scheme)."""
        return path

    def get_localized_path(self, path: str) -> str:
        """``path`` as the filesystem object expects it (the URL less its scheme where fsspec wants that)."""
        return path

    def _get_full_path_or_default(self, path: Optional[str], default_name: str) -> str:
        if path is not None:
            return self.get_full_path(path)
        return self._join(self.prefix_path, default_name)

    @staticmethod
    def _join(base: str, *names: str) -> str:
        return posixpath.join(base, *names)

    @staticmethod
    def _with_idx(path: str, idx: Optional[Any]) -> str:
        return f"{path}.{idx}" if idx is not None else path

    def get_train_data_path(self, idx: Optional[Any] = None) -> str:
        return self._with_idx(self._train_path, idx)

    def get_val_data_path(self, idx: Optional[Any] = None) -> str:
        return self._with_idx(self._val_path, idx)

    def get_test_data_path(self, idx: Optional[Any] = None) -> str:
        return self._with_idx(self._test_path, idx)

    def saving_runs(self) -> bool:
        return self._save_runs

    def get_runs_path(self) -> str:
        return self._runs_path

    def get_run_path(self, run_id: str) -> str:
        return self._join(self.get_runs_path(), run_id)

    def get_checkpoint_path(self, run_id: str) -> Optional[str]:
        if not self._save_runs:
            return None
        return self._join(self.get_run_path(run_id), self.get_checkpoint_filename())

    def get_checkpoints(self, run_id: str, suffix: str = ".ckpt") -> List[str]:
        run_path = self.get_run_path(run_id)
        if not self.exists(run_path):
            return []
        names = [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.get_localized_path(run_path),
                                                                         detail=False)]
        return sorted(self._join(run_path, name) for name in names if name.endswith(suffix))

    def get_logs_path(self, run_id: str) -> Optional[str]:
        if not self._save_runs:
            return None
        return self._join(self.get_run_path(run_id), self.get_logs_subdir())

    def get_checkpoint_filename(self) -> str:
        return self._checkpoint_filename

    def get_logs_subdir(self) -> str:
        return self._logs_subdir

    # -- filesystem ------------------------------------------------------------------------------------------
    @property
    def fs(self):
        """The fsspec filesystem of this store (created on first use, also on the training ranks)."""
        if self._fs is None:
            self._fs = self._make_fs()
        return self._fs

    def _make_fs(self):
        raise NotImplementedError()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fs"] = None  # filesystem handles do not travel; each process opens its own
        return state

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(self.get_localized_path(path)))

    def read(self, path: str) -> bytes:
        with self.fs.open(self.get_localized_path(path), "rb") as f:
            return f.read()

    def write(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (replacing it), creating its parent directories."""
        local = self.get_localized_path(path)
        self.fs.makedirs(posixpath.dirname(local), exist_ok=True)
        with self.fs.open(local, "wb") as f:
            f.write(data)

    def delete(self, path: str) -> None:
        """Remove ``path`` and everything under it, if it exists."""
        local = self.get_localized_path(path)
        if self.fs.exists(local):
            self.fs.rm(local, recursive=True)

    def is_parquet_dataset(self, path: str) -> bool:
        local = self.get_localized_path(path)
        if not self.fs.exists(local):
            return False
        if self.fs.exists(self._join(local, "_SUCCESS")):
            return True
        return any(str(p).endswith(".parquet") for p in self.fs.ls(local, detail=False))

    def get_parquet_dataset(self, path: str):
        import pyarrow.dataset as ds
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        filesystem = PyFileSystem(FSSpecHandler(self.fs))
        return ds.dataset(self.get_localized_path(path), format="parquet", filesystem=filesystem,
                          exclude_invalid_files=False, ignore_prefixes=[".", "_"])

    def sync_fn(self, run_id: str) -> Callable[[str], None]:
        run_path = self.get_localized_path(self.get_run_path(run_id))
        store = self

        def sync(local_run_path: str) -> None:
            store.fs.makedirs(run_path, exist_ok=True)
            store.fs.put(local_run_path.rstrip("/") + "/", run_path, recursive=True)

        return sync

    def get_local_output_dir_fn(self, run_id: str) -> Callable[[], Any]:
        @contextlib.contextmanager
        def local_run_path() -> Iterator[str]:
            path = tempfile.mkdtemp(prefix=f"hvd-run-{run_id}-")
            try:
                yield path
            finally:
                shutil.rmtree(path, ignore_errors=True)

        return local_run_path


class FilesystemStore(AbstractFilesystemStore):
    """A store on any fsspec filesystem, named by the URL of ``prefix_path`` (``memory://``, ``s3://``,
    ...)."""

    def _make_fs(self):
        import fsspec

        protocol = _protocol(self.prefix_path) or "file"
        try:
            return fsspec.filesystem(protocol, **self.storage_options)
        except (ImportError, ValueError) as exc:
            raise ValueError(
                f"the store {self.prefix_path!r} needs fsspec's {protocol!r} filesystem, which is not "
                f"available here ({exc}); install the fsspec implementation for {protocol}:// or use a "
                "LocalStore"
            ) from exc

    def get_localized_path(self, path: str) -> str:
        # the path as the fsspec filesystem (and pyarrow through it) wants it: without its scheme
        return type(self.fs)._strip_protocol(path)


class LocalStore(FilesystemStore):
    """A store on the local filesystem (a path or a file:// URL): every executor and rank must see the same
    directory, as on one machine or a shared mount."""

    FS_PREFIX = "file://"

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        if prefix_path.startswith(self.FS_PREFIX):
            prefix_path = prefix_path[len(self.FS_PREFIX):]
        super().__init__(os.path.abspath(prefix_path), *args, **kwargs)

    def get_full_path(self, path: str) -> str:
        if path.startswith(self.FS_PREFIX):
            return path
        return self.FS_PREFIX + os.path.abspath(path)

    def _make_fs(self):
        import fsspec

        return fsspec.filesystem("file", auto_mkdir=True)


class DBFSLocalStore(LocalStore):
    """Databricks' DBFS through its local /dbfs mount: a LocalStore whose paths read the same on every
    node."""


class HDFSStore(FilesystemStore):
    """A store on HDFS (``hdfs://namenode:port/path``) through fsspec's HDFS filesystem (pyarrow and
    libhdfs)."""

    def __init__(self, prefix_path: str, host: Optional[str] = None, port: Optional[int] = None,
                 user: Optional[str] = None, kerb_ticket: Optional[str] = None, driver: str = "libhdfs",
                 extra_conf: Optional[dict] = None, *args: Any, **kwargs: Any) -> None:
        if _protocol(prefix_path) not in ("hdfs", "viewfs"):
            raise ValueError(f"HDFSStore needs an hdfs:// URL, not {prefix_path!r}; use Store.create(path) "
                             "to pick the store that fits a path")
        options = dict(kwargs.pop("storage_options", None) or {})
        options.update({k: v for k, v in (("host", host), ("port", port), ("user", user),
                                          ("kerb_ticket", kerb_ticket), ("extra_conf", extra_conf)) if v})
        super().__init__(prefix_path, *args, storage_options=options, **kwargs)

    def _make_fs(self):
        import fsspec

        try:
            return fsspec.filesystem("hdfs", **self.storage_options)
        except Exception as exc:
            raise RuntimeError(
                f"HDFSStore could not connect to {self.prefix_path!r} through fsspec's HDFS filesystem: "
                f"{_first_line(exc)}. It needs pyarrow's HDFS support: a Hadoop client with libhdfs (set "
                "HADOOP_HOME, JAVA_HOME and CLASSPATH=$(hadoop classpath --glob)) on every machine that runs "
                "the estimator"
            ) from exc
