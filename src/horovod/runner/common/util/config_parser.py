"""``horovodrun`` flags and the YAML ``--config-file`` mapped onto ``HOROVOD_*`` environment variables.

This keeps upstream's mapping (``horovod/runner/common/util/config_parser.py``): the fusion threshold is given in
MB and exported in bytes, boolean flags become ``1``/``0``, the autotune variables are exported only with
``--autotune`` and the timeline variables only with a timeline file name. Every mapping here is generated from
the option table :data:`horovod.common.options.OPTIONS`.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Mapping, MutableMapping, Set, Tuple

from horovod.common import options
from horovod.common.config import parse_bool
from horovod.common.options import Option

log = logging.getLogger(__name__)

LOG_LEVELS = options.LOG_LEVELS

# Flags that have a default in parse_args and are exported even when not given. When the user did not give the
# flag but exported the variable, the launcher keeps the user's value (upstream silently reset it to the default).
DEFAULTED_ARGS: Dict[str, str] = {o.dest: o.env for o in options.OPTIONS if o.defaulted and o.env}


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


def _file_converter(option: Option) -> Callable[[Any], Any]:
    """How a config-file value becomes the option's value: by the option's type (booleans through
    :func:`horovod.common.config.parse_bool`), choices upper-cased and checked, negated where the key is."""
    if option.kind == options.SWITCH:
        if option.file_negated:
            return lambda v: not parse_bool(v)
        return parse_bool
    if option.choices is not None:
        def choice(v: Any) -> str:
            value = str(v).strip().upper()
            if value not in option.choices:
                raise ValueError(f"must be one of {', '.join(option.choices)}")
            return value
        return choice
    return {int: _as_int, float: _as_float}.get(option.type, _as_str)


def _config_sections() -> Dict[str, Dict[str, Tuple[Option, Callable[[Any], Any]]]]:
    sections: Dict[str, Dict[str, Tuple[Option, Callable[[Any], Any]]]] = {}
    for option in options.OPTIONS:
        if option.file_key:
            section, key = option.file_key.split(".")
            sections.setdefault(section, {})[key] = (option, _file_converter(option))
    return sections


# section -> key in the file -> (option, converter). Upstream's sections and keys
# (``test/single/data/config.test.yaml``).
CONFIG_SECTIONS = _config_sections()
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
    applied = _apply_controller(args, config.get("controller"), source)
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
        applied |= _apply_section(args, section_name, section, override_args, source)
    return applied


def _apply_controller(args: Any, controller: Any, source: str) -> Set[str]:
    """``controller:`` selects gloo, mpi or jsrun unless a controller flag was given."""
    if not controller or any(getattr(args, f"use_{name}", None) for name in CONTROLLERS):
        return set()
    name = str(controller).strip().lower()
    if name not in CONTROLLERS:
        raise ValueError(f"{source}: No such controller supported: {controller!r} (use gloo, mpi or jsrun).")
    setattr(args, f"use_{name}", True)
    return {f"use_{name}"}


def _apply_section(args: Any, section_name: str, section: Mapping[str, Any], override_args: Set[str],
                   source: str) -> Set[str]:
    """One known section of the file onto ``args``; returns the dests it set."""
    keys = CONFIG_SECTIONS[section_name]
    for key in section:
        if key not in keys:
            log.warning("%s: ignoring unknown key %s.%s (known keys: %s)", source, section_name, key,
                        ", ".join(keys))
    applied: Set[str] = set()
    for key, (option, convert) in keys.items():
        raw = section.get(key, option.file_missing)
        if raw is None or option.dest in override_args:
            continue
        try:
            value = convert(raw)
        except ValueError as exc:
            raise ValueError(f"{source}: {section_name}.{key}={raw!r} {exc}.") from None
        setattr(args, option.dest, value)
        applied.add(option.dest)
    return applied


def validate_config_args(args: Any) -> None:
    """Check the tunable values against the table: bounds (non-negative, noise in [0, 1]), choices (log
    level) and the option's own check (thread affinity list). Raises ValueError naming the option."""
    for option in options.OPTIONS:
        value = getattr(args, option.dest, None)
        if value is None:
            continue
        if option.bounds is not None:
            low, high = option.bounds
            if high is None and value < low:
                raise ValueError(f"{option.dest}={value} must be >= {low}")
            if high is not None and not low <= value <= high:
                raise ValueError(f"{option.dest}={value} must be in [{low}, {high}]")
        if option.choices is not None and value not in option.choices:
            raise ValueError(f"{option.dest}={value!r} must be one of: {', '.join(option.choices)}")
        if option.check is not None:
            option.check(value)


def set_env_from_args(env: MutableMapping[str, str], args: Any) -> MutableMapping[str, str]:
    """Export the tunable flags in ``args`` into ``env`` (in place) and return it. Unset flags are skipped, and
    so are options exported only with another (the autotune values only with ``--autotune``, the timeline's only
    with a file name)."""
    for option in options.OPTIONS:
        value = getattr(args, option.dest, None)
        if option.env is None or value is None:
            continue
        if option.env_only_with and not getattr(args, option.env_only_with, None):
            continue
        env[option.env] = option.env_value(value)
    return env
