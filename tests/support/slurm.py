"""A real Slurm cluster on this machine, for the Slurm tests: :func:`slurm_cluster`.

Debian's packages (``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``; ``.ci/system-deps`` installs them)
run from a temporary directory that holds everything: a fresh munge key and munged's socket, ``slurm.conf``
(4 CPUs per node by default whatever the hardware has, ``OverSubscribe=FORCE``,
``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``: no cgroups, no accounting, free ports), the
controller's state and one spool directory per node. ``munged``, ``slurmctld`` and the ``slurmd`` of every
node run in the foreground as children of the test process, as root, and are stopped by pid; so are any
``slurmstepd`` still serving a step (found by the cluster's log files they hold open). The machine's own Slurm
and munge configuration (``/etc/slurm``, ``/etc/munge``) are never read: every command the tests run gets
``SLURM_CONF`` (:meth:`SlurmCluster.env`).

Nodes: by default this machine is the one node. Given :class:`SlurmNode` s with a network namespace (the hosts
of ``tests/support/hosts.py``), each node's slurmd runs in its namespace under its own hostname (``slurmd -N``),
and slurmctld listens on the bridge's address in the root namespace; munged's socket is a file, which every
namespace reaches. The tasks of a step run in their node's namespace, so a job spans real hosts.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import psutil

TOOLS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "sbatch", "scontrol", "sinfo")
START_TIMEOUT = 30.0
CPUS = 4


class SlurmUnavailable(RuntimeError):
    """Slurm or munge is not installed, or its daemons did not come up (the message says which and why)."""


@dataclass(frozen=True)
class SlurmNode:
    """One Slurm node: its name, the address slurmctld and srun reach its slurmd at, its CPUs, and the network
    namespace it runs in (None: this machine itself)."""

    name: str
    address: str
    cpus: int = CPUS
    netns: Optional[str] = None


@dataclass
class SlurmCluster:
    """A running cluster: its directory, ``slurm.conf``, nodes and the daemons' processes."""

    root: Path
    conf: Path
    nodes: List[SlurmNode]
    procs: Dict[str, subprocess.Popen]

    @property
    def node(self) -> str:
        """The first node's name."""
        return self.nodes[0].name

    def env(self, base: Optional[Dict[str, str]] = None, home: Optional[Path] = None) -> Dict[str, str]:
        """An environment for Slurm commands against this cluster (``SLURM_CONF``; ``HOME`` if given)."""
        env = dict(os.environ if base is None else base)
        env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))}
        env["SLURM_CONF"] = str(self.conf)
        if home is not None:
            env["HOME"] = str(home)
        return env

    def stepd_pids(self) -> List[int]:
        """The slurmstepd processes serving steps of this cluster (they hold its slurmd log files open)."""
        pids = []
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] != "slurmstepd":
                continue
            with contextlib.suppress(psutil.Error):
                if any(f.path.startswith(str(self.root)) for f in proc.open_files()):
                    pids.append(proc.pid)
        return pids


