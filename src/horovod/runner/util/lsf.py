"""LSF: is this process inside an LSF job, and which hosts and slots did LSF give it (upstream's ``LSFUtils``).

LSF describes a job's allocation in its environment:

- ``LSB_JOBID``: set in every LSF job (its presence is what "inside LSF" means, as upstream);
- ``LSB_MCPU_HOSTS``: ``"hostA 4 hostB 4"``, each host with its slot count (read first);
- ``LSB_DJOB_HOSTFILE``: a file with one line per slot (``hostA`` four times, then ``hostB`` four times);
- ``LSB_HOSTS``: the same list, space separated (LSF leaves it out for large jobs).

On Summit-class machines (IBM CSM, ``jsrun``) the job script runs on a *launch node* (a batch node) that LSF
lists first, with one slot; it runs no ranks, so it is left out of the compute hosts, as upstream's
``LSFUtils.get_compute_hosts`` does. Such a machine is recognised by ``CSM_ALLOCATION_ID`` or by ``jsrun`` on
``PATH``. On a plain LSF cluster the first host is the first execution host (the job script runs there, on
slots of its own) and is kept.

Ranks per host: one per GPU when CSM reports the nodes' GPUs (upstream), else LSF's slot count of the host.
"""
from __future__ import annotations

import io
import logging
import os
import shutil
import subprocess
from typing import Dict, Iterable, List, Mapping, Optional

from ..common.util.hosts import HostInfo

log = logging.getLogger(__name__)

CSM_ALLOCATION_QUERY = "/opt/ibm/csm/bin/csm_allocation_query"
CSM_NODE_QUERY = "/opt/ibm/csm/bin/csm_node_attributes_query"
LSCPU_THREAD_KEY = "Thread(s) per core"
QUERY_TIMEOUT = 60.0

NO_ALLOCATION = (
    "This is an LSF job (LSB_JOBID={job}) but LSF's host list is missing: none of LSB_MCPU_HOSTS, "
    "LSB_DJOB_HOSTFILE, LSB_HOSTS is set. Give the hosts with -H/--hostfile, or run horovodrun inside the job "
    "script that bsub started."
)


