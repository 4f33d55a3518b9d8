"""Several real hosts on this machine, for multi-host and elastic tests: :func:`namespace_hosts`.

Each host is a network namespace with its own hostname and address, joined to a bridge by a veth pair, and runs
its own ``sshd``, so that ``horovodrun`` starts ranks on it over real ssh::

    root namespace (launcher)  10.213.X.254 on bridge hvbr<token>
        |-- veth hv<token>h1 <-> eth0 10.213.X.1  in netns hvd-<token>-1  (hostname hvd-host-1, sshd on :22)
        |-- veth hv<token>h2 <-> eth0 10.213.X.2  in netns hvd-<token>-2  (hostname hvd-host-2, sshd on :22)

``X`` is drawn at random (and checked free) per run. ``horovodrun`` is given the hosts' *addresses*
(:meth:`HostCluster.hosts_arg`), which need no name resolution in the root namespace; inside each namespace every
host name also resolves, through a per-namespace ``/etc/netns/<netns>/hosts`` that ``ip netns exec`` mounts over
``/etc/hosts`` for the host's sshd and everything it starts. A "host failure" is a cut link
(:meth:`Host.cut`, ``ip link set ... down``) or every process of the host killed (:meth:`Host.kill_all`);
:meth:`Host.shape` adds latency or a rate limit with ``tc``.

One ed25519 key pair is made per run, and each sshd gets its own host key, config (``PermitRootLogin
prohibit-password``, ``StrictModes no``, the run's ``authorized_keys``) and pid file, all in a temporary directory:
the machine's own sshd keys and config are never read. The launcher's ``ssh`` must not write to root's
``~/.ssh/known_hosts`` either: :meth:`HostCluster.launcher_env` puts first on ``PATH`` an ``ssh`` that runs
the real one with ``-F <run's ssh_config>`` (the run's known_hosts, identity and user).

One cluster exists at a time on the machine: :func:`namespace_hosts` holds an exclusive lock (``flock`` on
``LOCK_PATH``) from before it picks a subnet until everything it made is removed, so that two pytest workers
never race for the same subnet or remove the shared ``/etc/netns`` and ``/run/sshd`` under each other (the
suite also runs every test that makes hosts on one worker, tests/conftest.py).

Everything made is removed on exit, even when the body raised: the processes in each namespace (listed with
``ip netns pids``, killed by pid), namespaces, veths, bridge, ``/etc/netns`` entries and the temporary directory.

Needs root, ``ip``, ``sshd`` (openssh-server), ``ssh``/``ssh-keygen`` (openssh-client), ``unshare`` and
``hostname``; without them :func:`namespace_hosts` raises :class:`HostsUnavailable`, which
:func:`hosts_or_skip` turns into a visible skip, or a failure when ``HOROVOD_TEST_REQUIRE_HOSTS=1`` (``.ci/run``
sets it, and installs what is needed with ``.ci/system-deps``).
"""
from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