def missing_requirements() -> Optional[str]:
    """What is missing to run the cluster here, or None."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}")]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "the Slurm daemons run as root here; run the tests as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf_text(root: Path, controller: str, controller_addr: str, nodes: List[SlurmNode]) -> str:
    node_lines = [f"NodeName={n.name} NodeAddr={n.address} CPUs={n.cpus} State=UNKNOWN" for n in nodes]
    return "\n".join([
        "ClusterName=hvdtest", f"SlurmctldHost={controller}({controller_addr})", "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={root}/munge/munge.socket",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MpiDefault=none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides", "ReturnToService=2", "MailProg=/bin/true",
        *node_lines,
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
    ]) + "\n"


def _start(name: str, argv: List[str], root: Path, env: Dict[str, str]) -> subprocess.Popen:
    out = open(root / f"{name}.out", "wb")
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
    finally:
        out.close()


def _wait_for(check, what: str, procs: Dict[str, subprocess.Popen], root: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                log = (root / f"{name}.out").read_text(errors="replace")[-3000:]
                raise SlurmUnavailable(f"{name} exited with {proc.returncode} before {what}:\n{log}")
        if check():
            return
        time.sleep(0.1)
    raise SlurmUnavailable(f"{what} did not happen within {START_TIMEOUT:.0f}s; see {root}/*.out")


def _nodes_idle(env: Dict[str, str], nodes: List[SlurmNode]) -> bool:
    result = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=env,
                            timeout=10)
    states = dict(line.split() for line in result.stdout.splitlines() if len(line.split()) == 2)
    return result.returncode == 0 and all(states.get(n.name, "").startswith("idle") for n in nodes)


def _stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _kill_pids(pids: List[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).wait(timeout=5)


def _start_daemons(cluster: SlurmCluster, env: Dict[str, str]) -> None:
    root = cluster.root
    munge = root / "munge"
    cluster.procs["munged"] = _start("munged", [
        "munged", "--foreground", "--force", f"--socket={munge}/munge.socket", f"--key-file={munge}/munge.key",
        f"--log-file={munge}/munged.log", f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/seed",
    ], root, env)
    _wait_for(lambda: (munge / "munge.socket").exists(), "munged's socket appeared", cluster.procs, root)
    cluster.procs["slurmctld"] = _start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(cluster.conf)], root, env)
    for node in cluster.nodes:
        slurmd = ["slurmd", "-D", "-N", node.name, "-f", str(cluster.conf)]
        (root / "spool" / node.name).mkdir()
        if node.netns is not None:
            # Under the node's own hostname, as tests/support/hosts.py runs sshd. `ip netns exec` mounts a
            # fresh /sys in a mount namespace of its own, without the cgroup (v1) mounts that slurmd's cgroup
            # plugin insists on finding even when unused (proctrack/linuxproc, task/none): mount a stand-in
            # there (a tmpfs and the named systemd hierarchy), seen by this node's processes only.
            script = ('hostname "$1" && shift && mount -t tmpfs cgroup /sys/fs/cgroup'
                      ' && mkdir /sys/fs/cgroup/systemd'
                      ' && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd && exec "$@"')
            slurmd = ["ip", "netns", "exec", node.netns, "unshare", "--uts", "--", "sh", "-c", script, "sh",
                      node.name, *slurmd]
        cluster.procs[f"slurmd-{node.name}"] = _start(f"slurmd-{node.name}", slurmd, root, env)
    _wait_for(lambda: _nodes_idle(env, cluster.nodes), "every node became idle", cluster.procs, root)


@contextlib.contextmanager
def slurm_cluster(nodes: Optional[Sequence[SlurmNode]] = None, controller_addr: str = "127.0.0.1"
                  ) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld (on ``controller_addr``) and a slurmd per node (default: this machine as the one
    node); stop them all by pid and remove every file on exit."""
    problem = missing_requirements()
    if problem:
        raise SlurmUnavailable(problem)
    root = Path(tempfile.mkdtemp(prefix="hvd-slurm-"))
    root.chmod(0o755)
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir()
    (root / "munge").chmod(0o711)
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    controller = socket.gethostname().split(".")[0]
    nodes = list(nodes or [SlurmNode(controller, "127.0.0.1")])
    conf = root / "slurm.conf"
    conf.write_text(_conf_text(root, controller, controller_addr, nodes))
    cluster = SlurmCluster(root, conf, nodes, {})
    env = cluster.env()
    try:
        _start_daemons(cluster, env)
        yield cluster
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["scancel", "--full", "--quiet", "--user", "root"], env=env, timeout=10,
                           capture_output=True)
        stepds = cluster.stepd_pids()
        for name in [n for n in cluster.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]:
            if name in cluster.procs:
                _stop(cluster.procs[name])
        _kill_pids(stepds + cluster.stepd_pids())
        shutil.rmtree(root, ignore_errors=True)
