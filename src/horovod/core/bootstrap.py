"""Starting and stopping Horovod in this process: ``init``, ``shutdown``, and the timeline they may record.

``init()`` detects the topology, rendezvouses with the other ranks through the launcher's authenticated store,
connects the peer mesh, chooses the data plane and starts the engine thread, and records all of it in the job
state (:mod:`horovod.core.job_state`). It is idempotent, and a new ``init()`` after ``shutdown()`` builds
everything afresh. Without a launcher it gives rank 0 of a job of size 1.
"""
from __future__ import annotations

import atexit
import logging
import weakref
from typing import List, Optional, Sequence, Union

from horovod.common import config, logging_setup, mpi_context, slurm_rendezvous, topology, wire
from horovod.common.exceptions import HorovodInternalError
from horovod.core import elastic_join
from horovod.core.controller.fusion import aligned_threshold
from horovod.core.engine import Engine
from horovod.core.engine.observer import EngineObserver
from horovod.core.engine.settings import EngineSettings
from horovod.core.job_state import engine, state
from horovod.core.observers import flight_recorder, heartbeat, stall_inspector
from horovod.core.observers import timeline as timeline_recording
from horovod.core.observers import watchdog as _watchdog  # noqa: F401  (watches every engine's data plane)
from horovod.core.observers.autotune import make_autotuner
from horovod.core.observers.tuning import AutotuneObserver
from horovod.core.process_set_registry import register_static, static_sets
from horovod.core.process_set_table import JobContext
from horovod.core.process_sets import ProcessSet, global_process_set

log = logging.getLogger(__name__)


def init(comm: Optional[object] = None, process_sets: Union[Sequence[ProcessSet], str, None] = None) -> None:
    """Start Horovod in this process (a repeated call is a no-op).

    ``comm`` is an mpi4py communicator (Horovod works on a duplicate of it) or a list of COMM_WORLD ranks, so
    that sub-communicators can run independent Horovod jobs; without it, a process started by ``mpirun`` runs
    on COMM_WORLD and one started by ``horovodrun`` joins its rendezvous. ``process_sets`` registers process sets
    besides the global one (every rank passes the same list; sets made from MPI communicators may differ by
    rank, and the union is registered), or is ``"dynamic"`` to allow ``add_process_set`` later.
    """
    with state.lock:
        if state.engine is not None and state.engine.alive:
            return
        if state.engine is not None:       # it died (peer lost): clean up before starting again
            shutdown()
        process_sets = static_sets(process_sets)
        if elastic_join.wanted(comm):
            mpi = None
            topo, generation, (engine, reason, job) = _join_elastic()
        else:
            mpi, topo = _detect(comm)
            logging_setup.configure(topo.rank)
            config.log_inert_knobs()
            generation = state.generation
            try:
                engine, reason, job = _start(topo, generation, mpi)
            except Exception as exc:
                if mpi is not None:
                    mpi.close()
                # The data plane could not be set up (a peer never connected within HOROVOD_GLOO_TIMEOUT_SECONDS):
                # the error a program catches around collectives, as upstream's Gloo timeout.
                error = HorovodInternalError if isinstance(exc, HorovodInternalError) else ValueError
                raise error(f"Horovod initialization failed on rank {topo.rank} of {topo.size}: {exc}") from exc
        state.generation = generation + 1
        state.topo = topo
        state.engine = engine
        state.mpi = mpi
        state.backend_reason = reason
        state.job = job
        global_process_set.ranks = list(range(topo.size))
        global_process_set.process_set_id = 0
        global_process_set.mpi_comm = mpi.comm if mpi is not None else None
        global_process_set.own_rank = topo.rank
        if not state.atexit_registered:
            atexit.register(shutdown)
            state.atexit_registered = True
        register_static(process_sets)
        flight_recorder.install_signal_handler()        # SIGUSR1: this rank's flight record and stacks
        heartbeat.start(topo.rank, _status)
        log.info("Horovod initialized: rank %d of %d (local %d/%d) on %s, started by %s, data plane: %s",
                 topo.rank, topo.size, topo.local_rank, topo.local_size, topo.hostname,
                 f"MPI ({mpi.library})" if mpi is not None else topo.source, reason)


def _status() -> dict:
    """What this rank's engines are doing, for its heartbeat (see core/observers/heartbeat.py)."""
    current = state.engine
    return heartbeat.status_lines(([current] if current is not None else []) + state.sets.engines())


def _detect(comm: Optional[object]):
    """The MPI context (None without MPI) and this process's topology."""
    mpi = None
    try:
        if mpi_context.wanted(comm):
            mpi = mpi_context.MPIContext(comm)
            return mpi, mpi.topology()
        return None, topology.detect()
    except (ValueError, RuntimeError) as exc:
        if mpi is not None:
            mpi.close()
        raise ValueError(f"Horovod initialization failed: {exc}") from exc


def _join_elastic():
    """Join the elastic job's next round (see :mod:`horovod.core.elastic_join`): topology, round, started engine."""

    def start_round(topo: topology.Topology, round_id: int):
        logging_setup.configure(topo.rank)
        return _start(topo, round_id, None)

    try:
        return elastic_join.start(start_round)
    except (ValueError, RuntimeError, OSError) as exc:
        raise ValueError(f"Horovod initialization failed in the elastic job: {exc}") from exc


