"""Every ``HOROVOD_*`` knob, declared once with its type, default and meaning.

Read a knob through :func:`get` (``config.get("HOROVOD_CYCLE_TIME")``); nothing else in the package parses
these variables. Defaults follow upstream Horovod; knobs this project adds are marked ``ours``. Knobs marked
``inert`` are accepted for compatibility but have no effect until their feature lands; :func:`log_inert_knobs`
says so once at DEBUG when one is set. The launcher's flags and config-file keys that set these variables are
declared in :mod:`horovod.common.options`.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Knob:
    """One environment variable: how to parse it and what it defaults to."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    ours: bool = False
    inert: bool = False
    alike: bool = False         # must hold the same value on every rank: checked when the ranks connect


_TRUE = ("1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f", "")


def parse_bool(value: Any) -> bool:
    """The one boolean parser of environment variables, flags and config files.

    Accepts a bool, the integers 0 and 1, and the texts 1/0, true/false, yes/no, on/off, y/n, t/f (any case;
    an empty text is false). Raises ValueError for anything else.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ValueError(f"must be a boolean (true/false, yes/no, on/off or 1/0), got {value!r}")


def _upper(text: str) -> str:
    return text.strip().upper()


def _str(text: str) -> str:
    return text


def _choice(*names: str) -> Callable[[str], str]:
    """A parser accepting one of ``names`` (any case, surrounding spaces ignored)."""
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in names:
            raise ValueError(f"choose one of {', '.join(names)}")
        return value
    return parse


_KNOBS = [
    # Tunables.
    Knob("HOROVOD_FUSION_THRESHOLD", int, 128 * 1024 * 1024, "Tensor Fusion buffer bytes; 0 disables fusion."),
    Knob("HOROVOD_CYCLE_TIME", float, 1.0, "Milliseconds between negotiation cycles while ops keep arriving."),
    Knob("HOROVOD_CACHE_CAPACITY", int, 1024, "Response cache entries; 0 disables the cache.", alike=True),
    Knob("HOROVOD_HIERARCHICAL_ALLREDUCE", parse_bool, False,
         "On several hosts, 1 also makes Adasum hierarchical: sum inside each host, Adasum across hosts "
         "(docs/adasum.md). Sum/Average across hosts are hierarchical (shm in host, tcp or MPI across) unless it "
         "is set to 0, which selects one flat ring over every rank (upstream's default); autotune leaves it "
         "alone.", alike=True),
    Knob("HOROVOD_HIERARCHICAL_CROSS", _choice("leader", "all"), "leader",
         "Which ranks of a host cross hosts in a hierarchical allreduce: leader (the host's local rank 0 "
         "allreduces the host's sum with the other hosts' leaders, then broadcasts it inside the host: one flow "
         "per link) or all (every local rank allreduces its block of the host's sum with the same local rank of "
         "the other hosts, as upstream's hierarchical allreduce: one flow per local rank). Set it alike on every "
         "rank (docs/architecture.md).", ours=True, alike=True),
    Knob("HOROVOD_HIERARCHICAL_ALLGATHER", parse_bool, False,
         "Hierarchical allgather. Accepted, no effect: across hosts the data plane is hierarchical anyway.",
         inert=True),
    Knob("HOROVOD_TORUS_ALLREDUCE", parse_bool, False, "2D torus allreduce (NCCL only). Accepted, no effect.",
         inert=True),
    Knob("HOROVOD_DISABLE_GROUP_FUSION", parse_bool, False, "Fuse each group separately from the others."),
    # Autotune (issue: see and tune).
    Knob("HOROVOD_AUTOTUNE", parse_bool, False, "Bayesian autotuning of fusion threshold and cycle time."),
    Knob("HOROVOD_AUTOTUNE_LOG", _str, "", "CSV log of autotune samples, written by rank 0."),
    Knob("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", int, 3, "Autotune samples discarded at the start."),
    Knob("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", int, 10, "Steps per autotune sample."),
    Knob("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", int, 20, "Maximum Bayesian optimisation samples."),
    Knob("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", float, 0.8, "Gaussian process noise alpha in [0, 1]."),
    # Timeline and stall inspector.
    Knob("HOROVOD_TIMELINE", _str, "", "Timeline file written by rank 0, or DYNAMIC."),
    Knob("HOROVOD_TIMELINE_MARK_CYCLES", parse_bool, False, "Write CYCLE_START markers into the timeline."),
    Knob("HOROVOD_STALL_CHECK_DISABLE", parse_bool, False, "Disable the stall inspector."),
    Knob("HOROVOD_STALL_CHECK_TIME_SECONDS", float, 60.0, "Warn about tensors stalled this long."),
    Knob("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", float, 0.0, "Shut down when stalled this long (0 = never)."),
    # Library options.
    Knob("HOROVOD_MPI_THREADS_DISABLE", parse_bool, False, "Initialise MPI with MPI_THREAD_SINGLE."),
    Knob("HOROVOD_NUM_NCCL_STREAMS", int, 1, "NCCL streams per device. Accepted, no effect (no NCCL data plane).",
         inert=True),
    Knob("HOROVOD_THREAD_AFFINITY", _str, "", "Comma-separated core ids, one per local rank, for the engine thread."),
    Knob("HOROVOD_GLOO_TIMEOUT_SECONDS", float, 30.0,
         "Seconds for the ranks to connect their data-plane sockets to each other at init (and when a process set "
         "is registered), once every rank reached the rendezvous (HOROVOD_START_TIMEOUT bounds that); a peer that "
         "does not connect in time fails init with HorovodInternalError naming it. 0 = HOROVOD_START_TIMEOUT."),
    Knob("HOROVOD_GLOO_IFACE", _str, "", "Network interface for the tcp data plane."),
    Knob("HOROVOD_GLOO_RENDEZVOUS_ADDR", _str, "", "Rendezvous server address (set by horovodrun)."),
    Knob("HOROVOD_GLOO_RENDEZVOUS_PORT", int, 0, "Rendezvous server port (set by horovodrun)."),
    Knob("HOROVOD_CONTROLLER", _upper, "", "MPI or GLOO; GLOO means this project's built-in controller."),
    Knob("HOROVOD_CPU_OPERATIONS", _upper, "", "Data plane for CPU tensors: SHM, TCP, MPI (GLOO = built-in)."),
    Knob("HOROVOD_ELASTIC", parse_bool, False, "Elastic mode."),
    Knob("HOROVOD_DYNAMIC_PROCESS_SETS", parse_bool, False,
         "Allow add_process_set/remove_process_set after init (hvd.init(process_sets='dynamic') sets it)."),
    Knob("HOROVOD_ENABLE_ASYNC_COMPLETION", parse_bool, False, "Complete GPU ops asynchronously. Accepted, no effect.",
         inert=True),
    Knob("HOROVOD_ENABLE_XLA_OPS", parse_bool, False, "TensorFlow XLA ops. Accepted, no effect.", inert=True),
    Knob("HOROVOD_BATCH_D2D_MEMCOPIES", parse_bool, True, "Batched device-to-device copies (GPU). Accepted, no effect.",
         inert=True),
    Knob("HOROVOD_ADASUM_MPI_CHUNK_SIZE", int, 1 << 30, "Adasum MPI chunk bytes. Accepted, no effect.",
         inert=True),
    Knob("HOROVOD_LOG_LEVEL", _upper, "WARNING", "TRACE, DEBUG, INFO, WARNING, ERROR or FATAL."),
    Knob("HOROVOD_LOG_HIDE_TIME", parse_bool, False, "Omit timestamps from log records."),
    Knob("HOROVOD_START_TIMEOUT", float, 30.0, "Seconds for all ranks to start and connect."),
    Knob("HOROVOD_SPARK_START_TIMEOUT", float, 600.0,
         "horovod.spark.run/run_elastic: seconds for the job's Spark tasks to start (start_timeout overrides it)."),
    Knob("HOROVOD_ELASTIC_TIMEOUT", float, 600.0,
         "Elastic: seconds the driver waits for --min-np slots, at the start and at every re-form, before the job "
         "fails (--elastic-timeout overrides it)."),
    # Topology (set by horovodrun).
    Knob("HOROVOD_RANK", int, -1, "Global rank of this process (set by the launcher)."),
    Knob("HOROVOD_SIZE", int, -1, "Number of processes (set by the launcher)."),
    Knob("HOROVOD_LOCAL_RANK", int, -1, "Rank within this host (set by the launcher)."),
    Knob("HOROVOD_LOCAL_SIZE", int, -1, "Processes on this host (set by the launcher)."),
    Knob("HOROVOD_CROSS_RANK", int, -1, "Index of this host among hosts with this local rank (set by the launcher)."),
    Knob("HOROVOD_CROSS_SIZE", int, -1, "Hosts that have this local rank (set by the launcher)."),
    Knob("HOROVOD_HOSTNAME", _str, "", "Host identity used to group local ranks."),
    # Ours.
    Knob("HOROVOD_SHM_CHUNK_BYTES", int, 4 * 1024 * 1024,
         "Bytes per rank per pipeline step of the shared-memory data plane.", ours=True, alike=True),
    Knob("HOROVOD_SHM_CROSS_MEMORY", parse_bool, True,
         "Large broadcasts, and allgathers with a 4-32 MiB output, on one host copy once, straight between the "
         "ranks' buffers (process_vm_readv/writev, used where the kernel allows it), as do blocking broadcasts "
         "from 256 KiB, allgathers from 512 KiB per rank, and allreduces and reducescatters that the slots "
         "cannot take, in fast rounds, and the shm plane's allreduces of one tensor from 4 MiB; 0 keeps them on "
         "the shared-memory slots.",
         ours=True),
    Knob("HOROVOD_HUGE_PAGES", parse_bool, True,
         "A buffer of 4 MiB or more that cross-memory copies read or write a second time has its whole 2 MiB pages "
         "collapsed into huge pages (MADV_COLLAPSE, Linux 6.1+; the contents unchanged), asked again at its "
         "range's 4th, 8th, 16th... use; such copies move huge pages faster. 0 leaves the pages as they are.",
         ours=True),
    Knob("HOROVOD_CUDA_IPC", parse_bool, True,
         "CUDA tensors of a job whose ranks share one host are exchanged between the ranks' GPU memory through "
         "CUDA IPC and reduced on the GPU (docs/gpu.md); 0 stages them through host memory instead. Set it alike "
         "on every rank.", ours=True, alike=True),
    Knob("HOROVOD_CUDA_IPC_WINDOW_BYTES", int, 64 * 1024 * 1024,
         "GPU memory each rank exports to the others for the CUDA IPC plane; larger collectives move through it "
         "in chunks of this size.", ours=True),
    Knob("HOROVOD_TCP_SMALL_BYTES", int, 64 * 1024,
         "Below this size the tcp data plane uses the one-round direct exchange instead of the ring.",
         ours=True, alike=True),
    Knob("HOROVOD_TCP_CHUNK_BYTES", int, 1024 * 1024,
         "Chunk of the tcp data plane's pipelined ring: each chunk goes on to the next rank as soon as it is "
         "reduced; 0 sends each ring step's block whole.", ours=True, alike=True),
    Knob("HOROVOD_TCP_RING_BYTES", int, 1024 * 1024,
         "From this size on the tcp data plane's allreduce uses the pipelined ring; between HOROVOD_TCP_SMALL_BYTES "
         "and this, Rabenseifner's recursive halving and doubling when the rank count is a power of two (>= 4).",
         ours=True, alike=True),
    Knob("HOROVOD_TCP_ALLREDUCE_ALGORITHM",
         _choice("auto", "ring", "direct", "recursive_doubling", "rabenseifner"), "auto",
         "The tcp data plane's allreduce algorithm; auto chooses by size and rank count (docs/architecture.md). "
         "Set it alike on every rank.", ours=True, alike=True),
    Knob("HOROVOD_TCP_BROADCAST_ALGORITHM", _choice("auto", "binomial", "pipeline"), "auto",
         "The tcp data plane's broadcast: a binomial tree, or a pipelined chain from the root in chunks of "
         "HOROVOD_TCP_CHUNK_BYTES; auto chooses by size and rank count. Set it alike on every rank.", ours=True, alike=True),
    Knob("HOROVOD_TF_OVERLAP_BYTES", int, None,
         "TensorFlow, inside tf.function: dense gradients of at least this many bytes start their allreduce alone "
         "as soon as they exist, the smaller ones together (0: each alone, as upstream); unset sends every step's "
         "gradients as one grouped allreduce after the backward pass, which measured faster where every core "
         "computes.", ours=True),
    Knob("HOROVOD_FUSION_BUCKET_BYTES", int, 4 * 1024 * 1024,
         "Ready tensors that no rank is waiting for are held until this many bytes are ready (or the bucket "
         "window passes), so that gradients stream in fused buckets; 0 holds them only for the cycle time.",
         ours=True),
    Knob("HOROVOD_OUTPUT_POOL_BYTES", int, 256 * 1024 * 1024,
         "Bytes of idle memory kept to back the new arrays that collectives return (reused once the program "
         "drops them, instead of faulting fresh pages in at every call); 0 disables the pool.", ours=True),
    Knob("HOROVOD_FUSION_BUCKET_MS", float, 25.0,
         "Longest time a ready tensor that no rank is waiting for is held to fill a bucket.", ours=True),
    Knob("HOROVOD_MPI_REDUCE_MAX_BYTES", int, 1024 * 1024,
         "Under MPI on one host, allreduce and reducescatter up to this size use MPI, larger ones the built-in "
         "shm plane (the measured crossover); -1 = any size, 0 = always shm.", ours=True, alike=True),
    Knob("HOROVOD_MPI_MOVE_MAX_BYTES", int, -1,
         "Under MPI on one host, allgather, broadcast and alltoall up to this size use MPI, larger ones the "
         "built-in shm plane; -1 = any size (the measured best), 0 = always shm.", ours=True, alike=True),
    Knob("HOROVOD_DEADLOCK_CHECK_DISABLE", parse_bool, False,
         "Turn off deadlock detection (the stall inspector's warnings stay; HOROVOD_STALL_CHECK_DISABLE turns "
         "off both).", ours=True),
    Knob("HOROVOD_DEADLOCK_CHECK_TIME_SECONDS", float, 5.0,
         "A deadlock (every rank blocked on a collective the others never submit) is reported once it has held "
         "this long with no new submission; at most HOROVOD_STALL_CHECK_TIME_SECONDS.", ours=True),
    Knob("HOROVOD_DEADLOCK_SHUTDOWN_TIME_SECONDS", float, 5.0,
         "Seconds after a deadlock report until every pending collective fails and the job ends.", ours=True),
    Knob("HOROVOD_DEADLOCK_SHUTDOWN_DISABLE", parse_bool, False,
         "Only report deadlocks, never end the job (for programs that submit collectives from several threads).",
         ours=True),
    Knob("HOROVOD_SECRET_FILE", _str, "",
         "Plain `srun` without horovodrun: the file (in a directory every node sees) where rank 0 writes the job "
         "secret (0600, made with O_EXCL; its address goes to <file>.addr); unset = "
         "~/.horovod/slurm-<job id>.<step id>.key.", ours=True),
    Knob("HOROVOD_FLIGHT_RECORDER_SIZE", int, 2000,
         "Collectives each rank remembers per process set (the flight recorder), written out as JSON on a stall "
         "or deadlock report, an abort or SIGUSR1 (docs/timeline.md); 0 turns the recorder off.", ours=True),
    Knob("HOROVOD_FLIGHT_RECORDER_DIR", _str, "",
         "Folder that every rank writes its flight record into (rank.<rank>.json); horovodrun sets a fresh "
         "./horovod-flight/<date>-<time>-<id> per job when unset.", ours=True),
    Knob("HOROVOD_FAST_ROUNDS", parse_bool, True,
         "Let a small blocking allreduce agree and reduce through shared memory, without the coordinator, when "
         "every rank is on one host and idle (docs/architecture.md); 0 sends every op through the coordinator.",
         ours=True, alike=True),
    Knob("HOROVOD_COORDINATOR_CARRY_BYTES", int, 32 * 1024,
         "A small blocking allreduce, broadcast or allgather that no fast round takes (its ranks span hosts) sends "
         "its input with its request, and rank 0 answers with the result: one round trip, no data-plane steps, "
         "while the result times the ranks less one (what rank 0 sends) stays within this. 0 turns it off; set it "
         "alike on every rank (docs/architecture.md).", ours=True, alike=True),
    Knob("HOROVOD_SPIN_MICROSECONDS", float, 100.0,
         "After activity, the engine polls this long (yielding the GIL) before sleeping, as do the data plane's "
         "receives; 0 never polls. Nothing polls where the job's ranks on one machine (one kernel: network "
         "namespaces and containers count as one) outnumber its cores.",
         ours=True),
    Knob("HOROVOD_MONITOR_PORT", int, None,
         "horovodrun serves a live page of the job on this port (0: a free one) and prints its URL, which carries "
         "a random token (docs/troubleshooting.md); unset: no page. --monitor-port overrides it.", ours=True),
]

KNOBS = {k.name: k for k in _KNOBS}


def _raw(name: str, env: Optional[Mapping[str, str]]) -> Optional[str]:
    if name not in KNOBS:
        raise KeyError(name)
    return (os.environ if env is None else env).get(name)


def get(name: str, env: Optional[Mapping[str, str]] = None) -> Any:
    """Return the typed value of knob ``name`` from ``env`` (the process environment by default), or its default.

    Raises ValueError naming the variable when its value does not parse.
    """
    knob = KNOBS[name]
    raw = _raw(name, env)
    if raw is None or raw == "":
        return knob.default
    try:
        return knob.parse(raw)
    except ValueError as exc:
        raise ValueError(f"Invalid value for {name}={raw!r}: {exc}. {knob.doc}") from None


def is_set(name: str, env: Optional[Mapping[str, str]] = None) -> bool:
    """True when the user set ``name`` explicitly in ``env`` (the process environment by default); autotune
    leaves such knobs alone."""
    return _raw(name, env) not in (None, "")


_inert_logged: Set[str] = set()


def log_inert_knobs(env: Optional[Mapping[str, str]] = None) -> None:
    """Log at DEBUG, once per process and knob, each ``inert`` knob that is set: it is accepted, with no effect."""
    for knob in _KNOBS:
        if knob.inert and knob.name not in _inert_logged and is_set(knob.name, env):
            _inert_logged.add(knob.name)
            log.debug("%s is set; it is accepted for compatibility and has no effect in this release (%s)",
                      knob.name, knob.doc)


# Alike knobs whose being set at all changes what they do (unset: the default behaviour, which no value names).
_SET_MATTERS = frozenset({"HOROVOD_HIERARCHICAL_ALLREDUCE"})


def alike_values(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """What this rank's ``alike`` knobs say, one string each (the parsed value, so that ``1`` and ``true`` are
    the same), for :func:`disagreement` to compare across the ranks."""
    values = {}
    for knob in _KNOBS:
        if knob.alike:
            unset = knob.name in _SET_MATTERS and not is_set(knob.name, env)
            values[knob.name] = "unset" if unset else repr(get(knob.name, env))
    return values


def disagreement(per_rank: Sequence[Optional[Mapping[str, str]]], hosts: Sequence[str] = ()) -> Optional[str]:
    """The error message when the ranks' :func:`alike_values` (``per_rank``, in rank order; None for a rank
    that sent none) differ, else None. Every rank gets the same lists, so every rank reaches the same verdict."""
    sent = [(r, v) for r, v in enumerate(per_rank) if v is not None]
    names = sorted({name for _, v in sent for name in v})
    lines = []
    for name in names:
        by_value: Dict[str, List[int]] = {}
        for r, values in sent:
            by_value.setdefault(values.get(name, "unknown to this version"), []).append(r)
        if len(by_value) > 1:
            sides = "; ".join(f"{_ranks_on(ranks, hosts)} {value}" for value, ranks in by_value.items())
            lines.append(f"{name}: {sides}")
    if not lines:
        return None
    return ("These settings differ between the ranks of this job, and every rank must have the same one: each "
            "chooses how the ranks exchange data, so ranks that choose differently would wait for each other "
            "for ever.\n  " + "\n  ".join(lines) + "\nSet them alike for every rank: horovodrun passes its own "
            "environment to every rank; under mpirun, export each with -x NAME (or set it in every host's "
            "environment).")


def _ranks_on(ranks: List[int], hosts: Sequence[str]) -> str:
    """``rank 1 (host b)`` or ``ranks 0, 2 (hosts a, c)``, for :func:`disagreement`."""
    where = sorted({hosts[r] for r in ranks if r < len(hosts)})
    label = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)
    if where:
        label += f" ({'host' if len(where) == 1 else 'hosts'} {', '.join(where)})"
    return label + " have" if len(ranks) > 1 else label + " has"
