"""Process-wide state: ``init``/``shutdown``, who am I, and what this build can do.

``init()`` detects the topology, rendezvouses with the other ranks through the launcher's authenticated store,
connects the peer mesh, chooses the data plane and starts the engine thread. It is idempotent, and a new
``init()`` after ``shutdown()`` builds everything afresh. Without a launcher it gives rank 0 of a job of
size 1.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import List, Optional, Sequence, Union

from horovod.common import config, logging_setup, mpi_context, slurm_rendezvous, topology, wire
from horovod.common.build import (  # noqa: F401  (part of basics' API, as upstream's)
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    mpi_built,
    nccl_built,
    rocm_built,
)
from horovod.common.exceptions import HorovodInternalError, not_initialized
from horovod.core import elastic_join, housekeeping
from horovod.core.controller.fusion import aligned_threshold
from horovod.core.engine import Engine
from horovod.core.engine.observer import EngineObserver
from horovod.core.engine.settings import EngineSettings
from horovod.core.observers import flight_recorder, heartbeat, stall_inspector
from horovod.core.observers import timeline as timeline_recording
from horovod.core.observers import watchdog as _watchdog  # noqa: F401  (watches every engine's data plane)
from horovod.core.observers.autotune import make_autotuner
from horovod.core.observers.tuning import AutotuneObserver
from horovod.core.process_set_table import JobContext, ProcessSetTable, exchange
from horovod.core.process_sets import ProcessSet, global_process_set

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
        self.job: Optional[JobContext] = None
        self.sets = ProcessSetTable()
        # The ProcessSet objects given ids in this init (invalidated at shutdown); weak, as the user owns them.
        self.bound: weakref.WeakSet[ProcessSet] = weakref.WeakSet()


_state = _State()


def init(comm: Optional[object] = None, process_sets: Union[Sequence[ProcessSet], str, None] = None) -> None:
    """Start Horovod in this process (a repeated call is a no-op).

    ``comm`` is an mpi4py communicator (Horovod works on a duplicate of it) or a list of COMM_WORLD ranks, so
    that sub-communicators can run independent Horovod jobs; without it, a process started by ``mpirun`` runs
    on COMM_WORLD and one started by ``horovodrun`` joins its rendezvous. ``process_sets`` registers process sets
    besides the global one (every rank passes the same list; sets made from MPI communicators may differ by
    rank, and the union is registered), or is ``"dynamic"`` to allow ``add_process_set`` later.
    """
    with _state.lock:
        if _state.engine is not None and _state.engine.alive:
            return
        if _state.engine is not None:       # it died (peer lost): clean up before starting again
            shutdown()
        process_sets = _static_sets(process_sets)
        if elastic_join.wanted(comm):
            mpi = None
            topo, generation, (engine, reason, job) = _join_elastic()
        else:
            mpi, topo = _detect(comm)
            logging_setup.configure(topo.rank)
            config.log_inert_knobs()
            generation = _state.generation
            try:
                engine, reason, job = _start(topo, generation, mpi)
            except Exception as exc:
                if mpi is not None:
                    mpi.close()
                # The data plane could not be set up (a peer never connected within HOROVOD_GLOO_TIMEOUT_SECONDS):
                # the error a program catches around collectives, as upstream's Gloo timeout.
                error = HorovodInternalError if isinstance(exc, HorovodInternalError) else ValueError
                raise error(f"Horovod initialization failed on rank {topo.rank} of {topo.size}: {exc}") from exc
        _state.generation = generation + 1
        _state.topo = topo
        _state.engine = engine
        _state.mpi = mpi
        _state.backend_reason = reason
        _state.job = job
        global_process_set.ranks = list(range(topo.size))
        global_process_set.process_set_id = 0
        global_process_set.mpi_comm = mpi.comm if mpi is not None else None
        global_process_set.own_rank = topo.rank
        if not _state.atexit_registered:
            atexit.register(shutdown)
            _state.atexit_registered = True
        _register_static(process_sets)
        flight_recorder.install_signal_handler()        # SIGUSR1: this rank's flight record and stacks
        heartbeat.start(topo.rank, _status)
        log.info("Horovod initialized: rank %d of %d (local %d/%d) on %s, started by %s, data plane: %s",
                 topo.rank, topo.size, topo.local_rank, topo.local_size, topo.hostname,
                 f"MPI ({mpi.library})" if mpi is not None else topo.source, reason)


def _status() -> dict:
    """What this rank's engines are doing, for its heartbeat (see core/observers/heartbeat.py)."""
    current = _state.engine
    return heartbeat.status_lines(([current] if current is not None else []) + _state.sets.engines())


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
        fast_rounds=config.get("HOROVOD_FAST_ROUNDS"),
        flight_recorder_size=config.get("HOROVOD_FLIGHT_RECORDER_SIZE"),
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

    settings, observers = _settings(topo), _observers(topo)
    if topo.size == 1:
        backend = LocalBackend()
        return (_started(Engine(0, 1, backend, {}, settings, on_close=backend.close, observers=observers)),
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

    settings.hosts = mesh.hosts
    engine = _started(Engine(topo.rank, topo.size, backend, mesh.control, settings, on_close=close,
                             observers=observers))
    return engine, reason, _job(topo, key, generation, bind_addr, mpi)


def _job(topo: topology.Topology, key: bytes, generation: int, bind_addr: str,
         mpi: Optional[mpi_context.MPIContext]) -> JobContext:
    """What starting a process set's engine will need to know about this job."""

    def set_observers(ranks: List[int], where: str) -> List[EngineObserver]:
        observers: List[EngineObserver] = flight_recorder.observers()   # every member; the rest: its coordinator
        if topo.rank != ranks[0]:
            return observers
        stall = stall_inspector.observer_from_config(len(ranks), ranks, where)
        observers += [stall] if stall is not None else []
        recording = timeline_recording.recording(_state.engine) if _state.engine is not None else None
        if recording is not None:           # the set's tensors go into the timeline being recorded
            observers.append(timeline_recording.TimelineObserver(recording.timeline, owner=False))
        return observers

    return JobContext(topo, key, generation, bind_addr, mpi, config.get("HOROVOD_START_TIMEOUT"),
                      lambda: _settings(topo), set_observers)


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
    with _state.lock:
        engine, _state.engine = _state.engine, None
        mpi, _state.mpi = _state.mpi, None
        if engine is None:
            return
        heartbeat.stop()
        _state.sets.close()             # the sets' engines first: they may still use the global one's sockets
        _state.job = None
        for bound in list(_state.bound):
            bound._invalidate()
        _state.bound = weakref.WeakSet()
        engine.shutdown()
        timeline_recording.stop_timeline(engine)
        if mpi is not None:
            mpi.close()
        global_process_set.process_set_id = 0
        global_process_set.mpi_comm = None
        global_process_set.own_rank = None


# ------------------------------------------------------------------ process sets (see core/process_set_table.py)


def registered_set(process_set: Optional[ProcessSet]):
    """The registry's entry for ``process_set`` (None for the global set); ValueError, saying what to do, when it is
    not registered (never, or no longer: an id set by hand, or a set removed with hvd.remove_process_set)."""
    if process_set is None or process_set is global_process_set or process_set.process_set_id == 0:
        return None
    set_id = process_set.process_set_id
    if set_id is None:
        raise ValueError(f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or register it "
                         "with hvd.add_process_set() before using it in a collective.")
    registered = _state.sets.get(set_id)
    if registered is None:
        raise ValueError(f"{process_set} is not registered: this job has no process set with id {set_id} (it was "
                         "removed with hvd.remove_process_set, or the id was set by hand); register the set with "
                         "hvd.add_process_set() to use it.")
    return registered


def engine_for(process_set: Optional[ProcessSet]) -> Engine:
    """The engine that runs ``process_set``'s collectives on this rank (the global one for None or the global
    set); ValueError when the set is not registered, or this rank is not one of its members."""
    current = engine()
    registered = registered_set(process_set)
    if registered is None:
        return current
    if registered.engine is None:
        raise ValueError(f"Rank {_state.topo.rank} is not in {registered.describe()}: only its members may run "
                         "collectives on it. Check process_set.included() before calling the collective.")
    return registered.engine


def process_set_ranks(process_set_id: int) -> List[int]:
    """The global ranks of the registered process set with this id; ValueError for an unknown id."""
    topo = _topo()
    if process_set_id == 0:
        return list(range(topo.size))
    registered = _state.sets.get(process_set_id)
    if registered is None:
        raise ValueError(f"There is no process set with id {process_set_id}: it was never registered, or it was "
                         "removed. Registered ids: " + ", ".join(map(str, [0, *_state.sets.ids_and_ranks()])) + ".")
    return list(registered.ranks)


def _process_set_rank(process_set_id: int) -> int:
    """Upstream's private helper: this rank's position in the set, or -1 when it is not a member."""
    ranks = process_set_ranks(process_set_id)
    return ranks.index(rank()) if rank() in ranks else -1


def _process_set_size(process_set_id: int) -> int:
    """Upstream's private helper: the number of ranks in the set."""
    return len(process_set_ranks(process_set_id))


def _get_process_set_ids_and_ranks() -> dict:
    """Upstream's private helper: {process_set_id: ranks} for every registered set, the global one included."""
    return {0: process_set_ranks(0), **_state.sets.ids_and_ranks()}


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a process set after ``init`` and return it with its id (needs HOROVOD_DYNAMIC_PROCESS_SETS=1 or
    ``init(process_sets="dynamic")``). Collective: every rank calls it with the same ranks, in the same order."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None and process_set.mpi_comm is not None:
        raise NotImplementedError(
            "Dynamically adding process sets defined by an MPI communicator is not implemented. "
            "Please build the process set via a list of ranks.")
    with _state.lock:
        current = engine()
        if not config.get("HOROVOD_DYNAMIC_PROCESS_SETS"):
            raise ValueError(
                "Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets after Horovod initialization.")
        ranks = _checked_ranks(process_set.ranks)
        everyone = exchange(current, f"horovod.process_set.add.{_state.generation}.{_state.sets.next_id}", ranks)
        _check_same(everyone, "add_process_set")
        if _existing_id(ranks) is not None:
            raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
        _bind(process_set, _state.sets.add(_state.job, current, ranks).process_set_id)
        return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` and stop its engine; False for the global set or a set that is not registered.
    Collective, as ``add_process_set``. ValueError, naming the set, while collectives are in flight on it."""
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    with _state.lock:
        current = engine()
        if not config.get("HOROVOD_DYNAMIC_PROCESS_SETS"):
            raise ValueError(
                "Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow removing process sets after Horovod initialization.")
        registered = _state.sets.get(set_id)
        if registered is None:
            return False
        housekeeping.settle(set_id)
        mine = registered.engine.in_flight() if registered.engine is not None else []
        everyone = exchange(current, f"horovod.process_set.remove.{_state.generation}.{set_id}", mine)
        busy = {rank: names for rank, names in enumerate(everyone) if names}
        if busy:
            shown = "; ".join(f"rank {r}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
                              for r, names in busy.items())
            raise ValueError(f"Cannot remove {registered.describe()}: collectives are still in flight on it "
                             f"({shown}). Wait for them to complete (synchronize their handles) first.")
        process_set._invalidate()
        _state.sets.remove(set_id)
        return True


def _static_sets(process_sets: Union[Sequence[ProcessSet], str, None]) -> List[ProcessSet]:
    """``init``'s process_sets argument as a list; "dynamic" allows adding sets later, as upstream (which sets
    HOROVOD_DYNAMIC_PROCESS_SETS=1 in the environment)."""
    if process_sets is None:
        return []
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(f"hvd.init(process_sets={process_sets!r}): pass a list of hvd.ProcessSet, or "
                             "'dynamic' to add process sets later with hvd.add_process_set().")
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
        return []
    sets = list(process_sets)
    for ps in sets:
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"hvd.init(process_sets=...) takes hvd.ProcessSet objects, got {ps!r}.")
    return sets


def _register_static(process_sets: List[ProcessSet]) -> None:
    """Register ``init``'s process sets: the union of every rank's, in a deterministic order (sets made from MPI
    communicators can differ by rank: a Split gives each rank its own). As upstream, every rank passes sets or
    none does; without any, nothing is exchanged."""
    if not process_sets:
        return
    mine = [_checked_ranks(_comm_ranks(ps) if ps.ranks is None else ps.ranks) for ps in process_sets]
    everyone = exchange(_state.engine, f"horovod.process_set.init.{_state.generation}", mine)
    for ranks in [r for theirs in everyone for r in theirs]:
        if _existing_id(ranks) is None:
            _state.sets.add(_state.job, _state.engine, ranks)
    seen = {0}
    for index, (ps, ranks) in enumerate(zip(process_sets, mine)):
        set_id = _existing_id(ranks)
        if set_id in seen:
            raise ValueError(f"Horovod could not be initialized because process_sets entry number {index} is a "
                             f"duplicate: {ps}")
        seen.add(set_id)
        _bind(ps, set_id)


def _comm_ranks(process_set: ProcessSet) -> List[int]:
    if _state.mpi is None:
        raise ValueError(f"{process_set} is made from an MPI communicator, but this job does not run on MPI; launch "
                         "it with mpirun or `horovodrun --mpi`, or build the process set from a list of ranks.")
    return _state.mpi.comm_ranks(process_set.mpi_comm)


def _checked_ranks(ranks: Optional[Sequence[int]]) -> List[int]:
    """Sorted, distinct ranks of this job; ValueError saying what is wrong otherwise."""
    size = _state.topo.size
    ranks = sorted(int(r) for r in (ranks or []))
    if not ranks:
        raise ValueError("A process set needs at least one rank.")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"Process set ranks {ranks} contain duplicates; give each rank once.")
    bad = [r for r in ranks if not 0 <= r < size]
    if bad:
        raise ValueError(f"Process set ranks {bad} are not ranks of this job (valid ranks are 0..{size - 1}).")
    return ranks


def _check_same(everyone: List[list], what: str) -> None:
    """Every rank must have asked for the same set; otherwise every rank raises, naming what each asked for."""
    if any(theirs != everyone[0] for theirs in everyone):
        asked = "; ".join(f"rank {r} asked for {theirs}" for r, theirs in enumerate(everyone))
        raise ValueError(f"{what} is collective: every rank must call it with the same ranks, in the same order, "
                         f"but {asked}.")


def _existing_id(ranks: List[int]) -> Optional[int]:
    """The id of the registered set (the global one included) with exactly these ranks."""
    if ranks == list(range(_state.topo.size)):
        return 0
    return _state.sets.id_of(ranks)


def _bind(process_set: ProcessSet, set_id: int) -> None:
    """Give a user's ProcessSet the registered set's id and ranks (a set made from a communicator learns them
    here); it is invalidated at shutdown."""
    process_set.process_set_id = set_id
    process_set.own_rank = _state.topo.rank
    process_set.ranks = list(_state.sets.get(set_id).ranks)
    _state.bound.add(process_set)


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
    timeline_recording.start_timeline(current, str(file_path), bool(mark_cycles), _state.sets.engines())


def stop_timeline() -> None:
    """Stop recording the timeline and close its file (it stays valid JSON)."""
    timeline_recording.stop_timeline(engine(), _state.sets.engines())


def _started(current: Engine) -> Engine:
    """Start the engine thread, recording from the first request when HOROVOD_TIMELINE names a file
    (DYNAMIC waits for start_timeline())."""
    path = config.get("HOROVOD_TIMELINE")
    if path and path.upper() != "DYNAMIC":
        timeline_recording.start_timeline(current, path, config.get("HOROVOD_TIMELINE_MARK_CYCLES"))
    return current.start()


def generation() -> int:
    """Which ``init`` of this process's job is running (changes at every init; in an elastic job, the round)."""
    return _state.generation


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
