"""Every launcher option, declared once: its flags, config-file key, environment variable, type, default and help.

One row of :data:`OPTIONS` is one destination on ``horovodrun``'s parsed arguments. From this table come
``horovodrun``'s argparse flags (:mod:`horovod.runner.common.util.arguments`), the keywords of ``horovod.run``
(``horovod.runner._HorovodArgs``), the ``--config-file`` mapping and the ``HOROVOD_*`` variables the launcher
exports (:mod:`horovod.runner.common.util.config_parser`). An option that exports a variable names its knob in
:mod:`horovod.common.config`, which holds the variable's type, default and meaning; a flag with a default takes
it from that knob. Help texts are upstream's, so ``horovodrun --help`` reads as upstream's.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Tuple

from horovod.common import config

# How an option is set on the command line (``Option.kind``).
STORE = "store"            # a value flag
TUNABLE = "tunable"        # a value flag that --config-file's override order tracks
SWITCH = "switch"          # boolean flags (Option.switches) in one mutually exclusive group, tracked like TUNABLE
STORE_TRUE = "store_true"  # a plain on-flag
VERSION = "version"        # -v/--version
CHECK_BUILD = "check_build"  # -cb: prints the build table, makes -np optional
NICS_APPEND = "nics_append"  # deprecated repeatable --network-interface
CONFIG_FILE = "config_file"  # --config-file: the file overrides the flags before it
COMMAND = "command"        # the positional command line
JOB_FILE = "job_file"      # --job: a path that makes -np optional (the job file gives the count)

LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"]

GENERAL, SSH, PARAMS, AUTOTUNE, ELASTIC = (
    "", "SSH arguments", "tuneable parameter arguments", "autotune arguments",
    "elastic arguments")
TIMELINE, STALL_CHECK, LIBRARY, LOGGING, HOSTS, CONTROLLER = (
    "timeline arguments", "stall check arguments", "library arguments", "logging arguments", "host arguments",
    "controller arguments")
MONITOR = "live page arguments"


@dataclasses.dataclass(frozen=True)
class Switch:
    """One flag of a boolean option: its spellings and the value it stores (``help=None`` hides it)."""

    names: Tuple[str, ...]
    value: bool
    help: Optional[str] = None
    deprecated_for: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Option:
    """One destination of ``horovodrun``'s arguments and everything that sets or reads it.

    ``env`` names the ``HOROVOD_*`` knob it exports (``env_value`` makes the text, ``env_only_with`` names the
    destination that must be truthy for it to be exported); ``file_key`` is its ``section.key`` in a config file
    (``file_negated``: the file's value is the opposite of the destination; ``file_missing``: the value a present
    section without the key stands for); ``keyword`` is the ``horovod.run`` keyword that sets it and
    ``run_default`` its value there when not given; ``defaulted`` flags take their default from the knob.
    """

    dest: str
    group: str
    names: Tuple[str, ...] = ()
    help: Optional[str] = None
    kind: str = STORE
    type: Optional[Callable[[str], Any]] = None
    defaulted: bool = False
    required: bool = False
    choices: Optional[Tuple[str, ...]] = None
    nargs: Optional[int] = None
    switches: Tuple[Switch, ...] = ()
    exclusive: bool = False
    env: Optional[str] = None
    env_value: Callable[[Any], str] = str
    env_only_with: Optional[str] = None
    file_key: Optional[str] = None
    file_negated: bool = False
    file_missing: Any = None
    bounds: Optional[Tuple[float, Optional[float]]] = None
    check: Optional[Callable[[Any], None]] = None
    keyword: Optional[str] = None
    run_default: Any = None

    @property
    def default(self) -> Any:
        """The flag's default: the knob's default in the flag's type for ``defaulted`` options, else None."""
        if not self.defaulted:
            return None
        value = config.KNOBS[self.env].default
        return self.type(value) if self.type else value

    @property
    def inert(self) -> bool:
        """True when the knob this option exports is accepted but has no effect yet."""
        return self.env is not None and config.KNOBS[self.env].inert

    def help_text(self, text: Optional[str] = None) -> Optional[str]:
        """The help of this option (or of one of its switches, ``text``), with the "accepted, no effect" note
        of an inert knob appended; None for a hidden flag."""
        text = self.help if text is None and not self.switches else text
        if text is None or not self.inert:
            return text
        return f"{text} {INERT_NOTE}"


