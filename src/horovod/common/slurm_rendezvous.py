"""Plain ``srun -n N python train.py`` (no horovodrun): the task with rank 0 hosts the job's rendezvous.

Without a launcher nobody hands the tasks a secret and a rendezvous address, so rank 0 makes them and shares
them through files in a directory every node sees (the user's home, on clusters):

- the **secret file** (``HOROVOD_SECRET_FILE``, default ``~/.horovod/slurm-<job id>.<step id>.key``): a fresh
  random 256-bit secret, created by rank 0 with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600 (the directory
  is made 0700 when it does not exist);
- the **address file** (``<secret file>.addr``): ``<address>:<port>`` of rank 0's store, written after the
  secret and renamed into place, so that its appearance means both are complete.

The other ranks wait for the address file, refuse a secret file that is not theirs or that others may read or
write, check the pair by connecting (HMAC challenge with the secret: a stale pair left by an earlier step with
the same ids fails and is read again), and then join the rendezvous as under ``horovodrun``. Once rank 0's mesh
is connected every rank has read the files, and rank 0 removes them; they are also removed when rank 0 exits.
"""
from __future__ import annotations

import atexit
import logging
import os
import stat
import time
from typing import Mapping, Optional, Tuple

from horovod.common import config, wire
from horovod.common.kvstore import KVStoreClient, KVStoreServer
from horovod.common.topology import Topology

log = logging.getLogger(__name__)

SOURCE = "Slurm"
ADDR_SUFFIX = ".addr"
_POLL_SECONDS = 0.1
_CHECK_SECONDS = 2.0

_state: dict = {}   # this process's job: "found" (key, addr, port); rank 0 also "server" and "paths"


def wanted(topo: Topology, env: Optional[Mapping[str, str]] = None) -> bool:
    """True for a task that srun started with no launcher's rendezvous (no secret, no address)."""
    env = os.environ if env is None else env
    return (topo.source == SOURCE and topo.size > 1 and wire.secret_from_env(dict(env)) is None
            and not config.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", env))


def secret_path(env: Optional[Mapping[str, str]] = None) -> str:
    """Where the secret is shared: ``HOROVOD_SECRET_FILE``, else ``~/.horovod/slurm-<job>.<step>.key``."""
    env = os.environ if env is None else env
    given = config.get("HOROVOD_SECRET_FILE", env)
    if given:
        return os.path.abspath(os.path.expanduser(given))
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "nojob"
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "0"
    return os.path.join(os.path.expanduser("~"), ".horovod", f"slurm-{job}.{step}.key")


def locate(topo: Topology, timeout: float, advertised_addr: str) -> Tuple[bytes, str, int]:
    """The job's secret and rank 0's store address; rank 0 starts the store and publishes them first.

    Raises RuntimeError saying what to do when the files do not appear within ``timeout`` or are unsafe.
    """
    if "found" not in _state:
        path = secret_path()
        _state["found"] = _publish(path, advertised_addr) if topo.rank == 0 else _read(path, timeout)
    return _state["found"]


def mesh_built(topo: Topology) -> None:
    """Rank 0, once every rank joined: remove the files (each rank has read them by then)."""
    if topo.rank == 0:
        _remove_files()


def _publish(path: str, advertised_addr: str) -> Tuple[bytes, str, int]:
    secret = wire.make_secret()
    key = bytes.fromhex(secret)
    server = KVStoreServer(key, host="0.0.0.0")
    port = server.start()
    _state["server"] = server
    addr_path = path + ADDR_SUFFIX
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    for stale in (addr_path, path):     # an earlier step with the same ids (a restarted cluster) left them
        try:
            os.unlink(stale)
            log.warning("removed a stale %s left by an earlier job step with the same ids", stale)
        except FileNotFoundError:
            pass
    _state["paths"] = (addr_path, path)
    atexit.register(_shutdown)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp = f"{addr_path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{advertised_addr}:{port}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, addr_path)
    log.debug("rank 0 published the rendezvous %s:%d through %s", advertised_addr, port, path)
    return key, advertised_addr, port


def read_secret(path: str) -> bytes:
    """The secret of ``path``; RuntimeError when the file is not this user's or others may read or write it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise RuntimeError(
                f"refusing the job secret file {path}: it is owned by uid {info.st_uid} with mode "
                f"{stat.S_IMODE(info.st_mode):04o}, but it must be yours (uid {os.getuid()}) and mode 0600. "
                "Remove it, or point HOROVOD_SECRET_FILE at a private directory every node sees.")
        return bytes.fromhex(f.read().strip())


def _read(path: str, timeout: float) -> Tuple[bytes, str, int]:
    deadline = time.monotonic() + timeout
    last_error: Optional[Exception] = None
    while time.monotonic() < deadline:
        try:
            with open(path + ADDR_SUFFIX) as f:
                host, _, port = f.read().strip().rpartition(":")
            key = read_secret(path)
            KVStoreClient(host, int(port), key, timeout=_CHECK_SECONDS).close()
            return key, host, int(port)
        except RuntimeError:
            raise
        except (OSError, ValueError) as exc:    # not there yet, half a stale pair, or rank 0 not listening yet
            last_error = exc
            time.sleep(_POLL_SECONDS)
    raise RuntimeError(
        f"rank 0 did not publish the job's rendezvous in {path} (and {ADDR_SUFFIX}) within {timeout:.0f}s "
        f"(last problem: {last_error}). The directory must be one every node sees (a shared home or file system): "
        "set HOROVOD_SECRET_FILE to a path there, or raise HOROVOD_START_TIMEOUT if rank 0 starts late.")


def _remove_files() -> None:
    for path in _state.pop("paths", ()):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _shutdown() -> None:
    _remove_files()
    server = _state.pop("server", None)
    if server is not None:
        server.stop()
