"""``horovodrun``: parse upstream's flags and launch a job (console script ``horovodrun``).

``parse_args`` accepts every upstream flag with the same names, destinations, defaults and mutually exclusive
groups. ``_run`` launches the job with the built-in controller (upstream's Gloo mode, the default) or, with
``--mpi``, through ``mpirun`` (:mod:`horovod.runner.mpi_run`); jsrun and elastic mode are parsed but rejected
with an explanation until they are available.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from typing import Any, List, Optional, Sequence, Set

from .common.util import config_parser, hosts

log = logging.getLogger("horovod.runner")

JSRUN_NOT_AVAILABLE = (
    "jsrun mode (--jsrun, or 'controller: jsrun' in --config-file) is not available yet in this release of "
    "horovod. Use --mpi to launch through mpirun, or no controller flag for the default built-in controller "
    "(it takes the role of Gloo: shared memory inside a host, TCP across hosts)."
)
ELASTIC_NOT_AVAILABLE = (
    "Elastic mode (--min-np or --host-discovery-script) is not available yet in this release of horovod. "
    "Run a fixed-size job with -np N and -H/--hostfile, without --min-np, --max-np and --host-discovery-script."
)


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("horovod")
    except PackageNotFoundError:
        import horovod

        return getattr(horovod, "__version__", "unknown")


# --- argparse actions that remember which flags the user gave (for --config-file's override order) ---------

def make_override_action(override_args: Set[str], explicit: Set[str]):
    class StoreOverrideAction(argparse.Action):
        def __init__(self, option_strings, dest, default=None, type=None, choices=None, required=False,
                     help=None, metavar=None):
            super().__init__(option_strings=option_strings, dest=dest, nargs=None, default=default, type=type,
                             choices=choices, required=required, help=help, metavar=metavar)

        def __call__(self, parser, args, values, option_string=None):
            override_args.add(self.dest)
            explicit.add(self.dest)
            setattr(args, self.dest, values)

    return StoreOverrideAction


def make_override_bool_action(override_args: Set[str], explicit: Set[str], bool_value: bool,
                              deprecated_for: Optional[str] = None):
    class StoreOverrideBoolAction(argparse.Action):
        def __init__(self, option_strings, dest, required=False, help=None):
            super().__init__(option_strings=option_strings, dest=dest, const=bool_value, nargs=0, default=None,
                             required=required, help=help)

        def __call__(self, parser, args, values, option_string=None):
            if deprecated_for:
                warnings.warn(f"Argument {option_string} has been replaced by {deprecated_for}",
                              DeprecationWarning, stacklevel=2)
            override_args.add(self.dest)
            explicit.add(self.dest)
            setattr(args, self.dest, self.const)

    return StoreOverrideBoolAction


def make_override_true_action(override_args: Set[str], explicit: Set[str]):
    return make_override_bool_action(override_args, explicit, True)


def make_override_false_action(override_args: Set[str], explicit: Set[str]):
    return make_override_bool_action(override_args, explicit, False)


def make_config_file_action(override_args: Set[str]):
    """``--config-file``: flags given before it are overridden by the file, flags after it win."""

    class ConfigFileAction(argparse.Action):
        def __call__(self, parser, args, values, option_string=None):
            override_args.clear()
            setattr(args, self.dest, values)

    return ConfigFileAction


def make_check_build_action(np_arg: argparse.Action):
    class CheckBuildAction(argparse.Action):
        def __call__(self, parser, args, values, option_string=None):
            np_arg.required = False  # -np is optional with -cb
            args.check_build = True

    return CheckBuildAction


def make_nics_append_action():
    class NicsAppendAction(argparse.Action):
        """Deprecated repeatable ``--network-interface``: appends to ``--network-interfaces``."""

        def __call__(self, parser, args, values, option_string=None):
            warnings.warn("--network-interface is deprecated, use --network-interfaces", DeprecationWarning,
                          stacklevel=2)
            current = getattr(args, self.dest, None)
            setattr(args, self.dest, f"{current},{values}" if current else values)

    return NicsAppendAction


def _nonneg_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def make_parser(override_args: Set[str], explicit: Set[str]) -> argparse.ArgumentParser:
    """The ``horovodrun`` argument parser (upstream's flags, groups and defaults)."""
    override = make_override_action(override_args, explicit)
    true_action = make_override_true_action(override_args, explicit)
    false_action = make_override_false_action(override_args, explicit)

    parser = argparse.ArgumentParser(description="Horovod Runner", prog="horovodrun")
    parser.add_argument("-v", "--version", action="version", version=_version(),
                        help="Shows Horovod version.")
    np_arg = parser.add_argument("-np", "--num-proc", action="store", dest="np", type=int, required=True,
                                 help="Total number of training processes. In elastic mode, number of processes "
                                      "required before training can start.")
    parser.add_argument("-cb", "--check-build", action=make_check_build_action(np_arg), nargs=0, default=False,
                        help="Shows which frameworks and libraries are available to Horovod.")
    parser.add_argument("--disable-cache", action="store_true", dest="disable_cache",
                        help="Accepted for compatibility. The launcher's checks are not cached: ssh is checked "
                             "on every launch.")
    parser.add_argument("--start-timeout", action="store", dest="start_timeout", type=int,
                        help="Horovodrun has to perform all the checks and start the processes before the "
                             "specified timeout. The default value is 30 seconds. Alternatively, the environment "
                             "variable HOROVOD_START_TIMEOUT can also be used to specify the initialization "
                             "timeout.")
    parser.add_argument("--network-interfaces", action="store", dest="nics",
                        help="Network interfaces that can be used for communication separated by comma. If not "
                             "specified, the launcher uses the interface that routes to the remote hosts. "
                             'Example: --network-interfaces "eth0,eth1".')
    parser.add_argument("--network-interface", action=make_nics_append_action(), dest="nics",
                        help=argparse.SUPPRESS)
    parser.add_argument("--output-filename", action="store",
                        help="Writes stdout / stderr of all processes to <output_filename>/rank.<rank>/"
                             "<stdout | stderr> (also shown on the console). The <rank> is padded with 0 "
                             "characters to ensure lexicographical order.")
    parser.add_argument("--verbose", action="store_true",
                        help="If this flag is set, extra messages will be printed (the per-rank commands).")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="Command to be executed.")
    parser.add_argument("--config-file", action=make_config_file_action(override_args), dest="config_file",
                        help="Path to YAML file containing runtime parameter configuration for Horovod. Note "
                             "that this will override any command line arguments provided before this "
                             "argument, and will be overridden by any arguments that come after it.")

    group_ssh = parser.add_argument_group("SSH arguments")
    group_ssh.add_argument("-p", "--ssh-port", action="store", dest="ssh_port", type=int,
                           help="SSH port on all the hosts.")
    group_ssh.add_argument("-i", "--ssh-identity-file", action="store", dest="ssh_identity_file",
                           help="File on the driver from which the identity (private key) is read.")

    group_params = parser.add_argument_group("tuneable parameter arguments")
    group_params.add_argument("--fusion-threshold-mb", action=override, type=int,
                              help="Fusion buffer threshold in MB. This is the maximum amount of tensor data "
                                   "that can be fused together into a single batch during allreduce / "
                                   "allgather. Setting 0 disables tensor fusion. (default: 128)")
    group_params.add_argument("--cycle-time-ms", action=override, type=float,
                              help="Cycle time in ms. This is the delay between each tensor fusion cycle. The "
                                   "larger the cycle time, the more batching, but the greater latency between "
                                   "each allreduce / allgather operations. (default: 1)")
    group_params.add_argument("--cache-capacity", action=override, type=int,
                              help="Maximum number of tensor names that will be cached to reduce amount of "
                                   "coordination required between workers before performing allreduce / "
                                   "allgather. Setting 0 disables caching. (default: 1024)")
    for name, help_on in (
        ("hierarchical-allreduce", "Perform hierarchical allreduce between workers instead of ring allreduce. "
                                   "Hierarchical allreduce performs a local allreduce / gather within a host, "
                                   "then a parallel cross allreduce between equal local ranks across workers, "
                                   "and finally a local gather."),
        ("hierarchical-allgather", "Perform hierarchical allgather between workers instead of ring allgather. "
                                   "See hierarchical allreduce for algorithm details."),
        ("torus-allreduce", "Perform 2D NCCL torus allreduce between workers instead of ring allreduce. Torus "
                            "allreduce performs a local reduce-scatter within a host, then a parallel cross "
                            "allreduce, and finally a local allgather."),
    ):
        group = group_params.add_mutually_exclusive_group()
        dest = name.replace("-", "_")
        group.add_argument(f"--{name}", action=true_action, dest=dest, help=help_on)
        group.add_argument(f"--no-{name}", dest=dest, action=false_action,
                           help=f"Explicitly disable {name.replace('-', ' ')} to prevent autotuning from "
                                "adjusting it.")

    group_autotune = parser.add_argument_group("autotune arguments")
    group_autotune_enabled = group_autotune.add_mutually_exclusive_group()
    group_autotune_enabled.add_argument("--autotune", action=true_action,
                                        help="Perform autotuning to select parameter argument values that "
                                             "maximize throughput for allreduce / allgather. Any parameter "
                                             "explicitly set will be held constant during tuning.")
    group_autotune_enabled.add_argument("--no-autotune", dest="autotune", action=false_action,
                                        help=argparse.SUPPRESS)
    group_autotune.add_argument("--autotune-log-file", action=override,
                                help="Comma-separated log of trials containing each hyperparameter and the score "
                                     "of the trial. The last row will always contain the best value found.")
    group_autotune.add_argument("--autotune-warmup-samples", action=override, type=int, default=3,
                                help="Number of samples to discard before beginning the optimization process "
                                     "during autotuning. (default: %(default)s)")
    group_autotune.add_argument("--autotune-steps-per-sample", action=override, type=int, default=10,
                                help="Number of steps (approximate) to record before observing a sample. "
                                     "(default: %(default)s)")
    group_autotune.add_argument("--autotune-bayes-opt-max-samples", action=override, type=int, default=20,
                                help="Maximum number of samples to collect for each Bayesian optimization "
                                     "process. (default: %(default)s)")
    group_autotune.add_argument("--autotune-gaussian-process-noise", action=override, type=float, default=0.8,
                                help="Regularization value [0, 1] applied to account for noise in samples. "
                                     "(default: %(default)s)")

    group_elastic = parser.add_argument_group("elastic arguments (elastic mode is not available yet)")
    group_elastic.add_argument("--min-np", "--min-num-proc", action="store", dest="min_np", type=int,
                               help="Minimum number of processes running for training to continue. Defaults to "
                                    "--num-proc.")
    group_elastic.add_argument("--max-np", "--max-num-proc", action="store", dest="max_np", type=int,
                               help="Maximum number of training processes, beyond which no additional processes "
                                    "will be created. If not specified, then will be unbounded.")
    group_elastic.add_argument("--slots-per-host", action="store", dest="slots", type=int,
                               help="Number of slots for processes per host. Normally 1 slot per GPU per host.")
    group_elastic.add_argument("--elastic-timeout", action="store", dest="elastic_timeout", type=int,
                               help="Timeout for elastic initialisation after re-scaling the cluster. The "
                                    "default value is 600 seconds. Alternatively, the environment variable "
                                    "HOROVOD_ELASTIC_TIMEOUT can also be used.")
    group_elastic.add_argument("--reset-limit", action="store", dest="reset_limit", type=int,
                               help="Maximum number of times that the training job can scale up or down the "
                                    "number of workers after which the job is terminated. (default: None)")
    group_elastic.add_argument("--blacklist-cooldown-range", action="store", dest="cooldown_range", type=int,
                               nargs=2,
                               help="Range of seconds (min, max) a failing host will remain in blacklist. "
                                    "(default: None)")

    group_timeline = parser.add_argument_group("timeline arguments")
    group_timeline.add_argument("--timeline-filename", action=override,
                                help="JSON file containing timeline of Horovod events used for debugging "
                                     "performance. If this is provided, timeline events will be recorded, which "
                                     "can have a negative impact on training performance.")
    group_timeline_cycles = group_timeline.add_mutually_exclusive_group()
    group_timeline_cycles.add_argument("--timeline-mark-cycles", action=true_action,
                                       help="Mark cycles on the timeline. Only enabled if the timeline filename "
                                            "is provided.")
    group_timeline_cycles.add_argument("--no-timeline-mark-cycles", dest="timeline_mark_cycles",
                                       action=false_action, help=argparse.SUPPRESS)

    group_stall_check = parser.add_argument_group("stall check arguments")
    group_stall_check_enabled = group_stall_check.add_mutually_exclusive_group()
    group_stall_check_enabled.add_argument("--no-stall-check", action=true_action,
                                           help="Disable the stall check. The stall check will log a warning "
                                                "when workers have stalled waiting for other ranks to submit "
                                                "tensors.")
    group_stall_check_enabled.add_argument("--stall-check", dest="no_stall_check", action=false_action,
                                           help=argparse.SUPPRESS)
    group_stall_check.add_argument("--stall-check-warning-time-seconds", action=override, type=int, default=60,
                                   help="Seconds until the stall warning is logged to stderr. "
                                        "(default: %(default)s)")
    group_stall_check.add_argument("--stall-check-shutdown-time-seconds", action=override, type=int, default=0,
                                   help="Seconds until Horovod is shutdown due to stall. Shutdown will only take "
                                        "place if this value is greater than the warning time. "
                                        "(default: %(default)s)")

    group_library_options = parser.add_argument_group("library arguments")
    group_mpi_threads_disable = group_library_options.add_mutually_exclusive_group()
    group_mpi_threads_disable.add_argument("--mpi-threads-disable", action=true_action,
                                           help="Disable MPI threading support. Only applies when running in "
                                                "MPI mode.")
    group_mpi_threads_disable.add_argument("--no-mpi-threads-disable", dest="mpi_threads_disable",
                                           action=false_action, help=argparse.SUPPRESS)
    group_library_options.add_argument("--mpi-args", action="store", dest="mpi_args",
                                       help="Extra MPI arguments to pass to mpirun. They need to be passed with "
                                            'the equal sign to avoid parsing issues. e.g. --mpi-args="--map-by '
                                            'ppr:6:node"')
    group_library_options.add_argument("--tcp", action="store_true", dest="tcp_flag",
                                       help="If this flag is set, only TCP is used for communication "
                                            "(sets NCCL_IB_DISABLE=1).")
    group_library_options.add_argument("--binding-args", action="store", dest="binding_args",
                                       help="Process binding arguments (MPI mode). e.g. "
                                            '--binding-args="--rankfile myrankfile"')
    group_library_options.add_argument("--num-nccl-streams", action=override, type=int, default=1,
                                       help="Number of NCCL streams. Only applies when running with NCCL "
                                            "support. (default: %(default)s)")
    group_library_options.add_argument("--thread-affinity", action=override, type=str,
                                       help="Horovod background thread affinity: a core id, or a comma-separated "
                                            "list of core ids, one per local rank.")
    group_library_options.add_argument("--gloo-timeout-seconds", action=override, type=int, default=30,
                                       help="Timeout in seconds for rendezvous and connections to complete. "
                                            "(default: %(default)s)")

    group_logging = parser.add_argument_group("logging arguments")
    group_logging.add_argument("--log-level", action=override, choices=config_parser.LOG_LEVELS,
                               help="Minimum level to log to stderr from the Horovod backend. (default: WARNING).")
    group_logging_timestamp = group_logging.add_mutually_exclusive_group()
    group_logging_timestamp.add_argument("--log-without-timestamp", dest="log_with_timestamp",
                                         action=false_action,
                                         help="Hide the timestamp from Horovod internal log messages.")
    group_logging_timestamp.add_argument("--log-with-timestamp", dest="log_with_timestamp", action=true_action,
                                         help=argparse.SUPPRESS)
    group_logging_timestamp.add_argument("--log-hide-timestamp", dest="log_with_timestamp",
                                         action=make_override_bool_action(override_args, explicit, False,
                                                                          "--log-without-timestamp"),
                                         help=argparse.SUPPRESS)
    group_logging_timestamp.add_argument("--no-log-hide-timestamp", dest="log_with_timestamp",
                                         action=make_override_bool_action(override_args, explicit, True,
                                                                          "--log-with-timestamp"),
                                         help=argparse.SUPPRESS)
    group_logging.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", action="store_true",
                               help="Timestamp each line of output to stdout and stderr.")

    group_hosts_parent = parser.add_argument_group("host arguments")
    group_hosts = group_hosts_parent.add_mutually_exclusive_group()
    group_hosts.add_argument("-H", "--hosts", action="store", dest="hosts",
                             help="List of host names and the number of available slots for running processes "
                                  "on each, of the form: <hostname>:<slots> (e.g.: host1:2,host2:4,host3:1 "
                                  "indicating 2 processes can run on host1, 4 on host2, and 1 on host3). If not "
                                  "specified, defaults to using localhost:<np>")
    group_hosts.add_argument("-hostfile", "--hostfile", action="store", dest="hostfile",
                             help="Path to a host file containing the list of host names and the number of "
                                  "available slots. Each line of the file must be of the form: "
                                  "<hostname> slots=<slots>")
    group_hosts.add_argument("--host-discovery-script", action=override,
                             help="Used for elastic training (not available yet): an executable script that "
                                  "prints every available host, one per line, optionally as <host>:<slots>.")

    group_controller_parent = parser.add_argument_group("controller arguments")
    group_controller = group_controller_parent.add_mutually_exclusive_group()
    group_controller.add_argument("--gloo", action="store_true", dest="use_gloo",
                                  help="Run Horovod using the built-in controller, which takes the role of "
                                       "upstream's Gloo controller (the default).")
    group_controller.add_argument("--mpi", action="store_true", dest="use_mpi",
                                  help="Launch the ranks with mpirun (Open MPI, MPICH, Intel MPI or Spectrum "
                                       "MPI; `pip install horovod[mpi]` brings Open MPI and mpi4py).")
    group_controller.add_argument("--jsrun", action="store_true", dest="use_jsrun",
                                  help="Launch Horovod processes with jsrun and use the MPI controller "
                                       "(not available yet).")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse ``horovodrun``'s command line (``sys.argv[1:]`` by default), apply ``--config-file``, validate.

    Exits with a usage error for invalid values; ``-cb`` prints the build table and exits 0.
    """
    override_args: Set[str] = set()
    explicit: Set[str] = set()
    parser = make_parser(override_args, explicit)
    args = parser.parse_args(argv)

    try:
        if args.config_file:
            config = config_parser.load_config_file(args.config_file)
            explicit |= config_parser.set_args_from_config(args, config, override_args,
                                                           source=args.config_file)
        config_parser.validate_config_args(args)
    except ValueError as exc:
        parser.error(str(exc))

    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    args.run_func = None
    args.executable = None
    args.explicit_args = explicit  # flags set on the command line or in the config file

    if args.check_build:
        check_build(args.verbose)
    return args


def check_build(verbose: bool = False) -> None:
    """Print which frameworks, controllers and tensor operations are available, then exit 0."""
    from . import build_info

    info = build_info.detect()
    print(build_info.format_build(_version(), info, verbose))
    print()
    print(build_info.format_data_planes(info))
    sys.exit(0)


def _is_elastic(args: Any) -> bool:
    return getattr(args, "host_discovery_script", None) is not None or getattr(args, "min_np", None) is not None


def _normalize_nics(nics: Any) -> Optional[List[str]]:
    if not nics:
        return None
    if isinstance(nics, str):
        items = nics.split(",")
    elif isinstance(nics, (set, frozenset)):
        items = sorted(nics)
    else:
        items = list(nics)
    items = [n.strip() for n in items if n and n.strip()]
    return items or None


def _run(args: Any) -> Optional[List[Any]]:
    """Run the job described by ``args`` (from parse_args or horovod.run).

    Returns the per-rank results for ``horovod.run`` (``args.run_func`` set), else None. Raises
    NotImplementedError for jsrun and elastic mode, ValueError for bad hosts or counts, and
    :class:`horovod.runner.process.JobFailedError` when a rank fails.
    """
    if getattr(args, "use_jsrun", None):
        raise NotImplementedError(JSRUN_NOT_AVAILABLE)

    if not getattr(args, "hosts", None) and not getattr(args, "host_discovery_script", None):
        if getattr(args, "hostfile", None):
            args.hosts = hosts.parse_host_files(args.hostfile)
        else:
            args.hosts = f"localhost:{args.np}"

    args.nics = _normalize_nics(getattr(args, "nics", None))

    if _is_elastic(args):
        return _run_elastic(args)
    if getattr(args, "max_np", None) is not None:
        log.warning("--max-np only applies to elastic mode (with --min-np or --host-discovery-script); "
                    "ignoring it")
    return _run_static(args)


def _run_elastic(args: Any) -> Optional[List[Any]]:
    """Elastic mode is parsed but not available yet in this release."""
    raise NotImplementedError(ELASTIC_NOT_AVAILABLE)


def _worker_base_env(args: Any) -> dict:
    """The launcher's environment with the flags' tunables applied.

    A flag that has a default and that the user did not give does not replace a value the user exported.
    """
    env = os.environ.copy()
    config_parser.set_env_from_args(env, args)
    explicit = getattr(args, "explicit_args", set())
    for dest, var in config_parser.DEFAULTED_ARGS.items():
        if dest not in explicit and os.environ.get(var):
            env[var] = os.environ[var]
    return env


def _run_static(args: Any) -> Optional[List[Any]]:
    from horovod.common import config

    from . import gloo_run, run_func
    from .common.util import network
    from .common.util.settings import Settings
    from .process import JobFailedError
    from .rendezvous import RendezvousServer

    np = args.np
    if np is None or np < 1:
        raise ValueError(f"The number of processes (-np) must be at least 1, got {np}.")
    command = list(args.command or [])
    if not args.run_func and not command:
        raise ValueError("No command to run was given, e.g. `horovodrun -np 2 python train.py`.")

    start_timeout = args.start_timeout or config.get("HOROVOD_START_TIMEOUT")
    settings = Settings(
        num_proc=np, hosts=args.hosts, verbose=2 if getattr(args, "verbose", None) else 0,
        ssh_port=getattr(args, "ssh_port", None), ssh_identity_file=getattr(args, "ssh_identity_file", None),
        extra_mpi_args=getattr(args, "mpi_args", None), tcp_flag=bool(getattr(args, "tcp_flag", False)),
        binding_args=getattr(args, "binding_args", None), start_timeout=float(start_timeout),
        output_filename=getattr(args, "output_filename", None), run_func=args.run_func is not None,
        nics=args.nics, prefix_output_with_timestamp=bool(getattr(args, "prefix_output_with_timestamp", False)),
    )
    plan = gloo_run.host_alloc_plan(settings)  # validates hosts and slots before anything starts
    host_names = list(dict.fromkeys(slot.hostname for slot in plan))
    remote_hosts = network.filter_local_addresses(host_names)
    if remote_hosts:
        from . import ssh

        log.info("Checking ssh on all remote hosts: %s", ", ".join(remote_hosts))
        ssh.check_all_hosts_ssh(remote_hosts, settings.ssh_port, settings.ssh_identity_file,
                                timeout=settings.start_timeout)
        rendezvous_addr = network.get_driver_ip(settings.nics, remote_hosts)
    else:
        rendezvous_addr = "127.0.0.1"

    env = _worker_base_env(args)
    use_mpi = bool(getattr(args, "use_mpi", None))
    if use_mpi and args.run_func is None:
        from . import mpi_run

        mpi_run.mpi_run(settings, settings.nics, env, command)
        return None

    rendezvous = RendezvousServer(settings.verbose)
    rendezvous.start()
    try:
        if args.run_func is None:
            gloo_run.launch_gloo(command, settings, env, rendezvous, rendezvous_addr)
            return None

        rendezvous.store.put(run_func.FUNC_SCOPE, run_func.FUNC_KEY, run_func.encode_function(args.run_func))
        executable = args.executable or sys.executable
        command = [executable, "-m", "horovod.runner.run_task", rendezvous_addr, str(rendezvous.port)]
        src_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if os.path.basename(src_dir) not in ("site-packages", "dist-packages"):
            # horovod runs from a source tree: make sure the ranks import this same copy.
            env["PYTHONPATH"] = os.pathsep.join(p for p in (src_dir, env.get("PYTHONPATH")) if p)
        try:
            if use_mpi:
                _launch_run_func_mpi(settings, env, command, rendezvous)
            else:
                gloo_run.launch_gloo(command, settings, env, rendezvous, rendezvous_addr)
        except JobFailedError as exc:
            error = run_func.failure_for_rank(rendezvous.store, exc.failure.rank, exc.failure.hostname)
            if error is not None:
                raise error from error.__cause__
            raise
        return run_func.collect_results(rendezvous.store, np)
    finally:
        rendezvous.stop()


def _launch_run_func_mpi(settings: Any, env: dict, command: List[str], rendezvous: Any) -> None:
    """``horovod.run(..., use_mpi=True)``: the ranks run ``run_task`` under mpirun and report to the store.

    They need the job secret to reach the store: it is exported to them by name (``-x _HOROVOD_SECRET_KEY``),
    its value travelling only in mpirun's environment.
    """
    import subprocess

    from horovod.common.wire import SECRET_ENV

    from . import mpi_run, run_func

    env[SECRET_ENV] = rendezvous.secret
    try:
        mpi_run.mpi_run(settings, settings.nics, env, command, export_secret=True, stdin=subprocess.DEVNULL)
    except mpi_run.MpirunError:
        # mpirun named no rank: report the first rank that stored an exception, if any did.
        for rank in range(settings.num_proc):
            error = run_func.failure_for_rank(rendezvous.store, rank, None)
            if error is not None:
                raise error from error.__cause__
        raise


def _configure_logging(verbose: bool) -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[horovodrun] %(levelname)s: %(message)s"))
        root.addHandler(handler)
    logging.getLogger("horovod.runner").setLevel(logging.INFO if verbose else logging.WARNING)


def run_commandline(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point of ``horovodrun`` and ``python -m horovod.runner``; exits with the job's status."""
    from .mpi_run import MpirunError
    from .process import JobFailedError, JobInterruptedError, WorkerStartError

    args = parse_args(argv)
    _configure_logging(bool(args.verbose))
    try:
        _run(args)
    except (JobFailedError, JobInterruptedError, MpirunError) as exc:
        log.error("%s", exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        log.error("Interrupted (SIGINT): all ranks were stopped.")
        sys.exit(130)
    except (NotImplementedError, ValueError, WorkerStartError, RuntimeError, OSError) as exc:
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    run_commandline()