INERT_NOTE = "Accepted, no effect in this release."


def one_zero(value: Any) -> str:
    """A boolean option's variable text: ``1`` or ``0``."""
    return "1" if value else "0"


def zero_one(value: Any) -> str:
    """The variable text of a boolean option that the variable negates."""
    return "0" if value else "1"


def mb_to_bytes(value: Any) -> str:
    """``--fusion-threshold-mb``'s variable is in bytes."""
    return str(int(value * 1024 * 1024))


def check_thread_affinity(value: Any) -> None:
    """A core id or a comma-separated list of core ids, one per local rank."""
    if not all(item.strip().isdigit() for item in str(value).split(",")):
        raise ValueError(f"thread_affinity={value!r} must be a core id or a comma-separated list of core ids, "
                         "one per local rank (e.g. 0,2,4,6)")


def _tunable_switch(name: str, help: str, section: str) -> Option:
    """``--name`` / ``--no-name`` for a tunable boolean, exported as ``HOROVOD_NAME`` = 1/0."""
    dest = name.replace("-", "_")
    return Option(dest, PARAMS, kind=SWITCH, switches=(
        Switch((f"--{name}",), True, help),
        Switch((f"--no-{name}",), False, f"Explicitly disable {name.replace('-', ' ')} to prevent autotuning "
                                         "from adjusting it."),
    ), env=f"HOROVOD_{dest.upper()}", env_value=one_zero, file_key=f"{section}.{dest}")


def _hidden_negation(dest: str, group: str, on: str, help: str, env: str, file_key: str, **more: Any) -> Option:
    """A boolean option whose ``--no-`` (or opposite) flag is accepted but hidden from ``--help``."""
    off = more.pop("off", "--no-" + on[2:])
    return Option(dest, group, kind=SWITCH, switches=(Switch((on,), True, help), Switch((off,), False)),
                  env=env, env_value=one_zero, file_key=file_key, **more)