REQUIRE_ENV = "HOROVOD_TEST_REQUIRE_HOSTS"
SSH_PORT = 22
SUBNET_PREFIX = "10.213"
NETNS_ETC = Path("/etc/netns")
SSHD_PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it (the package's service makes it)
LOCK_PATH = Path(tempfile.gettempdir()) / "horovod-test-namespace-hosts.lock"
_TOOLS = ("ip", "ssh", "ssh-keygen", "unshare", "hostname", "tc")


class HostsUnavailable(RuntimeError):
    """This machine cannot make namespace hosts (not root, or a tool is missing); the message says what to do."""


class ShapingUnavailable(RuntimeError):
    """This kernel lacks the queueing discipline a :meth:`Host.shape` call needs (netem for a delay)."""


# A tc rate's unit -> bytes per second for one of it (tc's own meanings: "bit" units are bits, "bps" bytes).
_RATE_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
               "kibit": 1024 / 8, "mibit": 1024 ** 2 / 8, "gibit": 1024 ** 3 / 8,
               "bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "kibps": 1024, "mibps": 1024 ** 2}
BUCKET_SECONDS = 1e-3  # tokens a tbf bucket holds: 1 ms of the rate (1 Mbit at 1 Gbit/s)
QUEUE_SECONDS = 2e-3   # data a tbf queues beyond the bucket: 2 ms of the rate
MIN_BURST_BYTES = 4096  # at low rates: a few packets (tc's old 32 kbit)
MIN_LIMIT_BYTES = 64 * 1024


def rate_bytes_per_second(rate: str) -> float:
    """A tc rate such as ``"1gbit"``, ``"500kbit"`` or ``"10mbps"`` in bytes per second."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([a-z]*)\s*", rate.lower())
    if match is None or (match.group(2) or "bit") not in _RATE_UNITS:
        raise ValueError(f"rate {rate!r} is not a tc rate: give a number and one of {', '.join(_RATE_UNITS)}")
    return float(match.group(1)) * _RATE_UNITS[match.group(2) or "bit"]


def tbf_bucket(rate: str) -> Tuple[int, int]:
    """``tbf``'s burst and queue limit, in bytes, for ``rate``: 1 ms of tokens, and a queue of 2 ms more.

    The bucket must be deep enough that the qdisc is not starved between dequeues (tc's classic 32 kbit, 33 µs
    at 1 Gbit/s, held even one TCP stream to 84 % and two opposite streams to 65-70 %), and the queue short,
    so that one stream's ACKs do not wait behind hundreds of ms of the opposite stream's data (``latency
    400ms`` queued 50 MB at 1 Gbit/s). With 1 Mbit and 2 ms at 1 Gbit/s, raw TCP reaches about 96 % of the
    link one way and 95 % both ways at once (docs/benchmarks.md, "Across hosts at 1 Gbit/s"), and the average
    rate stays the limit.
    """
    per_second = rate_bytes_per_second(rate)
    burst = max(MIN_BURST_BYTES, int(per_second * BUCKET_SECONDS))
    return burst, max(MIN_LIMIT_BYTES, burst + int(per_second * QUEUE_SECONDS))


def _sshd_path() -> Optional[str]:
    return shutil.which("sshd") or next((p for p in ("/usr/sbin/sshd", "/sbin/sshd") if os.path.exists(p)), None)


def missing_requirements() -> Optional[str]:
    """Why namespace hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "namespace hosts need root (ip netns, veth, bridge); run the suite as root, as .ci/run does"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if _sshd_path() is None:
        missing.append("sshd")
    if missing:
        return (f"namespace hosts need {', '.join(missing)}: install openssh-server, openssh-client and iproute2 "
                "(.ci/system-deps does)")
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS``; on failure (with ``check``) raise RuntimeError carrying ip's error."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def netns_pids(netns: str) -> List[int]:
    """The pids of every process in network namespace ``netns`` (``ip netns pids``); [] when it is gone."""
    proc = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def _kill_netns_processes(netns: str, timeout: float = 10.0) -> List[int]:
    """SIGKILL every process in ``netns`` until none is left (new ones may appear while killing); the survivors."""
    deadline = time.monotonic() + timeout
    pids = netns_pids(netns)
    while pids and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        pids = netns_pids(netns)
    return pids


def _wait_port(address: str, port: int, proc: subprocess.Popen, log_file: Path, timeout: float = 15.0) -> None:
    """Wait until ``address:port`` accepts connections; RuntimeError with sshd's log if it exits or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd on {address} exited with {proc.returncode}: {log_file.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"sshd on {address}:{port} did not accept connections within {timeout:.0f}s: "
                       f"{log_file.read_text()[-2000:]}")


@dataclass
class Host:
    """One namespace host: its hostname, netns, address, sshd, and the root-namespace end of its link."""

    name: str
    netns: str
    address: str
    veth: str
    workdir: Path
    cluster: HostCluster = field(repr=False)
    port: int = SSH_PORT
    sshd: Optional[subprocess.Popen] = field(default=None, repr=False)

    def ssh_command(self, command: str, connect_timeout: float = 5.0) -> List[str]:
        """The argv that runs ``command`` (a shell string) on this host over ssh with the run's key and config."""
        return ["ssh", "-F", str(self.cluster.ssh_config), "-o", f"ConnectTimeout={connect_timeout:g}",
                "-p", str(self.port), self.address, command]

    def run(self, command: str, timeout: float = 30.0, connect_timeout: float = 5.0,
            check: bool = False) -> subprocess.CompletedProcess:
        """Run ``command`` on this host over ssh; with ``check``, raise CalledProcessError when it fails."""
        return subprocess.run(self.ssh_command(command, connect_timeout), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=check)

    def start_sshd(self) -> None:
        """Start this host's sshd (in its netns, under its own hostname) and wait until it accepts connections."""
        config = self.workdir / "sshd_config"
        log_file = self.workdir / "sshd.log"
        script = 'hostname "$1" && exec "$2" -D -e -f "$3"'
        argv = ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--", "sh", "-c", script, "sh",
                self.name, _sshd_path() or "sshd", str(config)]
        with open(log_file, "ab") as out:
            # ip netns exec, unshare and sh all exec: the Popen's pid is sshd's.
            self.sshd = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        _wait_port(self.address, self.port, self.sshd, log_file)

    def pids(self) -> List[int]:
        """Every process now in this host's namespace (its sshd, ssh sessions, ranks)."""
        return netns_pids(self.netns)

    def kill_all(self) -> None:
        """A host failure: SIGKILL every process of this host (sshd included), by pid. :meth:`start_sshd` revives."""
        left = _kill_netns_processes(self.netns)
        if self.sshd is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.sshd.wait(timeout=5)
        if left:
            raise RuntimeError(f"processes {left} in {self.netns} survived SIGKILL")

    def cut(self) -> None:
        """A network failure: take this host's link down (its processes keep running, unreachable)."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        """Bring this host's link back up after :meth:`cut`."""
        _ip("link", "set", self.veth, "up")

    def shape(self, delay_ms: Optional[float] = None, rate: Optional[str] = None) -> None:
        """Add latency (ms) and/or a rate limit (tc syntax, e.g. ``"10mbit"``) to traffic *towards* this host.

        Both None removes the shaping. A rate alone uses ``tc``'s ``tbf`` with the bucket of
        :func:`tbf_bucket`; a delay needs ``netem`` (the sch_netem kernel module), and ShapingUnavailable says so
        when this kernel lacks it.
        """
        subprocess.run(["tc", "qdisc", "del", "dev", self.veth, "root"], capture_output=True, timeout=30)
        if delay_ms is None and rate is None:
            return
        args = ["tc", "qdisc", "replace", "dev", self.veth, "root"]
        if delay_ms is None:
            burst, limit = tbf_bucket(rate)
            args += ["tbf", "rate", rate, "burst", str(burst), "limit", str(limit)]
        else:
            args += ["netem", "delay", f"{delay_ms:g}ms"] + (["rate", rate] if rate is not None else [])
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            error = ShapingUnavailable if "qdisc kind is unknown" in proc.stderr else RuntimeError
            raise error(f"`{' '.join(args)}` failed: {proc.stderr.strip()} (a delay needs the sch_netem module)")


