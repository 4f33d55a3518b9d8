"""Process-wide state: ``init``/``shutdown``, who am I, and what this build can do.

``init()`` detects the topology, rendezvouses with the other ranks through the launcher's authenticated store,
connects the peer mesh, chooses the data plane and starts the engine thread. It is idempotent, and a new
``init()`` after ``shutdown()`` builds everything afresh. Without a launcher it gives rank 0 of a job of
size 1.
"""
from __future__ import annotations

import atexit
import logging
import threading
from typing import List, Optional, Sequence

from horovod.common import config, logging_setup, mpi_context, topology, wire
from horovod.common.build import (  # noqa: F401  (part of basics' API, as upstream's)
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    mpi_built,
    nccl_built,
    rocm_built,
)
from horovod.common.exceptions import not_initialized
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.core.controller.fusion import aligned_threshold
from horovod.core.engine import Engine
from horovod.core.engine.observer import EngineObserver
from horovod.core.engine.settings import EngineSettings
from horovod.core.observers import stall_inspector
from horovod.core.observers import timeline as timeline_recording
from horovod.core.observers.autotune import make_autotuner
from horovod.core.observers.tuning import AutotuneObserver

log = logging.getLogger("horovod.basics")


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.topo: Optional[topology.Topology] = None
        self.engine: Optional[Engine] = None
        self.backend_reason = ""
        self.mpi: Optional[mpi_context.MPIContext] = None
        self.generation = 0
        self.atexit_registered = False


_state = _State()


def init(comm: Optional[object] = None, process_sets: Optional[Sequence[ProcessSet]] = None) -> None:
    """Start Horovod in this process (a repeated call is a no-op).

    ``comm`` is an mpi4py communicator (Horovod works on a duplicate of it) or a list of COMM_WORLD ranks, so
    that sub-communicators can run independent Horovod jobs; without it, a process started by ``mpirun`` runs
    on COMM_WORLD and one started by ``horovodrun`` joins its rendezvous. ``process_sets`` other than the
    global set raise NotImplementedError until the process-set feature lands.
    """
    with _state.lock:
        if _state.engine is not None and _state.engine.alive:
            return
        if _state.engine is not None:       # it died (peer lost): clean up before starting again
            shutdown()
        if process_sets == "dynamic":
            raise NotImplementedError("Dynamic process sets are not available in this release yet.")
        if process_sets:
            raise NotImplementedError("Process sets other than the global one are not available in this release yet.")
        mpi = None
        try:
            if mpi_context.wanted(comm):
                mpi = mpi_context.MPIContext(comm)
                topo = mpi.topology()
            else:
                topo = topology.detect()
        except (ValueError, RuntimeError) as exc:
            raise ValueError(f"Horovod initialization failed: {exc}") from exc
        logging_setup.configure(topo.rank)
        config.log_inert_knobs()
        generation = _state.generation
        try:
            engine, reason = _start(topo, generation, mpi)
        except Exception as exc:
            if mpi is not None:
                mpi.close()
            raise ValueError(f"Horovod initialization failed on rank {topo.rank} of {topo.size}: {exc}") from exc
        _state.generation += 1
        _state.topo = topo
        _state.engine = engine
        _state.mpi = mpi
        _state.backend_reason = reason
        global_process_set.ranks = list(range(topo.size))
        global_process_set.process_set_id = 0
        global_process_set.mpi_comm = mpi.comm if mpi is not None else None
        global_process_set.own_rank = topo.rank
        if not _state.atexit_registered:
            atexit.register(shutdown)
            _state.atexit_registered = True
        log.info("Horovod initialized: rank %d of %d (local %d/%d) on %s, started by %s, data plane: %s",
                 topo.rank, topo.size, topo.local_rank, topo.local_size, topo.hostname,
                 f"MPI ({mpi.library})" if mpi is not None else topo.source, reason)


