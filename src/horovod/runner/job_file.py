"""Read a RiseML-style job file (``horovodrun --job riseml.yml``) into a validated :class:`JobFile`.

The file is parsed with PyYAML's node API (``yaml.compose``), so every error names the YAML line it is about:
an unknown key, a duplicate key, a value of the wrong type, a missing section. The accepted shape (see
docs/job-file.md)::

    project: digits                 # optional, recorded
    train:
      framework: pytorch            # optional when a framework section names it
      pytorch:                      # the framework section (RiseML's form) ...
        version: "2.1"              #   optional, recorded only
        horovod:
          workers: 2                #   a count, or {count: 2, processes: 4}
      horovod: {workers: 2}         # ... or the flat form, directly under train
      resources: {gpus: 0, cpus: 2, mem: 4096}
      run:                          # one command line, or a list of them
        - python prepare.py
        - python train.py --epochs 3
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import yaml
from yaml.constructor import SafeConstructor

FRAMEWORKS = ("pytorch", "tensorflow", "keras", "mxnet", "jax")
TOP_KEYS = ("project", "train")
TRAIN_KEYS = ("framework", *FRAMEWORKS, "horovod", "resources", "run")
FRAMEWORK_KEYS = ("horovod", "version")
HOROVOD_KEYS = ("workers",)
WORKERS_KEYS = ("count", "processes")
RESOURCES_KEYS = ("gpus", "cpus", "mem")

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_STR = "tag:yaml.org,2002:str"


class JobFileError(ValueError):
    """The job file cannot be used; the message names the file, the line and what to change."""


@dataclasses.dataclass(frozen=True)
class RunLine:
    """One entry of ``train.run``: its position in the list (1-based), its text and its line in the file."""

    index: int
    text: str
    yaml_line: int


@dataclasses.dataclass(frozen=True)
class JobFile:
    """A validated job: how many workers, processes per worker, the resources asked for and the lines to run."""

    path: str
    workers: int
    processes: int
    run: Tuple[RunLine, ...]
    project: Optional[str] = None
    framework: Optional[str] = None
    framework_version: Optional[str] = None
    gpus: int = 0
    cpus: Optional[float] = None
    mem_mib: Optional[int] = None

    @property
    def num_proc(self) -> int:
        """The job's process count, ``-np``: workers times processes per worker."""
        return self.workers * self.processes