@dataclass
class HostCluster:
    """The hosts of one run and what a launcher needs to reach them (see the module docstring)."""

    hosts: List[Host]
    bridge: str
    gateway: str
    workdir: Path

    @property
    def identity_file(self) -> Path:
        return self.workdir / "id_ed25519"

    @property
    def ssh_config(self) -> Path:
        return self.workdir / "ssh_config"

    @property
    def bin_dir(self) -> Path:
        """Holds the ``ssh`` wrapper that adds ``-F ssh_config`` (put first on the launcher's PATH)."""
        return self.workdir / "bin"

    def hosts_arg(self, slots: int) -> str:
        """horovodrun's ``-H``: every host's address with ``slots`` slots, e.g. ``10.213.7.1:2,10.213.7.2:2``."""
        return ",".join(f"{h.address}:{slots}" for h in self.hosts)

    def launcher_args(self) -> List[str]:
        """horovodrun options that reach the hosts: ``--ssh-port`` and ``--ssh-identity-file``."""
        return ["--ssh-port", str(SSH_PORT), "--ssh-identity-file", str(self.identity_file)]

    def launcher_env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """Environment for a launcher: ``PATH`` starting with :attr:`bin_dir` (the run's known_hosts, not root's)."""
        env = dict(base or {})
        env["PATH"] = os.pathsep.join([str(self.bin_dir), env.get("PATH") or os.environ.get("PATH", "")])
        return env


    def python_pids(self) -> List[int]:
        """The Python processes (ranks) now running on any of the hosts."""
        import psutil

        found = []
        for host in self.hosts:
            for pid in host.pids():
                with contextlib.suppress(psutil.Error):
                    if psutil.Process(pid).name().startswith("python"):
                        found.append(pid)
        return found

    @contextlib.contextmanager
    def dump_stacks_after(self, seconds: float) -> Iterator[None]:
        """Send SIGUSR1 to every Python process on the hosts if the body still runs after ``seconds``.

        tests/support/launch.py's timeout signals the launcher's children, which for remote ranks are ssh
        clients: give this a few seconds less than the job's timeout so that ranks that registered faulthandler
        on SIGUSR1 (as tests/parallel's conftest does) print their stacks through ssh into the job's output.
        """
        def dump() -> None:
            for pid in self.python_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)

        timer = threading.Timer(seconds, dump)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()


