"""A real one-node Slurm cluster on this machine, for the Slurm tests: :func:`slurm_cluster`.

Debian's packages (``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``; ``.ci/system-deps`` installs them)
run from a temporary directory that holds everything: a fresh munge key and munged's socket, ``slurm.conf``
(this machine's hostname as the one node, 4 CPUs whatever the hardware has, ``OverSubscribe=FORCE``,
``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``: no cgroups, no accounting, free ports),
the controller's state and slurmd's spool. ``munged``, ``slurmctld`` and ``slurmd`` run in the foreground as
children of the test process, as root, and are stopped by pid; so are any ``slurmstepd`` still serving a step
of this cluster (found by their sockets in the spool directory). The machine's own Slurm and munge
configuration (``/etc/slurm``, ``/etc/munge``) are never read: every command the tests run gets ``SLURM_CONF``
(:meth:`SlurmCluster.env`).

Why one node: Debian's slurmd is built without ``--enable-multiple-slurmd``, so one machine is one Slurm node;
the network-namespace hosts of ``tests/support/hosts.py`` share this machine's file system and process table,
and a slurmd per namespace would need a node name per namespace resolved by slurmctld (see the report in
``docs/slurm.md``, "Tests").
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
from typing import Dict, Iterator, List, Optional

import psutil

TOOLS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "sbatch", "scontrol", "sinfo")
START_TIMEOUT = 30.0
CPUS = 4


class SlurmUnavailable(RuntimeError):
    """Slurm or munge is not installed, or its daemons did not come up (the message says which and why)."""


@dataclass
class SlurmCluster:
    """A running cluster: its directory, ``slurm.conf``, node name and the daemons' processes."""

    root: Path
    conf: Path
    node: str
    procs: Dict[str, subprocess.Popen]

    def env(self, base: Optional[Dict[str, str]] = None, home: Optional[Path] = None) -> Dict[str, str]:
        """An environment for Slurm commands against this cluster (``SLURM_CONF``; ``HOME`` if given)."""
        env = dict(os.environ if base is None else base)
        env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))}
        env["SLURM_CONF"] = str(self.conf)
        if home is not None:
            env["HOME"] = str(home)
        return env

    def stepd_pids(self) -> List[int]:
        """The slurmstepd processes serving steps of this cluster (they listen in its spool directory)."""
        spool = str(self.root / "spool")
        pids = set()
        for conn in psutil.net_connections(kind="unix"):
            if conn.pid and isinstance(conn.laddr, str) and conn.laddr.startswith(spool):
                pids.add(conn.pid)
        return sorted(pids)


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


def _conf_text(root: Path, node: str) -> str:
    return "\n".join([
        "ClusterName=hvdtest", f"SlurmctldHost={node}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={root}/munge/munge.socket",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MpiDefault=none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides", "ReturnToService=2", "MailProg=/bin/true",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={CPUS} State=UNKNOWN",
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


def _node_idle(env: Dict[str, str], node: str) -> bool:
    result = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True, env=env,
                            timeout=10)
    return result.returncode == 0 and result.stdout.strip().startswith("idle")


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
    cluster.procs["slurmd"] = _start("slurmd", ["slurmd", "-D", "-f", str(cluster.conf)], root, env)
    _wait_for(lambda: _node_idle(env, cluster.node), f"node {cluster.node} became idle", cluster.procs, root)


@contextlib.contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd on this machine; stop them all and remove every file on exit."""
    problem = missing_requirements()
    if problem:
        raise SlurmUnavailable(problem)
    root = Path(tempfile.mkdtemp(prefix="hvd-slurm-"))
    root.chmod(0o755)
    for sub in ("state", "spool", "munge", "home"):
        (root / sub).mkdir()
    (root / "munge").chmod(0o711)
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(_conf_text(root, node))
    cluster = SlurmCluster(root, conf, node, {})
    env = cluster.env()
    try:
        _start_daemons(cluster, env)
        yield cluster
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["scancel", "--full", "--quiet", "--user", "root"], env=env, timeout=10,
                           capture_output=True)
        for name in ("slurmd", "slurmctld", "munged"):
            if name in cluster.procs:
                stepds = cluster.stepd_pids() if name == "slurmd" else []
                _stop(cluster.procs[name])
                _kill_pids(stepds)
        shutil.rmtree(root, ignore_errors=True)