def _settings(topo: topology.Topology) -> EngineSettings:
    """The engine's settings as the ``HOROVOD_*`` environment configures them."""
    return EngineSettings(
        cache_capacity=config.get("HOROVOD_CACHE_CAPACITY"),
        fusion_threshold=aligned_threshold(config.get("HOROVOD_FUSION_THRESHOLD"), topo.local_size),
        align_threshold=lambda nbytes: aligned_threshold(nbytes, topo.local_size),
        cycle_time_ms=config.get("HOROVOD_CYCLE_TIME"),
        disable_group_fusion=config.get("HOROVOD_DISABLE_GROUP_FUSION"),
        spin_us=config.get("HOROVOD_SPIN_MICROSECONDS"),
        bucket_bytes=config.get("HOROVOD_FUSION_BUCKET_BYTES"),
        bucket_ms=config.get("HOROVOD_FUSION_BUCKET_MS"),
        affinity=_engine_core(topo))


def _observers(topo: topology.Topology) -> List[EngineObserver]:
    """What watches rank 0's engine: the stall inspector and deadlock detector, and the autotuner when on (rank 0
    decides; every rank applies its values, see ``Engine.set_params``). Other ranks have none."""
    if topo.rank != 0:
        return []
    observers: List[EngineObserver] = []
    stall = stall_inspector.observer_from_config(topo.size)
    if stall is not None:
        observers.append(stall)
    if topo.size > 1:
        tuner = make_autotuner({"fusion_threshold": config.get("HOROVOD_FUSION_THRESHOLD"),
                                "cycle_time_ms": config.get("HOROVOD_CYCLE_TIME"),
                                "cache_enabled": config.get("HOROVOD_CACHE_CAPACITY") > 0})
        if tuner is not None:
            observers.append(AutotuneObserver(tuner))
    return observers


def _start(topo: topology.Topology, generation: int, mpi: Optional[mpi_context.MPIContext] = None):
    """Connect the mesh (through the launcher's rendezvous, or MPI), choose the data plane, start the engine."""
    from horovod.backends.local import LocalBackend

    settings, observers = _settings(topo), _observers(topo)
    if topo.size == 1:
        backend = LocalBackend()
        return (_started(Engine(0, 1, backend, {}, settings, on_close=backend.close, observers=observers)),
                "local (a single rank)")
    from horovod.backends.factory import make_backend
    from horovod.backends.mesh import build_mesh, default_bind_address

    timeout = config.get("HOROVOD_START_TIMEOUT")
    if mpi is not None:
        key = mpi.job_secret()
        mesh = build_mesh(topo, key, mpi.publish, generation, timeout, default_bind_address())
    else:
        key, mesh = _rendezvous_mesh(topo, generation, timeout)
    try:
        backend, reason = make_backend(mesh, wire.secret_fingerprint(key), generation, mpi)
    except BaseException:
        mesh.close()
        raise

    def close() -> None:
        backend.close()
        mesh.close()

    settings.hosts = mesh.hosts
    engine = _started(Engine(topo.rank, topo.size, backend, mesh.control, settings, on_close=close,
                             observers=observers))
    return engine, reason


def _rendezvous_mesh(topo: topology.Topology, generation: int, timeout: float):
    """The job secret and the mesh, connected through horovodrun's rendezvous store."""
    from horovod.backends.mesh import build_mesh, default_bind_address, kv_publish
    from horovod.common.kvstore import KVStoreClient

    key = wire.secret_from_env()
    addr = config.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = config.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if key is None or not addr or not port:
        raise RuntimeError(
            f"the {topo.source} environment says this job has {topo.size} ranks, but there is no Horovod "
            "rendezvous to connect them (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT and the job secret are unset). "
            "Launch the job with `horovodrun -np N python script.py`, or under mpirun with mpi4py installed "
            "(`pip install horovod[mpi]`)."
        )
    kv = KVStoreClient(addr, port, key, timeout=timeout)
    try:
        bind_addr = default_bind_address() if config.get("HOROVOD_GLOO_IFACE") else kv._sock.getsockname()[0]
        return key, build_mesh(topo, key, kv_publish(kv, generation, timeout), generation, timeout, bind_addr)
    finally:
        kv.close()


def _engine_core(topo: topology.Topology) -> Optional[int]:
    """The core the engine thread is pinned to: HOROVOD_THREAD_AFFINITY's entry for this local rank, if set."""
    spec = config.get("HOROVOD_THREAD_AFFINITY")
    if not spec:
        return None
    cores = [int(c) for c in spec.split(",") if c.strip()]
    if len(cores) < topo.local_size:
        raise ValueError(f"HOROVOD_THREAD_AFFINITY={spec!r} names {len(cores)} cores but this host runs "
                         f"{topo.local_size} ranks; give one core per local rank.")
    return cores[topo.local_rank]