def _free_subnet(attempts: int = 50) -> int:
    """A third octet X such that no interface here has an address in 10.213.X.0/24."""
    used = _ip("-o", "-4", "addr", "show").stdout
    for _ in range(attempts):
        x = random.randint(1, 254)
        net = ipaddress.ip_network(f"{SUBNET_PREFIX}.{x}.0/24")
        if not any(ipaddress.ip_address(w.split("/")[0]) in net for w in used.split() if w.count(".") == 3
                   and "/" in w):
            return x
    raise HostsUnavailable(f"no free {SUBNET_PREFIX}.X.0/24 subnet on this machine")


def _keygen(path: Path, comment: str) -> str:
    """Make an ed25519 key pair without passphrase at ``path``; its public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=30)
    return Path(f"{path}.pub").read_text().strip()


def _write_sshd_config(host: Host, authorized_keys: Path) -> str:
    """Write the host's key and sshd_config into its directory; the known_hosts line for it."""
    host_key = host.workdir / "ssh_host_ed25519_key"
    public = _keygen(host_key, host.name)
    (host.workdir / "sshd_config").write_text("\n".join([
        f"Port {host.port}", f"ListenAddress {host.address}", f"HostKey {host_key}",
        f"PidFile {host.workdir / 'sshd.pid'}", f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "StrictModes no", "UsePAM no", "PrintMotd no", "X11Forwarding no",
        "MaxStartups 100:30:200", "MaxSessions 100", "LogLevel ERROR", "",
    ]))
    key_type, key = public.split()[:2]
    return f"{host.address} {key_type} {key}"


def _write_client_files(cluster: HostCluster, known_hosts: Sequence[str]) -> None:
    """The launcher side: ssh_config (run's key, known_hosts, root user) and the ``ssh`` wrapper using it."""
    (cluster.workdir / "known_hosts").write_text("\n".join(known_hosts) + "\n")
    cluster.ssh_config.write_text("\n".join([
        "Host *", "  User root", f"  IdentityFile {cluster.identity_file}", "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {cluster.workdir / 'known_hosts'}", "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes", "  BatchMode yes", "  LogLevel ERROR", "",
    ]))
    cluster.bin_dir.mkdir()
    wrapper = cluster.bin_dir / "ssh"
    real_ssh = shutil.which("ssh")
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(str(real_ssh))} -F {shlex.quote(str(cluster.ssh_config))}"
                       ' "$@"\n')
    wrapper.chmod(0o755)


class _Teardown:
    """Undo steps recorded while building, run in reverse on exit; every step runs even when one fails."""

    def __init__(self) -> None:
        self._steps: List[tuple] = []

    def push(self, what: str, fn, *args) -> None:
        self._steps.append((what, fn, args))

    def run(self) -> None:
        errors = []
        for what, fn, args in reversed(self._steps):
            try:
                fn(*args)
            except Exception as exc:  # keep cleaning up, report every failure at the end
                errors.append(f"{what}: {exc}")
        if errors:
            raise RuntimeError("cleaning up namespace hosts failed:\n  " + "\n  ".join(errors))


def _remove_netns(netns: str) -> None:
    left = _kill_netns_processes(netns)
    if left:
        raise RuntimeError(f"processes {left} in {netns} survived SIGKILL")
    _ip("netns", "del", netns, check=False)


def _remove_link(name: str) -> None:
    if _ip("link", "show", name, check=False).returncode == 0:
        _ip("link", "del", name)


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def _make_bridge(teardown: _Teardown, token: str, gateway: str) -> str:
    bridge = f"hvbr{token}"
    _ip("link", "add", "name", bridge, "type", "bridge")
    teardown.push(f"delete bridge {bridge}", _remove_link, bridge)
    _ip("addr", "add", f"{gateway}/24", "dev", bridge)
    _ip("link", "set", bridge, "up")
    return bridge


