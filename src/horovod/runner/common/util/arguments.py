"""``horovodrun``'s argparse parser, built from the option table :data:`horovod.common.options.OPTIONS`.

Flags that ``--config-file`` may override (``TUNABLE`` and ``SWITCH`` options) record their destination when
given, so that a config file overrides the flags before it and not the ones after it.
"""
from __future__ import annotations

import argparse
import warnings
from typing import Any, Callable, Dict, Optional, Set

from horovod.common import options
from horovod.common.options import Option, Switch


def make_override_action(override_args: Set[str], explicit: Set[str]):
    """A ``store`` action that records its destination as given on the command line."""

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
    """A flag that stores ``bool_value`` and records its destination (warning when it is deprecated)."""

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


def make_config_file_action(override_args: Set[str]):
    """``--config-file``: flags given before it are overridden by the file, flags after it win."""

    class ConfigFileAction(argparse.Action):
        def __call__(self, parser, args, values, option_string=None):
            override_args.clear()
            setattr(args, self.dest, values)

    return ConfigFileAction


def make_check_build_action(np_arg: argparse.Action):
    """``-cb``: sets ``check_build`` and makes ``-np`` optional."""

    class CheckBuildAction(argparse.Action):
        def __call__(self, parser, args, values, option_string=None):
            np_arg.required = False  # -np is optional with -cb
            args.check_build = True

    return CheckBuildAction


def make_job_file_action(np_arg: argparse.Action):
    """``--job``: stores the job file's path and makes ``-np`` optional (the file gives the count)."""

    class JobFileAction(argparse.Action):
        def __call__(self, parser, args, values, option_string=None):
            np_arg.required = False
            setattr(args, self.dest, values)

    return JobFileAction


def make_nics_append_action():
    """The deprecated repeatable ``--network-interface``."""

    class NicsAppendAction(argparse.Action):
        """Deprecated repeatable ``--network-interface``: appends to ``--network-interfaces``."""

        def __call__(self, parser, args, values, option_string=None):
            warnings.warn("--network-interface is deprecated, use --network-interfaces", DeprecationWarning,
                          stacklevel=2)
            current = getattr(args, self.dest, None)
            setattr(args, self.dest, f"{current},{values}" if current else values)

    return NicsAppendAction


def _help(text: Optional[str]) -> str:
    return argparse.SUPPRESS if text is None else text


class _Builder:
    """Adds each option of the table to the parser, in its argument group."""

    def __init__(self, parser: argparse.ArgumentParser, override_args: Set[str], explicit: Set[str],
                 version: str) -> None:
        self.parser = parser
        self.override_args = override_args
        self.explicit = explicit
        self.version = version
        self.groups: Dict[str, Any] = {options.GENERAL: parser}
        self.exclusive: Dict[str, Any] = {}
        self.actions: Dict[str, argparse.Action] = {}

    def container(self, option: Option) -> Any:
        """Where the option's flags go: its argument group, or the group's one mutually exclusive set."""
        if option.group not in self.groups:
            self.groups[option.group] = self.parser.add_argument_group(option.group)
        group = self.groups[option.group]
        if option.kind == options.SWITCH:
            return group.add_mutually_exclusive_group()
        if option.exclusive:
            if option.group not in self.exclusive:
                self.exclusive[option.group] = group.add_mutually_exclusive_group()
            return self.exclusive[option.group]
        return group

    def add(self, option: Option) -> None:
        into = self.container(option)
        if option.kind == options.SWITCH:
            for switch in option.switches:
                self.add_switch(into, option, switch)
            return
        kwargs = self.special(option) if option.kind in self.SPECIAL else self.valued(option)
        if option.kind == options.COMMAND:
            self.actions[option.dest] = into.add_argument(option.dest, **kwargs)
        else:
            self.actions[option.dest] = into.add_argument(*option.names, dest=option.dest, **kwargs)

    def add_switch(self, into: Any, option: Option, switch: Switch) -> None:
        action = make_override_bool_action(self.override_args, self.explicit, switch.value, switch.deprecated_for)
        into.add_argument(*switch.names, dest=option.dest, action=action,
                          help=_help(option.help_text(switch.help) if switch.value else switch.help))

    def valued(self, option: Option) -> Dict[str, Any]:
        kwargs: Dict[str, Any] = dict(help=_help(option.help_text()))
        if option.kind == options.STORE_TRUE:
            return dict(kwargs, action="store_true")
        if option.kind == options.TUNABLE:
            kwargs["action"] = make_override_action(self.override_args, self.explicit)
        else:
            kwargs.update(action="store", required=option.required)
            if option.nargs is not None:
                kwargs["nargs"] = option.nargs
        if option.type is not None:
            kwargs["type"] = option.type
        if option.choices is not None:
            kwargs["choices"] = list(option.choices)
        if option.default is not None:
            kwargs["default"] = option.default
        return kwargs

    def special(self, option: Option) -> Dict[str, Any]:
        kwargs = dict(help=_help(option.help_text()))
        kwargs.update(self.SPECIAL[option.kind](self))
        return kwargs

    SPECIAL: Dict[str, Callable[[_Builder], Dict[str, Any]]] = {
        options.VERSION: lambda b: dict(action="version", version=b.version),
        options.CHECK_BUILD: lambda b: dict(action=make_check_build_action(b.actions["np"]), nargs=0,
                                            default=False),
        options.NICS_APPEND: lambda b: dict(action=make_nics_append_action()),
        options.JOB_FILE: lambda b: dict(action=make_job_file_action(b.actions["np"])),
        options.CONFIG_FILE: lambda b: dict(action=make_config_file_action(b.override_args)),
        options.COMMAND: lambda b: dict(nargs=argparse.REMAINDER),
    }


def make_parser(override_args: Set[str], explicit: Set[str], version: str,
                np_optional: bool = False) -> argparse.ArgumentParser:
    """The ``horovodrun`` argument parser (upstream's flags, groups and defaults), from the option table.

    Flags that ``--config-file`` may override add their destination to ``override_args`` (cleared by
    ``--config-file``) and to ``explicit`` when given. ``np_optional``: ``-np`` is not required (inside an LSF
    job or a Slurm allocation it defaults to the allocation's slots).
    """
    parser = argparse.ArgumentParser(description="Horovod Runner", prog="horovodrun")
    builder = _Builder(parser, override_args, explicit, version)
    for option in options.OPTIONS:
        builder.add(option)
    if np_optional:
        builder.actions["np"].required = False
    return parser