def shutdown() -> None:
    """Stop the engine and close every connection; pending operations fail with the shutdown error."""
    with _state.lock:
        engine, _state.engine = _state.engine, None
        mpi, _state.mpi = _state.mpi, None
        if engine is None:
            return
        engine.shutdown()
        timeline_recording.stop_timeline(engine)
        if mpi is not None:
            mpi.close()
        global_process_set.process_set_id = 0
        global_process_set.mpi_comm = None
        global_process_set.own_rank = None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a timeline to ``file_path`` (rank 0 writes it); replaces a timeline being recorded.

    As upstream, needs HOROVOD_TIMELINE to be set when the job starts (``HOROVOD_TIMELINE=DYNAMIC`` enables the
    timeline without recording until this call). Can be called again, with another file, after stop_timeline.
    """
    current = engine()
    if not config.get("HOROVOD_TIMELINE"):
        raise ValueError("Timeline is not enabled: set HOROVOD_TIMELINE=DYNAMIC (or a file name) before the job "
                         "starts, e.g. `horovodrun --timeline-filename DYNAMIC ...`, to use start_timeline().")
    if not file_path:
        raise ValueError("start_timeline() needs a file path to write the timeline to.")
    timeline_recording.start_timeline(current, str(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Stop recording the timeline and close its file (it stays valid JSON)."""
    timeline_recording.stop_timeline(engine())


def _started(current: Engine) -> Engine:
    """Start the engine thread, recording from the first request when HOROVOD_TIMELINE names a file
    (DYNAMIC waits for start_timeline())."""
    path = config.get("HOROVOD_TIMELINE")
    if path and path.upper() != "DYNAMIC":
        timeline_recording.start_timeline(current, path, config.get("HOROVOD_TIMELINE_MARK_CYCLES"))
    return current.start()


def is_initialized() -> bool:
    """True between a successful ``init()`` and ``shutdown()``."""
    return _state.engine is not None


def engine() -> Engine:
    """The running engine; the upstream ValueError when Horovod is not initialized."""
    current = _state.engine
    if current is None:
        raise not_initialized()
    return current


def _topo() -> topology.Topology:
    if _state.engine is None or _state.topo is None:
        raise not_initialized()
    return _state.topo


def size() -> int:
    """Number of processes in the job."""
    return _topo().size


def rank() -> int:
    """This process's global rank."""
    return _topo().rank


def local_size() -> int:
    """Number of processes on this host."""
    return _topo().local_size


def local_rank() -> int:
    """This process's rank within its host."""
    return _topo().local_rank


def cross_size() -> int:
    """Number of hosts that have a process with this local rank."""
    return _topo().cross_size


def cross_rank() -> int:
    """Index of this host among the hosts with this local rank."""
    return _topo().cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of processes."""
    topo = _topo()
    return topo.size % topo.local_size == 0 and topo.cross_size * topo.local_size == topo.size


def data_plane() -> str:
    """Which data plane this job uses and why (shown by --check-build and logged at INFO)."""
    _topo()
    return _state.backend_reason


# ------------------------------------------------------------------ what is enabled (what is built: common/build.py)


def mpi_enabled() -> bool:
    """True when this job started on MPI (mpirun, ``horovodrun --mpi``, or ``init(comm=...)``)."""
    return _state.engine is not None and _state.mpi is not None


def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE (and HOROVOD_MPI_THREADS_DISABLE is not set), so the program
    may make its own MPI calls beside Horovod's; raises ValueError, as upstream, when MPI is not enabled."""
    _topo()
    if _state.mpi is None:
        raise ValueError("Horovod MPI is not enabled in this job (it was not started by mpirun or horovodrun "
                         "--mpi, nor given a communicator); mpi_threads_supported() needs MPI.")
    return _state.mpi.threads_supported


def gloo_enabled() -> bool:
    """True when the job started through horovodrun's rendezvous (upstream's Gloo controller), not MPI."""
    return is_initialized() and _state.mpi is None