def _make_host(teardown: _Teardown, cluster: HostCluster, index: int, token: str, subnet: int,
               hosts_file: str) -> Host:
    """Namespace, /etc/netns hosts file, veth pair on the bridge, addresses: one host, sshd not yet started."""
    netns, veth, peer = f"hvd-{token}-{index}", f"hv{token}h{index}", f"hv{token}p{index}"
    host = Host(name=f"hvd-host-{index}", netns=netns, address=f"{SUBNET_PREFIX}.{subnet}.{index}", veth=veth,
                workdir=cluster.workdir / f"host-{index}", cluster=cluster)
    host.workdir.mkdir()
    _ip("netns", "add", netns)
    teardown.push(f"delete netns {netns}", _remove_netns, netns)
    etc = NETNS_ETC / netns
    etc.mkdir(parents=True)
    teardown.push(f"remove {etc}", shutil.rmtree, etc)
    (etc / "hosts").write_text(hosts_file)
    _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
    teardown.push(f"delete veth {veth}", _remove_link, veth)
    _ip("link", "set", peer, "netns", netns)
    _ip("-n", netns, "link", "set", peer, "name", "eth0")
    _ip("-n", netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
    _ip("-n", netns, "link", "set", "eth0", "up")
    _ip("-n", netns, "link", "set", "lo", "up")
    _ip("link", "set", veth, "master", cluster.bridge)
    _ip("link", "set", veth, "up")
    return host


def _build(teardown: _Teardown, count: int) -> HostCluster:
    token = secrets.token_hex(3)
    subnet = _free_subnet()
    gateway = f"{SUBNET_PREFIX}.{subnet}.254"
    workdir = Path(tempfile.mkdtemp(prefix=f"hvd-hosts-{token}-"))
    teardown.push(f"remove {workdir}", shutil.rmtree, workdir, True)
    if not NETNS_ETC.exists():
        NETNS_ETC.mkdir()
        teardown.push(f"remove {NETNS_ETC}", lambda: NETNS_ETC.rmdir() if not any(NETNS_ETC.iterdir()) else None)
    if not SSHD_PRIVSEP_DIR.exists():
        SSHD_PRIVSEP_DIR.mkdir(mode=0o755)
        teardown.push(f"remove {SSHD_PRIVSEP_DIR}", SSHD_PRIVSEP_DIR.rmdir)
    cluster = HostCluster(hosts=[], bridge=_make_bridge(teardown, token, gateway), gateway=gateway, workdir=workdir)
    names = [(f"{SUBNET_PREFIX}.{subnet}.{i}", f"hvd-host-{i}") for i in range(1, count + 1)]
    hosts_file = "127.0.0.1 localhost\n::1 localhost\n" + "".join(f"{a} {n}\n" for a, n in names)
    public = _keygen(cluster.identity_file, f"horovod-test-{token}")
    authorized_keys = workdir / "authorized_keys"
    authorized_keys.write_text(public + "\n")
    known_hosts = []
    for index in range(1, count + 1):
        host = _make_host(teardown, cluster, index, token, subnet, hosts_file)
        cluster.hosts.append(host)
        known_hosts.append(_write_sshd_config(host, authorized_keys))
    _write_client_files(cluster, known_hosts)
    for host in cluster.hosts:
        host.start_sshd()
        teardown.push(f"stop sshd of {host.name}", _reap, host.sshd)
    return cluster


@contextlib.contextmanager
def namespace_hosts(count: int) -> Iterator[HostCluster]:
    """``count`` namespace hosts with sshd running, removed on exit (see the module docstring).

    Raises HostsUnavailable when this machine cannot make them (not root, tools missing, no netns support).
    """
    reason = missing_requirements()
    if reason:
        raise HostsUnavailable(reason)
    with _machine_lock(), _built(count) as cluster:
        yield cluster


_HELD = threading.local()


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Hold LOCK_PATH exclusively until the file closes (re-entrant within a thread: a test may nest clusters)."""
    if getattr(_HELD, "held", False):
        yield
        return
    with open(LOCK_PATH, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process's namespace hosts to be removed (%s)", LOCK_PATH)
            fcntl.flock(lock, fcntl.LOCK_EX)
        _HELD.held = True
        try:
            yield
        finally:
            _HELD.held = False


@contextlib.contextmanager
def _built(count: int) -> Iterator[HostCluster]:
    teardown = _Teardown()
    try:
        try:
            cluster = _build(teardown, count)
        except RuntimeError as exc:
            if any(sign in str(exc) for sign in ("netns add", "type bridge", "Operation not permitted")):
                raise HostsUnavailable(f"cannot make network namespaces and links here: {exc}") from exc
            raise
        yield cluster
    finally:
        teardown.run()


@contextlib.contextmanager
def hosts_or_skip(count: int) -> Iterator[HostCluster]:
    """:func:`namespace_hosts` for a test: skip (with the reason) when unavailable, fail if REQUIRE_ENV is 1."""
    import pytest

    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(namespace_hosts(count))
        except HostsUnavailable as exc:
            if os.environ.get(REQUIRE_ENV) == "1":
                pytest.fail(f"{REQUIRE_ENV}=1 but namespace hosts cannot be made: {exc}")
            pytest.skip(f"namespace hosts unavailable: {exc}")
        yield cluster