_GENERAL = [
    Option("version", GENERAL, ("-v", "--version"), "Shows Horovod version.", kind=VERSION),
    Option("np", GENERAL, ("-np", "--num-proc"), "Total number of training processes. In elastic mode, number of "
           "processes required before training can start.", type=int, required=True, keyword="np", run_default=1),
    Option("check_build", GENERAL, ("-cb", "--check-build"),
           "Shows which frameworks and libraries are available to Horovod.", kind=CHECK_BUILD),
    Option("disable_cache", GENERAL, ("--disable-cache",), "Accepted for compatibility. The launcher's checks are "
           "not cached: ssh is checked on every launch.", kind=STORE_TRUE, keyword="disable_cache"),
    Option("start_timeout", GENERAL, ("--start-timeout",), "Horovodrun has to perform all the checks and start the "
           "processes before the specified timeout. The default value is 30 seconds. Alternatively, the "
           "environment variable HOROVOD_START_TIMEOUT can also be used to specify the initialization timeout.",
           type=int, keyword="start_timeout"),
    Option("nics", GENERAL, ("--network-interfaces",), "Network interfaces that can be used for communication "
           "separated by comma. If not specified, the launcher uses the interface that routes to the remote "
           'hosts. Example: --network-interfaces "eth0,eth1".', keyword="network_interfaces"),
    Option("nics", GENERAL, ("--network-interface",), kind=NICS_APPEND),
    Option("output_filename", GENERAL, ("--output-filename",), "Writes stdout / stderr of all processes to "
           "<output_filename>/rank.<rank>/<stdout | stderr> (also shown on the console). The <rank> is padded "
           "with 0 characters to ensure lexicographical order.", keyword="output_filename"),
    Option("verbose", GENERAL, ("--verbose",), "If this flag is set, extra messages will be printed (the per-rank "
           "commands).", kind=STORE_TRUE, keyword="verbose"),
    Option("command", GENERAL, help="Command to be executed.", kind=COMMAND),
    Option("config_file", GENERAL, ("--config-file",), "Path to YAML file containing runtime parameter "
           "configuration for Horovod. Note that this will override any command line arguments provided before "
           "this argument, and will be overridden by any arguments that come after it.", kind=CONFIG_FILE),
    Option("job", GENERAL, ("--job",), "Path to a RiseML-style YAML job file (riseml.yml) that describes the "
           "workers, their resources and the command lines to run. Every process runs each line in order, and "
           "all processes finish a line before any starts the next. Workers are placed on the --hosts / "
           "--hostfile hosts in order (all on localhost if neither is given) and -np is taken from the file. "
           "This flag is not part of upstream Horovod; see docs/job-file.md.", kind=JOB_FILE),
    Option("ssh_port", SSH, ("-p", "--ssh-port"), "SSH port on all the hosts.", type=int, keyword="ssh_port"),
    Option("ssh_identity_file", SSH, ("-i", "--ssh-identity-file"),
           "File on the driver from which the identity (private key) is read.", keyword="ssh_identity_file"),
]

_TUNING = [
    Option("fusion_threshold_mb", PARAMS, ("--fusion-threshold-mb",), "Fusion buffer threshold in MB. This is the "
           "maximum amount of tensor data that can be fused together into a single batch during allreduce / "
           "allgather. Setting 0 disables tensor fusion. (default: 128)", kind=TUNABLE, type=int,
           env="HOROVOD_FUSION_THRESHOLD", env_value=mb_to_bytes, file_key="params.fusion_threshold_mb",
           bounds=(0, None)),
    Option("cycle_time_ms", PARAMS, ("--cycle-time-ms",), "Cycle time in ms. This is the delay between each tensor "
           "fusion cycle. The larger the cycle time, the more batching, but the greater latency between each "
           "allreduce / allgather operations. (default: 1)", kind=TUNABLE, type=float, env="HOROVOD_CYCLE_TIME",
           file_key="params.cycle_time_ms", bounds=(0, None)),
    Option("cache_capacity", PARAMS, ("--cache-capacity",), "Maximum number of tensor names that will be cached to "
           "reduce amount of coordination required between workers before performing allreduce / allgather. "
           "Setting 0 disables caching. (default: 1024)", kind=TUNABLE, type=int, env="HOROVOD_CACHE_CAPACITY",
           file_key="params.cache_capacity", bounds=(0, None)),
    _tunable_switch("hierarchical-allreduce", "Perform hierarchical allreduce between workers instead of ring "
                    "allreduce. Hierarchical allreduce performs a local allreduce / gather within a host, then a "
                    "parallel cross allreduce between equal local ranks across workers, and finally a local "
                    "gather. Here Sum and Average across hosts are hierarchical anyway; the flag selects "
                    "hierarchical Adasum (sum inside each host, Adasum across hosts).", "params"),
    _tunable_switch("hierarchical-allgather", "Perform hierarchical allgather between workers instead of ring "
                    "allgather. See hierarchical allreduce for algorithm details.", "params"),
    _tunable_switch("torus-allreduce", "Perform 2D NCCL torus allreduce between workers instead of ring allreduce. "
                    "Torus allreduce performs a local reduce-scatter within a host, then a parallel cross "
                    "allreduce, and finally a local allgather.", "params"),
    _hidden_negation("autotune", AUTOTUNE, "--autotune", "Perform autotuning to select parameter argument values "
                     "that maximize throughput for allreduce / allgather. Any parameter explicitly set will be "
                     "held constant during tuning.", "HOROVOD_AUTOTUNE", "autotune.enabled",
                     env_only_with="autotune", file_missing=False),
    Option("autotune_log_file", AUTOTUNE, ("--autotune-log-file",), "Comma-separated log of trials containing each "
           "hyperparameter and the score of the trial. The last row will always contain the best value found.",
           kind=TUNABLE, env="HOROVOD_AUTOTUNE_LOG", env_only_with="autotune", file_key="autotune.log_file"),
    Option("autotune_warmup_samples", AUTOTUNE, ("--autotune-warmup-samples",), "Number of samples to discard "
           "before beginning the optimization process during autotuning. (default: %(default)s)", kind=TUNABLE,
           type=int, defaulted=True, env="HOROVOD_AUTOTUNE_WARMUP_SAMPLES", env_only_with="autotune",
           file_key="autotune.warmup_samples", bounds=(0, None)),
    Option("autotune_steps_per_sample", AUTOTUNE, ("--autotune-steps-per-sample",), "Number of steps "
           "(approximate) to record before observing a sample. (default: %(default)s)", kind=TUNABLE, type=int,
           defaulted=True, env="HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", env_only_with="autotune",
           file_key="autotune.steps_per_sample", bounds=(0, None)),
    Option("autotune_bayes_opt_max_samples", AUTOTUNE, ("--autotune-bayes-opt-max-samples",), "Maximum number of "
           "samples to collect for each Bayesian optimization process. (default: %(default)s)", kind=TUNABLE,
           type=int, defaulted=True, env="HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", env_only_with="autotune",
           file_key="autotune.bayes_opt_max_samples", bounds=(0, None)),
    Option("autotune_gaussian_process_noise", AUTOTUNE, ("--autotune-gaussian-process-noise",), "Regularization "
           "value [0, 1] applied to account for noise in samples. (default: %(default)s)", kind=TUNABLE,
           type=float, defaulted=True, env="HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", env_only_with="autotune",
           file_key="autotune.gaussian_process_noise", bounds=(0, 1)),
]

