"""The Horovod launcher: ``horovodrun`` (:mod:`horovod.runner.launch`) and the Python API :func:`run`.

Importing this package is cheap: the launcher's modules are imported only when :func:`run` is called.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


class _HorovodArgs:
    """The arguments ``horovodrun`` would have parsed, for :func:`run` (upstream's class of this name)."""

    def __init__(self) -> None:
        self.np = 1
        self.check_build = None
        self.ssh_port = None
        self.ssh_identity_file = None
        self.disable_cache = None
        self.start_timeout = None
        self.nics = None
        self.output_filename = None
        self.verbose = None
        self.command = None
        self.run_func = None
        self.executable = None
        self.config_file = None

        # np for elastic
        self.min_np = None
        self.max_np = None
        self.slots = None
        self.elastic_timeout = None
        self.reset_limit = None
        self.cooldown_range = None

        # Params
        self.fusion_threshold_mb = None
        self.cycle_time_ms = None
        self.cache_capacity = None
        self.hierarchical_allreduce = None
        self.hierarchical_allgather = None
        self.torus_allreduce = None

        # Autotune
        self.autotune = None
        self.autotune_log_file = None
        self.autotune_warmup_samples = None
        self.autotune_steps_per_sample = None
        self.autotune_bayes_opt_max_samples = None
        self.autotune_gaussian_process_noise = None

        # Timeline
        self.timeline_filename = None
        self.timeline_mark_cycles = None

        # Stall check
        self.no_stall_check = None
        self.stall_check_warning_time_seconds = None
        self.stall_check_shutdown_time_seconds = None

        # Library options
        self.mpi_threads_disable = None
        self.num_nccl_streams = None
        self.thread_affinity = None
        self.gloo_timeout_seconds = None
        self.mpi_args = None
        self.tcp_flag = None
        self.binding_args = None

        # Logging
        self.log_level = None
        self.log_with_timestamp = None
        self.prefix_output_with_timestamp = False

        # Hosts
        self.hosts = None
        self.hostfile = None
        self.host_discovery_script = None

        # Controller
        self.use_gloo = None
        self.use_mpi = None
        self.use_jsrun = None


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Optional[Dict[str, Any]] = None,
    num_proc: Optional[int] = None,
    min_num_proc: Optional[int] = None,
    max_num_proc: Optional[int] = None,
    slots: Optional[int] = None,
    reset_limit: Optional[int] = None,
    cooldown_range: Optional[Tuple[int, int]] = None,
    hosts: Optional[str] = None,
    hostfile: Optional[str] = None,
    host_discovery_script: Optional[str] = None,
    start_timeout: Optional[int] = None,
    ssh_port: Optional[int] = None,
    ssh_identity_file: Optional[str] = None,
    disable_cache: Optional[bool] = None,
    output_filename: Optional[str] = None,
    verbose: Optional[bool] = None,
    use_gloo: Optional[bool] = None,
    use_mpi: Optional[bool] = None,
    mpi_args: Optional[str] = None,
    network_interface: Optional[str] = None,
    network_interfaces: Optional[Any] = None,
    executable: Optional[str] = None,
    np: Optional[int] = None,
    min_np: Optional[int] = None,
    max_np: Optional[int] = None,
) -> List[Any]:
    """Run ``func(*args, **kwargs)`` on ``num_proc`` (or ``np``) Horovod ranks and return their results by rank.

    The function is cloudpickled and shipped to each rank through the job's authenticated rendezvous store;
    each rank runs ``python -m horovod.runner.run_task`` (with ``executable``, default this interpreter).
    Without ``hosts``/``hostfile`` all ranks run on this machine.

    Raises ValueError when both ``hosts`` and ``hostfile``, or both ``use_gloo`` and ``use_mpi``, are given;
    RuntimeError naming the rank (with its traceback) when the function raised on a rank; RuntimeError naming
    the first failed rank when a rank died; NotImplementedError for elastic mode (not available yet). With
    ``use_mpi=True`` the ranks are started by ``mpirun`` (see :mod:`horovod.runner.mpi_run`).
    """
    import warnings

    from horovod.runner import launch

    if hosts is not None and hostfile is not None:
        raise ValueError("Argument hosts and hostfile cannot be given together, only one of them.")
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi cannot be given together, only one of them.")
    if num_proc is not None and np is not None and num_proc != np:
        raise ValueError(f"num_proc={num_proc} and np={np} disagree; give only one of them.")
    if min_num_proc is not None and min_np is not None and min_num_proc != min_np:
        raise ValueError(f"min_num_proc={min_num_proc} and min_np={min_np} disagree; give only one of them.")
    if max_num_proc is not None and max_np is not None and max_num_proc != max_np:
        raise ValueError(f"max_num_proc={max_num_proc} and max_np={max_np} disagree; give only one of them.")
    if network_interface is not None:
        warnings.warn("network_interface is deprecated, use network_interfaces instead", DeprecationWarning,
                      stacklevel=2)
        network_interfaces = network_interfaces or network_interface

    kwargs = dict(kwargs or {})
    call_args = tuple(args)

    def wrapped_func():
        return func(*call_args, **kwargs)

    hargs = _HorovodArgs()
    hargs.np = num_proc if num_proc is not None else (np if np is not None else 1)
    hargs.min_np = min_num_proc if min_num_proc is not None else min_np
    hargs.max_np = max_num_proc if max_num_proc is not None else max_np
    hargs.slots = slots
    hargs.reset_limit = reset_limit
    hargs.cooldown_range = cooldown_range
    hargs.hosts = hosts
    hargs.hostfile = hostfile
    hargs.host_discovery_script = host_discovery_script
    hargs.start_timeout = start_timeout
    hargs.ssh_port = ssh_port
    hargs.ssh_identity_file = ssh_identity_file
    hargs.disable_cache = disable_cache
    hargs.output_filename = output_filename
    hargs.verbose = verbose
    hargs.use_gloo = use_gloo
    hargs.use_mpi = use_mpi
    hargs.mpi_args = mpi_args
    hargs.nics = network_interfaces
    hargs.run_func = wrapped_func
    hargs.executable = executable
    return launch._run(hargs)