def _environ(env: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if env is None else env


def using_lsf(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when this process runs inside an LSF job (``LSB_JOBID`` is set)."""
    return "LSB_JOBID" in _environ(env)


def _merge(pairs: Iterable[tuple]) -> List[HostInfo]:
    """Hosts in first-seen order, the slots of a host listed more than once added up."""
    slots: Dict[str, int] = {}
    for host, count in pairs:
        slots[host] = slots.get(host, 0) + count
    return [HostInfo(host, count) for host, count in slots.items()]


def parse_mcpu_hosts(text: str) -> List[HostInfo]:
    """Parse ``LSB_MCPU_HOSTS`` (``"hostA 4 hostB 2"``); ValueError when it is not host/count pairs."""
    tokens = text.split()
    if not tokens or len(tokens) % 2 or not all(t.isdigit() for t in tokens[1::2]):
        raise ValueError(f"LSB_MCPU_HOSTS={text!r} is not a list of '<host> <slots>' pairs.")
    return _merge((host, int(count)) for host, count in zip(tokens[::2], tokens[1::2]))


def parse_host_list(names: Iterable[str]) -> List[HostInfo]:
    """Hosts and slots from a list with one entry per slot (``LSB_HOSTS``, ``LSB_DJOB_HOSTFILE``'s lines)."""
    return _merge((name.strip(), 1) for name in names if name.strip())


def allocated_hosts(env: Optional[Mapping[str, str]] = None) -> List[HostInfo]:
    """Every host LSF gave the job with its slots, launch node included, in LSF's order.

    Raises ValueError when the job's environment carries no host list.
    """
    env = _environ(env)
    if env.get("LSB_MCPU_HOSTS", "").strip():
        return parse_mcpu_hosts(env["LSB_MCPU_HOSTS"])
    hostfile = env.get("LSB_DJOB_HOSTFILE")
    if hostfile and os.path.isfile(hostfile):
        with open(hostfile) as f:
            hosts = parse_host_list(f)
        if hosts:
            return hosts
    if env.get("LSB_HOSTS", "").strip():
        return parse_host_list(env["LSB_HOSTS"].split())
    raise ValueError(NO_ALLOCATION.format(job=env.get("LSB_JOBID")))


def has_launch_node(env: Optional[Mapping[str, str]] = None) -> bool:
    """True on Summit-class machines, whose job scripts run on a launch node that runs no ranks (CSM or jsrun)."""
    env = _environ(env)
    return "CSM_ALLOCATION_ID" in env or shutil.which("jsrun", path=env.get("PATH")) is not None


def compute_hosts(env: Optional[Mapping[str, str]] = None) -> List[HostInfo]:
    """The hosts that run ranks, with LSF's slots: the allocation less the launch node where there is one."""
    hosts = allocated_hosts(env)
    if has_launch_node(env) and len(hosts) > 1:
        return hosts[1:]
    return hosts


def _query(argv: List[str]) -> dict:
    """Run a CSM query and parse its YAML output; RuntimeError saying what failed."""
    import yaml  # only inside a CSM job: launching stays light

    try:
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=QUERY_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"Could not run {' '.join(argv)}: {exc}") from exc
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with exit code {result.returncode}: "
                           f"{(result.stderr or result.stdout).strip()}")
    data = yaml.safe_load(io.StringIO(result.stdout))
    if not isinstance(data, dict):
        raise RuntimeError(f"{' '.join(argv)} printed no YAML mapping: {result.stdout[:200]!r}")
    return data


def csm_node_info(allocation_id: str) -> Dict[str, int]:
    """Cores (less the 2 per socket that CSM reserves for the system) and GPUs of the allocation's first node,
    from IBM CSM's queries, as upstream's ``LSFUtils.get_allocation_info``."""
    allocation = _query([CSM_ALLOCATION_QUERY, "-a", allocation_id.strip()])
    nodes = sorted(allocation.get("compute_nodes") or [])
    if not nodes:
        raise RuntimeError(f"{CSM_ALLOCATION_QUERY} lists no compute_nodes for allocation {allocation_id}.")
    record = _query([CSM_NODE_QUERY, "-n", nodes[0]])["Record_1"]
    return {"cores": int(record["discovered_cores"]) - int(record["discovered_sockets"]) * 2,
            "gpus": int(record["discovered_gpus"])}


class LSFUtils:
    """Upstream's helper class, reading this process's environment (tests patch its static methods)."""

    _csm_info: Dict[str, int] = {}

    @staticmethod
    def using_lsf() -> bool:
        """True when LSF started this process."""
        return using_lsf()

    @staticmethod
    def _csm() -> Dict[str, int]:
        if not LSFUtils._csm_info and "CSM_ALLOCATION_ID" in os.environ and os.path.exists(CSM_ALLOCATION_QUERY):
            LSFUtils._csm_info = csm_node_info(os.environ["CSM_ALLOCATION_ID"])
        return LSFUtils._csm_info

    @staticmethod
    def get_compute_hosts() -> List[str]:
        """The names of the hosts that run ranks (launch node excluded)."""
        return [h.hostname for h in compute_hosts()]

    @staticmethod
    def get_num_gpus() -> int:
        """GPUs per compute node as CSM reports them; 0 where there is no CSM (nothing to ask)."""
        return LSFUtils._csm().get("gpus", 0)

    @staticmethod
    def get_num_cores() -> int:
        """Cores per compute node: CSM's count, else LSF's slots on the first compute host."""
        return LSFUtils._csm().get("cores") or compute_hosts()[0].slots

    @staticmethod
    def get_num_threads() -> int:
        """Hardware threads per core of the first compute host (``lscpu`` there over ssh, as upstream); 1 when
        it cannot be asked (a warning says so)."""
        host = LSFUtils.get_compute_hosts()[0]
        argv = ["ssh", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "-o",
                "ConnectTimeout=10", host, "LANG=en_US.utf8 lscpu"]
        try:
            output = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=QUERY_TIMEOUT).stdout
        except (OSError, subprocess.TimeoutExpired):
            output = ""
        for line in output.splitlines():
            if LSCPU_THREAD_KEY in line:
                return int(line.split(":", 1)[1].strip())
        log.warning("Could not read the threads per core of %s (lscpu over ssh); assuming 1.", host)
        return 1

    @staticmethod
    def get_slots_per_host() -> int:
        """Ranks per compute host: one per GPU where CSM reports GPUs, else LSF's slots per host."""
        return LSFUtils.get_num_gpus() or compute_hosts()[0].slots

    @staticmethod
    def get_hosts_string() -> str:
        """The ``-H`` string of the compute hosts (``host:slots,...``) used when no hosts are given."""
        gpus = LSFUtils.get_num_gpus()
        return ",".join(f"{h.hostname}:{gpus or h.slots}" for h in compute_hosts())

    @staticmethod
    def get_num_processes() -> int:
        """The default ``-np`` inside LSF: every slot of the compute hosts (one rank per GPU with CSM)."""
        gpus = LSFUtils.get_num_gpus()
        hosts = compute_hosts()
        return len(hosts) * gpus if gpus else sum(h.slots for h in hosts)