_ELASTIC = [
    Option("min_np", ELASTIC, ("--min-np", "--min-num-proc"), "Minimum number of processes running for training to "
           "continue. Defaults to --num-proc.", type=int, keyword="min_np"),
    Option("max_np", ELASTIC, ("--max-np", "--max-num-proc"), "Maximum number of training processes, beyond which "
           "no additional processes will be created. If not specified, then will be unbounded.", type=int,
           keyword="max_np"),
    Option("slots", ELASTIC, ("--slots-per-host",), "Number of slots for processes per host. Normally 1 slot per "
           "GPU per host.", type=int, keyword="slots"),
    Option("elastic_timeout", ELASTIC, ("--elastic-timeout",), "Seconds the elastic driver waits for --min-np "
           "slots, when the job starts and at every re-form, before the job fails. The default value is 600 "
           "seconds. Alternatively, the environment variable HOROVOD_ELASTIC_TIMEOUT can also be used.", type=int),
    Option("reset_limit", ELASTIC, ("--reset-limit",), "Maximum number of times that the training job can scale up "
           "or down the number of workers after which the job is terminated. (default: None)", type=int,
           keyword="reset_limit"),
    Option("cooldown_range", ELASTIC, ("--blacklist-cooldown-range",), "Range of seconds (min, max) a failing host "
           "will remain in blacklist. (default: None)", type=int, nargs=2, keyword="cooldown_range"),
]

