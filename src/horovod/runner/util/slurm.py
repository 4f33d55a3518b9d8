"""Slurm: is this process inside a Slurm allocation, and which hosts and slots did Slurm give it.

``salloc`` and ``sbatch`` describe the allocation in the environment of the shell or script they start:

- ``SLURM_JOB_ID``: set in every allocation (its presence is what "inside Slurm" means);
- ``SLURM_JOB_NODELIST`` (older: ``SLURM_NODELIST``): the nodes in Slurm's compressed form, e.g.
  ``node[01-03,07],gpu-a``;
- ``SLURM_TASKS_PER_NODE``: the tasks Slurm placed on each node, compressed, e.g. ``2(x3),1``; where it is missing
  (an allocation made with ``--nodes`` only) ``SLURM_JOB_CPUS_PER_NODE`` (same form) counts the slots.

The node list is expanded with ``scontrol show hostnames`` when it is installed (it knows every form Slurm
writes), else by :func:`expand_nodelist`.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from typing import List, Mapping, Optional

from horovod.common import topology

from ..common.util.hosts import HostInfo

log = logging.getLogger(__name__)

SCONTROL_TIMEOUT = 30.0

NO_NODELIST = (
    "This is a Slurm allocation (SLURM_JOB_ID={job}) but its node list is missing: neither SLURM_JOB_NODELIST "
    "nor SLURM_NODELIST is set. Run horovodrun in the shell that salloc started or in the sbatch script, or "
    "give the hosts with -H/--hostfile."
)
NO_TASKS = (
    "This is a Slurm allocation (SLURM_JOB_ID={job}) but neither SLURM_TASKS_PER_NODE nor "
    "SLURM_JOB_CPUS_PER_NODE says how many tasks each node takes. Allocate with -n/--ntasks (e.g. `salloc -n 4`), "
    "or give the hosts with -H/--hostfile."
)


def _environ(env: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if env is None else env


def using_slurm(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when this process runs inside a Slurm allocation (``SLURM_JOB_ID`` is set)."""
    return bool(_environ(env).get("SLURM_JOB_ID"))


def _split_top_level(text: str) -> List[str]:
    """Split at the commas that are outside brackets: ``a[1,2],b`` -> ``['a[1,2]', 'b']``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(spec: str, nodelist: str) -> List[str]:
    """``01-03,07`` -> ``['01', '02', '03', '07']``, keeping each range's zero padding."""
    out: List[str] = []
    for item in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if not match:
            raise ValueError(f"Cannot read the Slurm node list {nodelist!r}: {item!r} is not a number or a range.")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"Cannot read the Slurm node list {nodelist!r}: the range {item!r} runs backwards.")
        out.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return out


def _expand_name(name: str, nodelist: str) -> List[str]:
    """One name with any number of bracket groups: ``rack[1-2]-n[01-02]`` -> four names (the product)."""
    match = re.search(r"\[([^\[\]]*)\]", name)
    if not match:
        if "[" in name or "]" in name:
            raise ValueError(f"Cannot read the Slurm node list {nodelist!r}: unbalanced brackets in {name!r}.")
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    return [head + value + rest for value in _expand_ranges(match.group(1), nodelist)
            for rest in _expand_name(tail, nodelist)]


def expand_nodelist(nodelist: str) -> List[str]:
    """Expand Slurm's compressed node list (``node[01-03,07],gpu-a``) to the node names, in order."""
    names: List[str] = []
    for part in _split_top_level(nodelist):
        names.extend(_expand_name(part, nodelist))
    return names


def expand_counts(spec: str) -> List[int]:
    """Expand Slurm's compressed per-node counts (``2(x3),1``) to ``[2, 2, 2, 1]``; ValueError when unreadable."""
    return topology.expand_slurm_counts(spec)


def _scontrol_hostnames(nodelist: str, env: Mapping[str, str]) -> Optional[List[str]]:
    """``scontrol show hostnames NODELIST``, or None when scontrol is missing or fails (then we parse)."""
    scontrol = shutil.which("scontrol", path=env.get("PATH"))
    if scontrol is None:
        return None
    try:
        result = subprocess.run([scontrol, "show", "hostnames", nodelist], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=SCONTROL_TIMEOUT, env=dict(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("scontrol show hostnames failed (%s); parsing the node list", exc)
        return None
    names = result.stdout.split()
    if result.returncode != 0 or not names:
        log.debug("scontrol show hostnames exited %d (%s); parsing the node list", result.returncode,
                  result.stderr.strip())
        return None
    return names


def allocated_hosts(env: Optional[Mapping[str, str]] = None) -> List[HostInfo]:
    """Every node of the allocation with its task count, in Slurm's order.

    Raises ValueError when the allocation's environment lacks the node list or the counts, or when they
    disagree on the number of nodes.
    """
    env = _environ(env)
    job = env.get("SLURM_JOB_ID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise ValueError(NO_NODELIST.format(job=job))
    spec = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_JOB_CPUS_PER_NODE")
    if not spec:
        raise ValueError(NO_TASKS.format(job=job))
    names = _scontrol_hostnames(nodelist, env) or expand_nodelist(nodelist)
    counts = expand_counts(spec)
    if len(counts) != len(names):
        raise ValueError(f"Slurm's node list {nodelist!r} names {len(names)} nodes but the task counts {spec!r} "
                         f"cover {len(counts)}; give the hosts with -H/--hostfile instead.")
    return [HostInfo(name, count) for name, count in zip(names, counts) if count > 0]


def hosts_string(env: Optional[Mapping[str, str]] = None) -> str:
    """The allocation as a ``-H`` string (``node01:2,node02:2``)."""
    return ",".join(f"{h.hostname}:{h.slots}" for h in allocated_hosts(env))


def num_processes(env: Optional[Mapping[str, str]] = None) -> int:
    """The default ``-np`` inside an allocation: every task Slurm placed."""
    return sum(h.slots for h in allocated_hosts(env))
