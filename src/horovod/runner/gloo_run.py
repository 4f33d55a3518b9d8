"""Start the ranks of a static job with the built-in controller (upstream's Gloo mode; module name kept).

For every slot of the plan this builds the rank's environment (topology, rendezvous address, tunables) and
its command: the user's command itself for hosts that are this machine, ``ssh`` for the others. Then it runs
them all under :func:`horovod.runner.process.run_workers` (output prefixing, fail-fast).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import shlex
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Union

from horovod.common.elastic_rendezvous import WORKER_ID_ENV as ELASTIC_WORKER_ENV
from horovod.common.wire import SECRET_ENV

from . import monitor, ssh
from .common.util import network
from .common.util.env import exportable_env
from .common.util.hosts import SlotInfo, get_host_assignments, parse_hosts
from .common.util.network import is_local_host
from .common.util.settings import Settings
from .process import OutputSink, WorkerProcess, WorkerSpec, pad_rank, run_workers
from .rendezvous import RendezvousServer

log = logging.getLogger(__name__)


# The topology variables the launcher gives each rank (slot_env); a nested launch drops inherited ones.
RANK_VARIABLES = ("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                  "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")


def slot_env(slot: SlotInfo) -> Dict[str, str]:
    """The topology variables of one rank (the names in RANK_VARIABLES)."""
    return {
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def job_env(rendezvous_addr: str, rendezvous_port: int, settings: Settings) -> Dict[str, str]:
    """The variables every rank of the job gets besides its topology (never includes the secret)."""
    env = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_START_TIMEOUT": _number(settings.start_timeout),
        "PYTHONUNBUFFERED": "1",
    }
    if settings.nics:
        env["HOROVOD_GLOO_IFACE"] = settings.nics[0]
        env["NCCL_SOCKET_IFNAME"] = ",".join(settings.nics)
    if settings.tcp_flag:
        env["NCCL_IB_DISABLE"] = "1"
    return env


def _display(hostname: str, variables: Mapping[str, str], command: Sequence[str], remote: bool) -> str:
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())
    program = " ".join(shlex.quote(a) for a in command)
    text = f"env {shown} {program}"
    return f"ssh {hostname} {shlex.quote(text)}" if remote else text


def worker_spec(slot: SlotInfo, command: Sequence[str], base_env: Mapping[str, str],
                common_env: Mapping[str, str], secret: str, settings: Settings,
                cwd: Optional[str] = None, ssh_options: Sequence[str] = ()) -> WorkerSpec:
    """How to start the rank of ``slot``: directly when its host is this machine, else over ssh.

    The secret goes into the local process's environment, or onto ssh's stdin for a remote one; it is never
    part of the argv or of ``display``.
    """
    cwd = cwd or os.getcwd()
    variables = {**slot_env(slot), **common_env}
    if is_local_host(slot.hostname):
        env = {k: v for k, v in base_env.items() if k != SECRET_ENV}
        env.update(variables)
        env[SECRET_ENV] = secret
        return WorkerSpec(slot.rank, slot.hostname, list(command), env,
                          _display(slot.hostname, variables, command, remote=False), cwd=cwd,
                          command_text=shlex.join(command))
    forwarded = exportable_env(base_env)
    forwarded.update(variables)
    argv = ssh.build_ssh_command(slot.hostname, command, forwarded, cwd, settings.ssh_port,
                                 settings.ssh_identity_file, ssh_options)
    local_env = {k: v for k, v in base_env.items() if k != SECRET_ENV}
    return WorkerSpec(slot.rank, slot.hostname, argv, local_env,
                      _display(slot.hostname, variables, command, remote=True),
                      stdin_data=ssh.secret_stdin(secret), command_text=shlex.join(command), local=False)


def host_alloc_plan(settings: Settings) -> List[SlotInfo]:
    """Exactly ``num_proc`` slots from ``settings.hosts`` (ValueError when there are fewer)."""
    return get_host_assignments(parse_hosts(settings.hosts), settings.num_proc, settings.num_proc)


def reach_hosts(settings: Settings, plan: Sequence[SlotInfo]) -> str:
    """Check ssh to the plan's remote hosts (if any) and return the address at which the ranks reach the
    launcher's rendezvous: the route to the remote hosts (or ``--network-interface``), else loopback."""
    remote = network.filter_local_addresses(list(dict.fromkeys(slot.hostname for slot in plan)))
    if not remote:
        return "127.0.0.1"
    log.info("Checking ssh on all remote hosts: %s", ", ".join(remote))
    ssh.check_all_hosts_ssh(remote, settings.ssh_port, settings.ssh_identity_file, timeout=settings.start_timeout)
    return network.get_driver_ip(settings.nics, remote)