_OBSERVING = [
    Option("timeline_filename", TIMELINE, ("--timeline-filename",), "JSON file containing timeline of Horovod "
           "events used for debugging performance. If this is provided, timeline events will be recorded, which "
           "can have a negative impact on training performance.", kind=TUNABLE, env="HOROVOD_TIMELINE",
           env_only_with="timeline_filename", file_key="timeline.filename"),
    _hidden_negation("timeline_mark_cycles", TIMELINE, "--timeline-mark-cycles", "Mark cycles on the timeline. Only "
                     "enabled if the timeline filename is provided.", "HOROVOD_TIMELINE_MARK_CYCLES",
                     "timeline.mark_cycles", env_only_with="timeline_filename"),
    _hidden_negation("no_stall_check", STALL_CHECK, "--no-stall-check", "Disable the stall check. The stall check "
                     "will log a warning when workers have stalled waiting for other ranks to submit tensors.",
                     "HOROVOD_STALL_CHECK_DISABLE", "stall_check.enabled", off="--stall-check", file_negated=True,
                     file_missing=True),
    Option("stall_check_warning_time_seconds", STALL_CHECK, ("--stall-check-warning-time-seconds",), "Seconds "
           "until the stall warning is logged to stderr. (default: %(default)s)", kind=TUNABLE, type=int,
           defaulted=True, env="HOROVOD_STALL_CHECK_TIME_SECONDS", file_key="stall_check.warning_time_seconds",
           bounds=(0, None)),
    Option("stall_check_shutdown_time_seconds", STALL_CHECK, ("--stall-check-shutdown-time-seconds",), "Seconds "
           "until Horovod is shutdown due to stall. Shutdown will only take place if this value is greater than "
           "the warning time. (default: %(default)s)", kind=TUNABLE, type=int, defaulted=True,
           env="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", file_key="stall_check.shutdown_time_seconds",
           bounds=(0, None)),
    Option("monitor_port", MONITOR, ("--monitor-port",), "Serve a live page of the job from the launcher on this "
           "port (0 picks a free one): per rank its host, pid, state, collectives and bytes per second, the "
           "collective it runs and how long it has waited, stall and deadlock reports, and every rank's Python "
           "stack on request. The launcher prints the page's URL, which carries a random token. Alternatively, "
           "the environment variable HOROVOD_MONITOR_PORT can be used. Not with --mpi or --jsrun.", type=int,
           bounds=(0, 65535)),
    Option("monitor_address", MONITOR, ("--monitor-address",), "The address the live page listens on (default: "
           "127.0.0.1, this machine only; 0.0.0.0 for every interface: anyone with the URL's token can then read "
           "it)."),
]