def _settings(topo: topology.Topology, on_machine: int = 1) -> EngineSettings:
    """The engine's settings as the ``HOROVOD_*`` environment configures them, for a rank whose machine runs
    ``on_machine`` ranks of the job (the engine polls only where each may have a core)."""
    from horovod.backends.spin import poll_microseconds

    return EngineSettings(
        cache_capacity=config.get("HOROVOD_CACHE_CAPACITY"),
        fusion_threshold=aligned_threshold(config.get("HOROVOD_FUSION_THRESHOLD"), topo.local_size),
        align_threshold=lambda nbytes: aligned_threshold(nbytes, topo.local_size),
        cycle_time_ms=config.get("HOROVOD_CYCLE_TIME"),
        disable_group_fusion=config.get("HOROVOD_DISABLE_GROUP_FUSION"),
        spin_us=poll_microseconds(config.get("HOROVOD_SPIN_MICROSECONDS"), on_machine),
        bucket_bytes=config.get("HOROVOD_FUSION_BUCKET_BYTES"),
        bucket_ms=config.get("HOROVOD_FUSION_BUCKET_MS"),
        fast_rounds=config.get("HOROVOD_FAST_ROUNDS"),
        flight_recorder_size=config.get("HOROVOD_FLIGHT_RECORDER_SIZE"),
        coordinator_carry_bytes=config.get("HOROVOD_COORDINATOR_CARRY_BYTES"),
        affinity=_engine_core(topo))


def _observers(topo: topology.Topology) -> List[EngineObserver]:
    """What watches rank 0's engine: the stall inspector and deadlock detector, and the autotuner when on (rank 0
    decides; every rank applies its values, see ``Engine.set_params``). Other ranks: the flight recorder only."""
    observers: List[EngineObserver] = flight_recorder.observers()       # every rank
    if topo.rank != 0:
        return observers
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

    observers = _observers(topo)
    if topo.size == 1:
        backend = LocalBackend()
        return (_started(Engine(0, 1, backend, {}, _settings(topo), on_close=backend.close, observers=observers)),
                "local (a single rank)", _job(topo, b"", generation, "127.0.0.1", mpi))
    from horovod.backends.factory import make_backend
    from horovod.backends.mesh import build_mesh, default_bind_address

    timeout = config.get("HOROVOD_START_TIMEOUT")
    if mpi is not None:
        key, bind_addr = mpi.job_secret(), default_bind_address()
        mesh = build_mesh(topo, key, mpi.publish, generation, timeout, bind_addr)
    else:
        key, bind_addr, mesh = _rendezvous_mesh(topo, generation, timeout)
    try:
        backend, reason = make_backend(mesh, wire.secret_fingerprint(key), generation, mpi)
    except BaseException:
        mesh.close()
        raise

    def close() -> None:
        backend.close()
        mesh.close()

    settings = _settings(topo, mesh.on_machine)
    settings.hosts = mesh.hosts
    engine = _started(Engine(topo.rank, topo.size, backend, mesh.control, settings, on_close=close,
                             observers=observers))
    return engine, reason, _job(topo, key, generation, bind_addr, mpi, mesh.on_machine)


def _job(topo: topology.Topology, key: bytes, generation: int, bind_addr: str,
         mpi: Optional[mpi_context.MPIContext], on_machine: int = 1) -> JobContext:
    """What starting a process set's engine will need to know about this job."""

    def set_observers(ranks: List[int], where: str) -> List[EngineObserver]:
        observers: List[EngineObserver] = flight_recorder.observers()   # every member; the rest: its coordinator
        if topo.rank != ranks[0]:
            return observers
        stall = stall_inspector.observer_from_config(len(ranks), ranks, where)
        observers += [stall] if stall is not None else []
        recording = timeline_recording.recording(state.engine) if state.engine is not None else None
        if recording is not None:           # the set's tensors go into the timeline being recorded
            observers.append(timeline_recording.TimelineObserver(recording.timeline, owner=False))
        return observers

    return JobContext(topo, key, generation, bind_addr, mpi, config.get("HOROVOD_START_TIMEOUT"),
                      lambda: _settings(topo, on_machine), set_observers)


def _rendezvous_mesh(topo: topology.Topology, generation: int, timeout: float):
    """The job secret, this rank's address for peers and the mesh, connected through horovodrun's rendezvous
    store."""
    from horovod.backends.mesh import build_mesh, default_bind_address, kv_publish
    from horovod.common.kvstore import KVStoreClient

    key = wire.secret_from_env()
    addr = config.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = config.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if slurm_rendezvous.wanted(topo):     # plain srun: rank 0 hosts the rendezvous
        key, addr, port = slurm_rendezvous.locate(topo, timeout, default_bind_address())
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
        abandoned = elastic_join.abandoned_check(kv, generation) if config.get("HOROVOD_ELASTIC") else None
        mesh = build_mesh(topo, key, kv_publish(kv, generation, timeout, abandoned), generation, timeout,
                          bind_addr)
        slurm_rendezvous.mesh_built(topo)
        return key, bind_addr, mesh
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
    with state.lock:
        engine, state.engine = state.engine, None
        mpi, state.mpi = state.mpi, None
        if engine is None:
            return
        heartbeat.stop()
        state.sets.close()             # the sets' engines first: they may still use the global one's sockets
        state.job = None
        for bound in list(state.bound):
            bound._invalidate()
        state.bound = weakref.WeakSet()
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
    timeline_recording.start_timeline(current, str(file_path), bool(mark_cycles), state.sets.engines())


def stop_timeline() -> None:
    """Stop recording the timeline and close its file (it stays valid JSON)."""
    timeline_recording.stop_timeline(engine(), state.sets.engines())


def _started(current: Engine) -> Engine:
    """Start the engine thread, recording from the first request when HOROVOD_TIMELINE names a file
    (DYNAMIC waits for start_timeline())."""
    path = config.get("HOROVOD_TIMELINE")
    if path and path.upper() != "DYNAMIC":
        timeline_recording.start_timeline(current, path, config.get("HOROVOD_TIMELINE_MARK_CYCLES"))
    return current.start()