def launch_gloo(command: Sequence[str], settings: Settings, env: Mapping[str, str],
                rendezvous: RendezvousServer, rendezvous_addr: str) -> None:
    """Start every rank of the job and wait for them (see :func:`horovod.runner.process.run_workers`).

    ``env`` is the launcher's environment with the tunables already applied; ``rendezvous`` must be started.
    """
    plan = host_alloc_plan(settings)
    rendezvous.init(plan)
    common = job_env(rendezvous_addr, rendezvous.port, settings)
    specs = [worker_spec(slot, command, env, common, rendezvous.secret, settings) for slot in plan]
    if settings.verbose:
        for spec in specs:
            log.info("rank %d on %s: %s", spec.rank, spec.hostname, spec.display)
    if settings.output_filename:
        os.makedirs(settings.output_filename, exist_ok=True)
    local_pids: Dict[int, int] = {}
    view = monitor.static_view([s.hostname for s in sorted(plan, key=lambda s: s.rank)], local_pids)
    with monitor.serving(settings, rendezvous.store, view):
        run_workers(specs, output_dir=settings.output_filename,
                    prefix_timestamp=settings.prefix_output_with_timestamp, local_pids=local_pids)


def gloo_run(settings: Settings, nics: Optional[Iterable[str]], env: Mapping[str, str], server_ip: str,
             command: Union[str, Sequence[str]]) -> None:
    """Upstream's entry point: run ``command`` (a list, or a shell-style string) on every slot of ``settings``
    with a rendezvous of its own, which the ranks reach at ``server_ip``; ``nics`` (when given) replace
    ``settings.nics``. Raises as :func:`launch_gloo` does; the rendezvous is stopped in any case."""
    if nics:
        settings = dataclasses.replace(settings, nics=sorted(nics) if isinstance(nics, (set, frozenset))
                                       else list(nics))
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    rendezvous = RendezvousServer(settings.verbose)
    rendezvous.start()
    try:
        launch_gloo(argv, settings, env, rendezvous, server_ip)
    finally:
        rendezvous.stop()


def _get_min_start_hosts(settings: Settings) -> int:
    """How many hosts an elastic job waits for before it starts (upstream's hook; tests patch it).

    Upstream waits for two, to find network interfaces common to the hosts, unless ``--network-interfaces`` is
    given. Here the driver's address is the route to the first remote host (or the given interface), which one
    host is enough for.
    """
    return 1


def launch_gloo_elastic(command: Sequence[str], settings, env: Mapping[str, str], rendezvous: RendezvousServer,
                        rendezvous_addr_for) -> List[SlotInfo]:
    """Run an elastic job (``settings`` is an :class:`horovod.runner.elastic.settings.ElasticSettings`) until it
    finishes; returns its last round's slots in rank order. ``rendezvous_addr_for(hosts)`` gives the driver's
    address for workers once the first hosts are known. Raises as :meth:`ElasticDriver.run` does."""
    from .elastic.driver import ElasticDriver

    driver = ElasticDriver(rendezvous, settings.discovery, settings.min_num_proc, settings.max_num_proc,
                           timeout=settings.elastic_timeout, reset_limit=settings.reset_limit,
                           cooldown_range=settings.cooldown_range, verbose=settings.verbose)
    sink = OutputSink(prefix_timestamp=settings.prefix_output_with_timestamp)
    started = [0]
    common: Dict[str, str] = {}
    if settings.output_filename:
        os.makedirs(settings.output_filename, exist_ok=True)

    def create_worker(slot: SlotInfo, events: queue.SimpleQueue, worker_id: str) -> WorkerProcess:
        if not common:
            common.update(job_env(rendezvous_addr_for(driver.host_assignments), rendezvous.port, settings))
            common["HOROVOD_ELASTIC"] = "1"
        spec = worker_spec(slot, command, env, {**common, ELASTIC_WORKER_ENV: worker_id}, rendezvous.secret,
                           settings, ssh_options=ssh.ELASTIC_SSH_OPTIONS)
        started[0] += 1
        out_dir = None
        if settings.output_filename:        # one directory per worker started: ranks change across rounds
            out_dir = os.path.join(settings.output_filename,
                                   f"rank.{pad_rank(slot.rank, slot.size)}.worker.{started[0]}")
        log.info("starting worker %s[%d] as rank %d of %d", slot.hostname, slot.local_rank, slot.rank, slot.size)
        if settings.verbose:
            log.info("%s", spec.display)
        return WorkerProcess(spec, sink, events, out_dir)

    with monitor.serving(settings, rendezvous.store, driver.monitor_view):
        return driver.run(settings.num_proc, create_worker, _get_min_start_hosts(settings))