class _Reader:
    """Walks the composed YAML nodes of one file, raising :class:`JobFileError` with the node's line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._constructor = SafeConstructor()

    def error(self, node: Optional[yaml.Node], message: str) -> JobFileError:
        where = f"{self.path}, line {node.start_mark.line + 1}" if node is not None else self.path
        return JobFileError(f"{where}: {message}")

    def mapping(self, node: yaml.Node, where: str, allowed: Tuple[str, ...]) -> Dict[str, Tuple[yaml.Node,
                                                                                           yaml.Node]]:
        """The entries of mapping ``node`` (``where`` names it), key -> (key node, value node); unknown or
        duplicate keys are errors."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{where} must be a mapping of keys to values (allowed keys: "
                                   f"{', '.join(allowed)}), not {self.describe(node)}")
        entries: Dict[str, Tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key not in allowed:
                shown = repr(key) if key is not None else self.describe(key_node)
                raise self.error(key_node, f"unknown key {shown} in {where}; allowed keys: {', '.join(allowed)}")
            if key in entries:
                first = entries[key][0].start_mark.line + 1
                raise self.error(key_node, f"duplicate key {key!r} in {where} (first given on line {first})")
            entries[key] = (key_node, value_node)
        return entries

    def describe(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        return repr(self._constructor.construct_object(node, deep=True))

    def integer(self, node: yaml.Node, where: str, minimum: int) -> int:
        if not (isinstance(node, yaml.ScalarNode) and node.tag == _INT):
            raise self.error(node, f"{where} must be a whole number (at least {minimum}), not "
                                   f"{self.describe(node)}")
        value = self._constructor.construct_object(node)
        if value < minimum:
            raise self.error(node, f"{where} must be at least {minimum}, not {value}")
        return value

    def positive_number(self, node: yaml.Node, where: str) -> float:
        if not (isinstance(node, yaml.ScalarNode) and node.tag in (_INT, _FLOAT)):
            raise self.error(node, f"{where} must be a number greater than 0, not {self.describe(node)}")
        value = self._constructor.construct_object(node)
        if not value > 0:
            raise self.error(node, f"{where} must be greater than 0, not {value}")
        return value

    def text(self, node: yaml.Node, where: str, allow_numbers: bool = False) -> str:
        tags = (_STR, _INT, _FLOAT) if allow_numbers else (_STR,)
        if not (isinstance(node, yaml.ScalarNode) and node.tag in tags) or not str(node.value).strip():
            raise self.error(node, f"{where} must be a non-empty string, not {self.describe(node)}")
        return str(node.value)


def load(path: str) -> JobFile:
    """Read and validate the job file at ``path`` (JobFileError for a bad file, OSError when unreadable)."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    return parse(source, path)


def parse(source: str, path: str = "<job file>") -> JobFile:
    """Validate the YAML text of a job file (``path`` names it in errors) into a :class:`JobFile`."""
    reader = _Reader(path)
    try:
        root = yaml.compose(source, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}" if mark is not None else path
        raise JobFileError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    if root is None:
        raise JobFileError(f"{path}: the job file is empty; it needs a 'train' section with 'run' lines and "
                           "the Horovod workers (see docs/job-file.md)")
    top = reader.mapping(root, "the job file", TOP_KEYS)
    if "train" not in top:
        raise reader.error(root, "the job file has no 'train' section; add one with the Horovod workers and "
                                 "the 'run' lines")
    project = reader.text(top["project"][1], "project", allow_numbers=True) if "project" in top else None
    train_key, train_node = top["train"]
    train = reader.mapping(train_node, "train", TRAIN_KEYS)
    framework, version, horovod_node = _framework_and_horovod(reader, train_key, train)
    workers, processes_given = _workers(reader, horovod_node)
    gpus, cpus, mem = _resources(reader, train["resources"][1]) if "resources" in train else (0, None, None)
    if "run" not in train:
        raise reader.error(train_key, "train has no 'run' lines; list the command lines every process runs")
    processes = processes_given or (gpus if gpus > 0 else 1)
    return JobFile(path=path, workers=workers, processes=processes, run=_run_lines(reader, train["run"][1]),
                   project=project, framework=framework, framework_version=version, gpus=gpus, cpus=cpus,
                   mem_mib=mem)


def _framework_and_horovod(reader: _Reader, train_key: yaml.Node,
                           train: Dict[str, Tuple[yaml.Node, yaml.Node]]) -> Tuple[Optional[str], Optional[str],
                                                                                    yaml.Node]:
    """The framework (from ``framework`` or the framework section), its version, and the ``horovod`` node."""
    framework = None
    if "framework" in train:
        node = train["framework"][1]
        framework = reader.text(node, "train.framework")
        if framework not in FRAMEWORKS:
            raise reader.error(node, f"unknown framework {framework!r} in train.framework; use one of: "
                                     f"{', '.join(FRAMEWORKS)}")
    sections = [name for name in FRAMEWORKS if name in train]
    if len(sections) > 1:
        raise reader.error(train[sections[1]][0], f"train has sections for two frameworks ({sections[0]} and "
                                                  f"{sections[1]}); a job has one")
    if sections and framework is not None and sections[0] != framework:
        raise reader.error(train[sections[0]][0], f"train.framework is {framework!r} but the framework section "
                                                  f"is {sections[0]!r}; make them the same")
    version = None
    horovod_node = train["horovod"][1] if "horovod" in train else None
    if sections:
        name = sections[0]
        framework = name
        section = reader.mapping(train[name][1], f"train.{name}", FRAMEWORK_KEYS)
        if "version" in section:
            version = reader.text(section["version"][1], f"train.{name}.version", allow_numbers=True)
        if "horovod" in section:
            if horovod_node is not None:
                raise reader.error(train["horovod"][0], f"train.horovod and train.{name}.horovod both give the "
                                                        "workers; keep one")
            horovod_node = section["horovod"][1]
    if horovod_node is None:
        where = f"train.{sections[0]}.horovod" if sections else "train.<framework>.horovod (or train.horovod)"
        raise reader.error(train_key, f"the job has no Horovod workers; add {where} with 'workers: <count>'")
    return framework, version, horovod_node


def _workers(reader: _Reader, horovod_node: yaml.Node) -> Tuple[int, Optional[int]]:
    """``workers``: a count, or ``{count, processes}``; returns the count and the processes given (or None)."""
    horovod = reader.mapping(horovod_node, "horovod", HOROVOD_KEYS)
    if "workers" not in horovod:
        raise reader.error(horovod_node, "horovod has no 'workers'; give a count (workers: 2) or "
                                         "{count: 2, processes: 4}")
    node = horovod["workers"][1]
    if not isinstance(node, yaml.MappingNode):
        return reader.integer(node, "horovod.workers", 1), None
    spec = reader.mapping(node, "horovod.workers", WORKERS_KEYS)
    if "count" not in spec:
        raise reader.error(node, "horovod.workers has no 'count' (the number of workers)")
    count = reader.integer(spec["count"][1], "horovod.workers.count", 1)
    processes = (reader.integer(spec["processes"][1], "horovod.workers.processes", 1)
                 if "processes" in spec else None)
    return count, processes


def _resources(reader: _Reader, node: yaml.Node) -> Tuple[int, Optional[float], Optional[int]]:
    """``resources``: GPUs (whole, >= 0), CPUs (> 0) and memory (MiB, > 0) per worker."""
    resources = reader.mapping(node, "resources", RESOURCES_KEYS)
    gpus = reader.integer(resources["gpus"][1], "resources.gpus", 0) if "gpus" in resources else 0
    cpus = reader.positive_number(resources["cpus"][1], "resources.cpus") if "cpus" in resources else None
    mem = reader.integer(resources["mem"][1], "resources.mem (MiB)", 1) if "mem" in resources else None
    return gpus, cpus, mem


def _run_lines(reader: _Reader, node: yaml.Node) -> Tuple[RunLine, ...]:
    """``run``: one command line or a non-empty list of them."""
    if isinstance(node, yaml.SequenceNode):
        items: List[Any] = list(node.value)
        if not items:
            raise reader.error(node, "train.run is an empty list; list the command lines every process runs")
    else:
        items = [node]
    lines = []
    for index, item in enumerate(items, start=1):
        where = f"train.run line {index}" if isinstance(node, yaml.SequenceNode) else "train.run"
        lines.append(RunLine(index, reader.text(item, where), item.start_mark.line + 1))
    return tuple(lines)