_LIBRARY = [
    _hidden_negation("mpi_threads_disable", LIBRARY, "--mpi-threads-disable", "Disable MPI threading support. Only "
                     "applies when running in MPI mode.", "HOROVOD_MPI_THREADS_DISABLE",
                     "library_options.mpi_threads_disable"),
    Option("mpi_args", LIBRARY, ("--mpi-args",), "Extra MPI arguments to pass to mpirun. They need to be passed "
           'with the equal sign to avoid parsing issues. e.g. --mpi-args="--map-by ppr:6:node"', keyword="mpi_args"),
    Option("tcp_flag", LIBRARY, ("--tcp",), "If this flag is set, only TCP is used for communication (sets "
           "NCCL_IB_DISABLE=1).", kind=STORE_TRUE),
    Option("binding_args", LIBRARY, ("--binding-args",), "Process binding arguments (MPI mode). e.g. "
           '--binding-args="--rankfile myrankfile"'),
    Option("num_nccl_streams", LIBRARY, ("--num-nccl-streams",), "Number of NCCL streams. Only applies when running "
           "with NCCL support. (default: %(default)s)", kind=TUNABLE, type=int, defaulted=True,
           env="HOROVOD_NUM_NCCL_STREAMS", file_key="library_options.num_nccl_streams", bounds=(0, None)),
    Option("thread_affinity", LIBRARY, ("--thread-affinity",), "Horovod background thread affinity: a core id, or a "
           "comma-separated list of core ids, one per local rank.", kind=TUNABLE, type=str,
           env="HOROVOD_THREAD_AFFINITY", file_key="library_options.thread_affinity", check=check_thread_affinity),
    Option("gloo_timeout_seconds", LIBRARY, ("--gloo-timeout-seconds",), "Seconds for the ranks to connect their "
           "data-plane sockets at init, once all of them reached the rendezvous (--start-timeout bounds that); a "
           "rank that does not connect in time fails init, named. (default: %(default)s)", kind=TUNABLE, type=int,
           defaulted=True,
           env="HOROVOD_GLOO_TIMEOUT_SECONDS", file_key="library_options.gloo_timeout_seconds", bounds=(0, None)),
    Option("log_level", LOGGING, ("--log-level",), "Minimum level to log to stderr from the Horovod backend. "
           "(default: WARNING).", kind=TUNABLE, choices=tuple(LOG_LEVELS), env="HOROVOD_LOG_LEVEL",
           file_key="logging.level"),
    Option("log_with_timestamp", LOGGING, kind=SWITCH, switches=(
        Switch(("--log-without-timestamp",), False, "Hide the timestamp from Horovod internal log messages."),
        Switch(("--log-with-timestamp",), True),
        Switch(("--log-hide-timestamp",), False, deprecated_for="--log-without-timestamp"),
        Switch(("--no-log-hide-timestamp",), True, deprecated_for="--log-with-timestamp"),
    ), env="HOROVOD_LOG_HIDE_TIME", env_value=zero_one, file_key="logging.with_timestamp"),
    Option("prefix_output_with_timestamp", LOGGING, ("-prefix-timestamp", "--prefix-output-with-timestamp"),
           "Timestamp each line of output to stdout and stderr.", kind=STORE_TRUE, run_default=False),
]

_LAUNCH = [
    Option("hosts", HOSTS, ("-H", "--hosts"), "List of host names and the number of available slots for running "
           "processes on each, of the form: <hostname>:<slots> (e.g.: host1:2,host2:4,host3:1 indicating 2 "
           "processes can run on host1, 4 on host2, and 1 on host3). If not specified, defaults to using "
           "localhost:<np>", exclusive=True, keyword="hosts"),
    Option("hostfile", HOSTS, ("-hostfile", "--hostfile"), "Path to a host file containing the list of host names "
           "and the number of available slots. Each line of the file must be of the form: <hostname> "
           "slots=<slots>", exclusive=True, keyword="hostfile"),
    Option("host_discovery_script", HOSTS, ("--host-discovery-script",), "Used for elastic training (not available "
           "yet): an executable script that prints every available host, one per line, optionally as "
           "<host>:<slots>.", kind=TUNABLE, exclusive=True, keyword="host_discovery_script"),
    Option("use_gloo", CONTROLLER, ("--gloo",), "Run Horovod using the built-in controller, which takes the role of "
           "upstream's Gloo controller (the default).", kind=STORE_TRUE, exclusive=True, keyword="use_gloo"),
    Option("use_mpi", CONTROLLER, ("--mpi",), "Launch the ranks with mpirun (Open MPI, MPICH, Intel MPI or "
           "Spectrum MPI; `pip install horovod[mpi]` brings Open MPI and mpi4py).", kind=STORE_TRUE,
           exclusive=True, keyword="use_mpi"),
    Option("use_jsrun", CONTROLLER, ("--jsrun",), "Launch Horovod processes with jsrun (IBM LSF) and use the MPI "
           "controller.", kind=STORE_TRUE, exclusive=True),
]

#: Every option, in ``horovodrun --help`` order.
OPTIONS: Tuple[Option, ...] = tuple(_GENERAL + _TUNING + _ELASTIC + _OBSERVING + _LIBRARY + _LAUNCH)


def by_dest(dest: str) -> Option:
    """The first option that sets ``dest`` (KeyError when none does)."""
    for option in OPTIONS:
        if option.dest == dest:
            return option
    raise KeyError(dest)
