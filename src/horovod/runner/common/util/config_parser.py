"""``horovodrun`` flags and the YAML ``--config-file`` mapped onto ``HOROVOD_*`` environment variables.

This keeps upstream's mapping (``horovod/runner/common/util/config_parser.py``): the fusion threshold is given in
MB and exported in bytes, boolean flags become ``1``/``0``, the autotune variables are exported only with
``--autotune`` and the timeline variables only with a timeline file name.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, MutableMapping, Optional, Set, Tuple

# Parameter knobs
HOROVOD_FUSION_THRESHOLD = "HOROVOD_FUSION_THRESHOLD"
HOROVOD_CYCLE_TIME = "HOROVOD_CYCLE_TIME"
HOROVOD_CACHE_CAPACITY = "HOROVOD_CACHE_CAPACITY"
HOROVOD_HIERARCHICAL_ALLREDUCE = "HOROVOD_HIERARCHICAL_ALLREDUCE"
HOROVOD_HIERARCHICAL_ALLGATHER = "HOROVOD_HIERARCHICAL_ALLGATHER"
HOROVOD_TORUS_ALLREDUCE = "HOROVOD_TORUS_ALLREDUCE"

# Autotune knobs
HOROVOD_AUTOTUNE = "HOROVOD_AUTOTUNE"
HOROVOD_AUTOTUNE_LOG = "HOROVOD_AUTOTUNE_LOG"
HOROVOD_AUTOTUNE_WARMUP_SAMPLES = "HOROVOD_AUTOTUNE_WARMUP_SAMPLES"
HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE = "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"
HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES = "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"
HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE = "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"

# Timeline knobs
HOROVOD_TIMELINE = "HOROVOD_TIMELINE"
HOROVOD_TIMELINE_MARK_CYCLES = "HOROVOD_TIMELINE_MARK_CYCLES"

# Stall check knobs
HOROVOD_STALL_CHECK_DISABLE = "HOROVOD_STALL_CHECK_DISABLE"
HOROVOD_STALL_CHECK_TIME_SECONDS = "HOROVOD_STALL_CHECK_TIME_SECONDS"
HOROVOD_STALL_SHUTDOWN_TIME_SECONDS = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"

# Library options knobs
HOROVOD_MPI_THREADS_DISABLE = "HOROVOD_MPI_THREADS_DISABLE"
HOROVOD_NUM_NCCL_STREAMS = "HOROVOD_NUM_NCCL_STREAMS"
HOROVOD_THREAD_AFFINITY = "HOROVOD_THREAD_AFFINITY"
HOROVOD_GLOO_TIMEOUT_SECONDS = "HOROVOD_GLOO_TIMEOUT_SECONDS"

# Logging knobs
HOROVOD_LOG_LEVEL = "HOROVOD_LOG_LEVEL"
HOROVOD_LOG_HIDE_TIME = "HOROVOD_LOG_HIDE_TIME"

LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"]

# Flags that have a default in parse_args and are exported even when not given. When the user did not give the
# flag but exported the variable, the launcher keeps the user's value (upstream silently reset it to the default).
DEFAULTED_ARGS = {
    "stall_check_warning_time_seconds": HOROVOD_STALL_CHECK_TIME_SECONDS,
    "stall_check_shutdown_time_seconds": HOROVOD_STALL_SHUTDOWN_TIME_SECONDS,
    "num_nccl_streams": HOROVOD_NUM_NCCL_STREAMS,
    "gloo_timeout_seconds": HOROVOD_GLOO_TIMEOUT_SECONDS,
    "autotune_warmup_samples": HOROVOD_AUTOTUNE_WARMUP_SAMPLES,
    "autotune_steps_per_sample": HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE,
    "autotune_bayes_opt_max_samples": HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES,
    "autotune_gaussian_process_noise": HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE,
}


def _as_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
        return v.strip().lower() in ("true", "yes", "on", "1")
    raise ValueError("must be true or false")


def _as_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError("must be an integer")
    return int(v)


def _as_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError("must be a number")
    return float(v)


def _as_str(v: Any) -> str:
    if isinstance(v, (dict, list)):
        raise ValueError("must be a single value")
    return str(v)


def _as_level(v: Any) -> str:
    level = str(v).strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return level


# section -> key in the file -> (dest on args, converter). Upstream's sections and keys
# (``test/single/data/config.test.yaml``).
CONFIG_SECTIONS: Dict[str, Dict[str, Tuple[str, Callable[[Any], Any]]]] = {
    "params": {
        "fusion_threshold_mb": ("fusion_threshold_mb", _as_int),
        "cycle_time_ms": ("cycle_time_ms", _as_float),
        "cache_capacity": ("cache_capacity", _as_int),
        "hierarchical_allreduce": ("hierarchical_allreduce", _as_bool),
        "hierarchical_allgather": ("hierarchical_allgather", _as_bool),
        "torus_allreduce": ("torus_allreduce", _as_bool),
    },
    "autotune": {
        "enabled": ("autotune", _as_bool),
        "log_file": ("autotune_log_file", _as_str),
        "warmup_samples": ("autotune_warmup_samples", _as_int),
        "steps_per_sample": ("autotune_steps_per_sample", _as_int),
        "bayes_opt_max_samples": ("autotune_bayes_opt_max_samples", _as_int),
        "gaussian_process_noise": ("autotune_gaussian_process_noise", _as_float),
    },
    "timeline": {
        "filename": ("timeline_filename", _as_str),
        "mark_cycles": ("timeline_mark_cycles", _as_bool),
    },
    "stall_check": {
        "enabled": ("no_stall_check", lambda v: not _as_bool(v)),
        "warning_time_seconds": ("stall_check_warning_time_seconds", _as_int),
        "shutdown_time_seconds": ("stall_check_shutdown_time_seconds", _as_int),
    },
    "library_options": {
        "mpi_threads_disable": ("mpi_threads_disable", _as_bool),
        "num_nccl_streams": ("num_nccl_streams", _as_int),
        "thread_affinity": ("thread_affinity", _as_str),
        "gloo_timeout_seconds": ("gloo_timeout_seconds", _as_int),
    },
    "logging": {
        "level": ("log_level", _as_level),
        "with_timestamp": ("log_with_timestamp", _as_bool),
    },
}
CONTROLLERS = ("gloo", "mpi", "jsrun")


def load_config_file(path: str) -> Dict[str, Any]:
    """Read a YAML config file; ValueError naming the file when it cannot be read or is not a mapping."""
    import yaml  # only needed with --config-file

    try:
        with open(path) as f:
            config = yaml.safe_load(f)
    except OSError as exc:
        raise ValueError(f"Cannot read --config-file {path}: {exc.strerror}.") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--config-file {path} is not valid YAML: {exc}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(f"--config-file {path} must contain a mapping of sections (params, autotune, ...).")
    return config


def set_args_from_config(args: Any, config: Mapping[str, Any], override_args: Set[str],
                         source: str = "config file") -> Set[str]:
    """Copy values from a parsed config file onto ``args``, except for dests in ``override_args``.

    ``override_args`` holds the flags given on the command line *after* ``--config-file``, which win over the
    file. As upstream, an ``autotune`` section without ``enabled`` turns autotune off and a ``stall_check``
    section without ``enabled`` leaves the stall check on. Returns the dests that were set.
    Unknown sections and keys are logged and ignored (upstream ignores them silently); a value of the wrong type
    raises ValueError naming the section and key.
    """
    import logging

    log = logging.getLogger(__name__)
    applied: Set[str] = set()

    controller = config.get("controller")
    if controller and not (getattr(args, "use_gloo", None) or getattr(args, "use_mpi", None)
                           or getattr(args, "use_jsrun", None)):
        name = str(controller).strip().lower()
        if name not in CONTROLLERS:
            raise ValueError(f"{source}: No such controller supported: {controller!r} (use gloo, mpi or jsrun).")
        setattr(args, f"use_{name}", True)
        applied.add(f"use_{name}")

    for section_name, section in config.items():
        if section_name == "controller":
            continue
        if section_name not in CONFIG_SECTIONS:
            log.warning("%s: ignoring unknown section %r (known sections: controller, %s)", source,
                        section_name, ", ".join(CONFIG_SECTIONS))
            continue
        if section is None:
            section = {}
        if not isinstance(section, dict):
            raise ValueError(f"{source}: section {section_name!r} must be a mapping of key: value.")
        keys = CONFIG_SECTIONS[section_name]
        for key in section:
            if key not in keys:
                log.warning("%s: ignoring unknown key %s.%s (known keys: %s)", source, section_name, key,
                            ", ".join(keys))
        effective = dict(section)
        if section_name == "autotune":
            effective.setdefault("enabled", False)
        if section_name == "stall_check":
            effective.setdefault("enabled", True)
        for key, (dest, convert) in keys.items():
            if key not in effective or effective[key] is None or dest in override_args:
                continue
            try:
                value = convert(effective[key])
            except ValueError as exc:
                raise ValueError(f"{source}: {section_name}.{key}={effective[key]!r} {exc}.") from None
            setattr(args, dest, value)
            applied.add(dest)
    return applied


def _validate_arg_nonnegative(args: Any, arg_name: str) -> None:
    value = getattr(args, arg_name, None)
    if value is not None and value < 0:
        raise ValueError(f"{arg_name}={value} must be >= 0")


def validate_config_args(args: Any) -> None:
    """Check the tunable values (non-negative, noise in [0, 1], known log level, affinity list)."""
    for name in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity", "autotune_warmup_samples",
                 "autotune_steps_per_sample", "autotune_bayes_opt_max_samples",
                 "stall_check_warning_time_seconds", "stall_check_shutdown_time_seconds", "num_nccl_streams",
                 "gloo_timeout_seconds"):
        _validate_arg_nonnegative(args, name)

    noise = getattr(args, "autotune_gaussian_process_noise", None)
    if noise is not None and (noise < 0 or noise > 1):
        raise ValueError(f"autotune_gaussian_process_noise={noise} must be in [0, 1]")

    level = getattr(args, "log_level", None)
    if level is not None and level not in LOG_LEVELS:
        raise ValueError(f"Log level must be one of: {LOG_LEVELS}")

    affinity = getattr(args, "thread_affinity", None)
    if affinity is not None:
        items = str(affinity).split(",")
        if not all(item.strip().isdigit() for item in items):
            raise ValueError(
                f"thread_affinity={affinity!r} must be a core id or a comma-separated list of core ids, "
                "one per local rank (e.g. 0,2,4,6)"
            )


def _add_arg_to_env(env: MutableMapping[str, str], env_key: str, arg_value: Any,
                    transform_fn: Optional[Callable[[Any], Any]] = None) -> None:
    if arg_value is not None:
        value = transform_fn(arg_value) if transform_fn else arg_value
        env[env_key] = str(value)


def set_env_from_args(env: MutableMapping[str, str], args: Any) -> MutableMapping[str, str]:
    """Export the tunable flags in ``args`` into ``env`` (in place) and return it. Unset flags are skipped."""

    def identity(value: Any) -> int:
        return 1 if value else 0

    def get(name: str) -> Any:
        return getattr(args, name, None)

    # Params
    _add_arg_to_env(env, HOROVOD_FUSION_THRESHOLD, get("fusion_threshold_mb"), lambda v: int(v * 1024 * 1024))
    _add_arg_to_env(env, HOROVOD_CYCLE_TIME, get("cycle_time_ms"))
    _add_arg_to_env(env, HOROVOD_CACHE_CAPACITY, get("cache_capacity"))
    _add_arg_to_env(env, HOROVOD_HIERARCHICAL_ALLREDUCE, get("hierarchical_allreduce"), identity)
    _add_arg_to_env(env, HOROVOD_HIERARCHICAL_ALLGATHER, get("hierarchical_allgather"), identity)
    _add_arg_to_env(env, HOROVOD_TORUS_ALLREDUCE, get("torus_allreduce"), identity)

    # Autotune
    if get("autotune"):
        _add_arg_to_env(env, HOROVOD_AUTOTUNE, get("autotune"), identity)
        _add_arg_to_env(env, HOROVOD_AUTOTUNE_LOG, get("autotune_log_file"))
        _add_arg_to_env(env, HOROVOD_AUTOTUNE_WARMUP_SAMPLES, get("autotune_warmup_samples"))
        _add_arg_to_env(env, HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE, get("autotune_steps_per_sample"))
        _add_arg_to_env(env, HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES, get("autotune_bayes_opt_max_samples"))
        _add_arg_to_env(env, HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE, get("autotune_gaussian_process_noise"))

    # Timeline
    if get("timeline_filename"):
        _add_arg_to_env(env, HOROVOD_TIMELINE, get("timeline_filename"))
        _add_arg_to_env(env, HOROVOD_TIMELINE_MARK_CYCLES, get("timeline_mark_cycles"), identity)

    # Stall check
    _add_arg_to_env(env, HOROVOD_STALL_CHECK_DISABLE, get("no_stall_check"), identity)
    _add_arg_to_env(env, HOROVOD_STALL_CHECK_TIME_SECONDS, get("stall_check_warning_time_seconds"))
    _add_arg_to_env(env, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, get("stall_check_shutdown_time_seconds"))

    # Library options
    _add_arg_to_env(env, HOROVOD_MPI_THREADS_DISABLE, get("mpi_threads_disable"), identity)
    _add_arg_to_env(env, HOROVOD_NUM_NCCL_STREAMS, get("num_nccl_streams"))
    _add_arg_to_env(env, HOROVOD_THREAD_AFFINITY, get("thread_affinity"))
    _add_arg_to_env(env, HOROVOD_GLOO_TIMEOUT_SECONDS, get("gloo_timeout_seconds"))

    # Logging
    _add_arg_to_env(env, HOROVOD_LOG_LEVEL, get("log_level"))
    if get("log_with_timestamp") is not None:
        _add_arg_to_env(env, HOROVOD_LOG_HIDE_TIME, not get("log_with_timestamp"), identity)

    return env
