"""``horovodrun``: parse upstream's flags and launch a job (console script ``horovodrun``).

``parse_args`` accepts every upstream flag with the same names, destinations, defaults and mutually exclusive
groups. ``_run`` launches the job with the built-in controller (upstream's Gloo mode, the default) or, with
``--mpi``, through ``mpirun`` (:mod:`horovod.runner.mpi_run`). With ``--min-np`` or ``--host-discovery-script``
it runs an elastic job (:func:`_run_elastic`, :mod:`horovod.runner.elastic.driver`). Inside an LSF job the hosts,
slots and ``-np`` default to LSF's allocation (:mod:`horovod.runner.util.lsf`), and ``--jsrun`` (or, without a
controller flag, an LSF job where ``jsrun`` and MPI are installed) starts the ranks with ``jsrun``
(:mod:`horovod.runner.js_run`). Inside a Slurm allocation (``salloc``/``sbatch``) without -H/--hostfile the
hosts, slots and ``-np`` come from the allocation and the ranks start as one ``srun`` step
(:mod:`horovod.runner.srun_launch`). ``--job riseml.yml`` runs a RiseML-style job file's lines on its workers
(:mod:`horovod.runner.job_file`, :mod:`horovod.runner.job_run`).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Callable, List, Optional, Sequence, Set

from horovod.common.build import gloo_built, mpi_built

from . import flight_folder, ssh
from .common.util import arguments, config_parser, hosts
from .util import lsf, slurm, threads

log = logging.getLogger(__name__)

JSRUN_OUTSIDE_LSF = (
    "Horovod did not detect an LSF job (LSB_JOBID is not set). The jsrun launcher (--jsrun, or 'controller: "
    "jsrun' in --config-file) can only be used inside one: submit the job with bsub, or pick another launcher "
    "(--mpi, or no controller flag for the built-in one)."
)
JSRUN_NEEDS_MPI = (
    "jsrun starts the ranks as MPI processes, and they run Horovod's MPI controller, which needs mpi4py: "
    "`pip install horovod[mpi]` (or mpi4py built against the cluster's Spectrum MPI)."
)


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("horovod")
    except PackageNotFoundError:
        from horovod.version import __version__

        return __version__


def make_parser(override_args: Set[str], explicit: Set[str]) -> argparse.ArgumentParser:
    """The ``horovodrun`` argument parser (upstream's flags, groups and defaults), from the option table.

    Inside an LSF job or a Slurm allocation ``-np`` is optional: it defaults to the allocation's slots.
    """
    return arguments.make_parser(override_args, explicit, _version(),
                                 np_optional=lsf.using_lsf() or slurm.using_slurm())


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse ``horovodrun``'s command line (``sys.argv[1:]`` by default), apply ``--config-file``, validate.

    Exits with a usage error for invalid values; ``-cb`` prints the build table and exits 0.
    """
    override_args: Set[str] = set()
    explicit: Set[str] = set()
    parser = make_parser(override_args, explicit)
    args = parser.parse_args(argv)

    try:
        if args.config_file:
            config = config_parser.load_config_file(args.config_file)
            explicit |= config_parser.set_args_from_config(args, config, override_args,
                                                           source=args.config_file)
        config_parser.validate_config_args(args)
    except ValueError as exc:
        parser.error(str(exc))

    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    args.run_func = None
    args.executable = None
    args.explicit_args = explicit  # flags set on the command line or in the config file

    if args.check_build:
        check_build(args.verbose)
    return args


def check_build(verbose: bool = False) -> None:
    """Print which frameworks, controllers and tensor operations are available, then exit 0."""
    from . import build_info

    info = build_info.detect()
    print(build_info.format_build(_version(), info, verbose))
    print()
    print(build_info.format_data_planes(info))
    sys.exit(0)


def _is_elastic(args: Any) -> bool:
    return getattr(args, "host_discovery_script", None) is not None or getattr(args, "min_np", None) is not None


def _normalize_nics(nics: Any) -> Optional[List[str]]:
    if not nics:
        return None
    if isinstance(nics, str):
        items = nics.split(",")
    elif isinstance(nics, (set, frozenset)):
        items = sorted(nics)
    else:
        items = list(nics)
    items = [n.strip() for n in items if n and n.strip()]
    return items or None


def _run(args: Any) -> Optional[List[Any]]:
    """Run the job described by ``args`` (from parse_args or horovod.run).

    Returns the per-rank results for ``horovod.run`` (``args.run_func`` set), else None. Raises ValueError for
    bad hosts or counts (or ``--jsrun`` outside LSF), and :class:`horovod.runner.process.JobFailedError` when a
    rank fails.
    """
    if getattr(args, "job", None):
        return _run_job_file(args)
    if lsf.using_lsf():
        _apply_lsf_defaults(args)
    from . import srun_launch

    if srun_launch.wanted(args):        # inside a Slurm allocation: its hosts, ranks started by srun
        srun_launch.apply_allocation(args)

    if not getattr(args, "hosts", None) and not getattr(args, "host_discovery_script", None):
        if getattr(args, "hostfile", None):
            args.hosts = hosts.parse_host_files(args.hostfile)
        else:
            args.hosts = f"localhost:{args.np}"

    args.nics = _normalize_nics(getattr(args, "nics", None))

    if _is_elastic(args):
        return _run_elastic(args)
    if getattr(args, "max_np", None) is not None:
        log.warning("--max-np only applies to elastic mode (with --min-np or --host-discovery-script); "
                    "ignoring it")
    return _run_static(args)


def _check_all_hosts_ssh_successful(host_addresses: Sequence[str], ssh_port: Optional[int] = None,
                                    ssh_identity_file: Optional[str] = None) -> Optional[bool]:
    """Upstream's check: True when ssh reaches every host (up to 5 tries each, in parallel), else None after
    logging each failed host's error (None rather than False, as upstream, so that a cache keeps no failure)."""
    hosts_list = list(host_addresses)
    errors = threads.execute_function_multithreaded(
        lambda host: ssh.check_ssh(host, ssh_port, ssh_identity_file), [[host] for host in hosts_list])
    for index, error in sorted(errors.items()):
        if error is not None:
            log.error("ssh not successful for host %s:\n%s", hosts_list[index], error)
    return None if any(error is not None for error in errors.values()) else True


def is_jsrun_installed() -> bool:
    """True when ``jsrun`` is on ``PATH`` (:func:`horovod.runner.js_run.is_jsrun_installed`)."""
    from .js_run import is_jsrun_installed as installed

    return installed()


def run_controller(use_gloo: Optional[bool], gloo_run: Callable[[], Any], use_mpi: Optional[bool],
                   mpi_run: Callable[[], Any], use_jsrun: Optional[bool], js_run: Callable[[], Any],
                   verbosity: Optional[int]) -> None:
    """Call the launcher that upstream's rules pick: the one asked for (ValueError when MPI is asked for but
    mpi4py is missing, or jsrun outside an LSF job); with none asked for, jsrun inside LSF where it is
    installed, else MPI when mpi4py is installed, else Gloo (the built-in controller). ``horovodrun`` itself
    uses the built-in controller unless ``--mpi`` or ``--jsrun`` is given; this is upstream's function for code
    that calls it. ``verbosity`` is accepted for upstream's signature."""
    mpi_missing = ("MPI support has not been built.  If this is not expected, install it with "
                   "`pip install horovod[mpi]` (mpi4py and Open MPI).")
    if use_gloo:
        if not gloo_built():
            raise ValueError("Gloo support has not been built.")
        gloo_run()
    elif use_mpi or use_jsrun:
        if not mpi_built():
            raise ValueError(mpi_missing)
        if not use_jsrun:
            mpi_run()
        elif not lsf.LSFUtils.using_lsf():
            raise ValueError("Horovod did not detect an LSF job.  The jsrun launcher can only be used in that "
                             "environment. Please, pick a different launcher for other environments.")
        else:
            js_run()
    elif mpi_built():
        if lsf.LSFUtils.using_lsf() and is_jsrun_installed():
            js_run()
        else:
            mpi_run()
    elif gloo_built():
        gloo_run()
    else:
        raise ValueError("Neither MPI nor Gloo support has been built. Try reinstalling Horovod ensuring that "
                         "either MPI is installed (MPI) or CMake is installed (Gloo).")


def _apply_lsf_defaults(args: Any) -> None:
    """Inside LSF, ``-np`` and the hosts default to the job's allocation (upstream's ``_run``)."""
    if not getattr(args, "np", None):
        args.np = lsf.LSFUtils.get_num_processes()
    if not any(getattr(args, name, None) for name in ("hosts", "hostfile", "host_discovery_script")):
        args.hosts = lsf.LSFUtils.get_hosts_string()
        log.info("LSF job %s: hosts %s", os.environ.get("LSB_JOBID"), args.hosts)


def _use_jsrun(args: Any) -> bool:
    """Whether a static job starts its ranks with jsrun, by upstream's rules: ``--jsrun`` (inside LSF only,
    with MPI), or no controller flag inside an LSF job where jsrun and MPI are installed."""
    from horovod.common import build

    if getattr(args, "use_jsrun", None):
        if not lsf.using_lsf():
            raise ValueError(JSRUN_OUTSIDE_LSF)
        if not build.mpi_built():
            raise ValueError(JSRUN_NEEDS_MPI)
        return True
    if getattr(args, "use_gloo", None) or getattr(args, "use_mpi", None) or not lsf.using_lsf():
        return False
    from . import js_run

    return js_run.is_jsrun_installed() and build.mpi_built()


def _run_elastic(args: Any) -> Optional[List[Any]]:
    """Run an elastic job (``--min-np`` or ``--host-discovery-script``; upstream's function of this name).

    The hosts come from the discovery script, or are the fixed ``-H`` hosts (at least two). The job starts at
    ``-np`` processes (``--min-np`` when not given), keeps running while ``--min-np`` slots exist, and grows up
    to ``--max-np``. Returns the first ``min_np`` results in ``horovod.run`` mode, else None.
    """
    from . import gloo_run
    from .common.util import network
    from .rendezvous import RendezvousServer

    settings = _elastic_settings(args)
    env = _worker_base_env(args)

    def rendezvous_addr_for(host_assignments: dict) -> str:
        remote = network.filter_local_addresses(list(host_assignments))
        return network.get_driver_ip(settings.nics, remote) if remote or settings.nics else "127.0.0.1"

    rendezvous = RendezvousServer(settings.verbose)
    rendezvous.start()
    try:
        if args.run_func is None:
            gloo_run.launch_gloo_elastic(list(args.command or []), settings, env, rendezvous, rendezvous_addr_for)
            return None
        command = _publish_function(args, env, rendezvous)
        return _run_function(lambda: gloo_run.launch_gloo_elastic(command, settings, env, rendezvous,
                                                                  rendezvous_addr_for),
                             rendezvous, settings.min_num_proc)
    finally:
        rendezvous.stop()


def _elastic_settings(args: Any):
    """The elastic launch's settings from the flags; ValueError saying what to change for invalid ones."""
    from horovod.common import config

    from .elastic import discovery
    from .elastic.settings import ElasticSettings

    if getattr(args, "use_mpi", None) or getattr(args, "use_jsrun", None):
        raise ValueError("Elastic mode runs on horovodrun's own controller, not under mpirun or jsrun: drop "
                         "--mpi / --jsrun.")
    if args.host_discovery_script:
        host_discovery: discovery.HostDiscovery = discovery.HostDiscoveryScript(args.host_discovery_script,
                                                                                args.slots)
    elif args.hosts:
        _, host_slots = hosts.parse_hosts_and_slots(args.hosts)
        if len(host_slots) < 2:
            raise ValueError("Cannot run in fault tolerance mode with fewer than 2 hosts.")
        host_discovery = discovery.FixedHosts(host_slots)
    else:
        raise ValueError("One of --host-discovery-script, --hosts, or --hostnames must be provided")
    min_np = args.min_np or args.np
    if min_np is None or min_np < 1:
        raise ValueError("An elastic job needs -np (the number of processes to start with) or --min-np (the "
                         "fewest it may run with), at least 1.")
    num_proc = args.np or min_np
    if args.max_np is not None and args.max_np < max(min_np, num_proc):
        raise ValueError(f"--max-np {args.max_np} is smaller than -np/--min-np {max(min_np, num_proc)}.")
    cooldown = tuple(args.cooldown_range) if getattr(args, "cooldown_range", None) else None
    if cooldown is not None:
        discovery.validate_cooldown_range(cooldown)
    start_timeout = args.start_timeout or config.get("HOROVOD_START_TIMEOUT")
    return ElasticSettings(
        num_proc=num_proc, hosts=args.hosts or "", verbose=2 if getattr(args, "verbose", None) else 0,
        ssh_port=getattr(args, "ssh_port", None), ssh_identity_file=getattr(args, "ssh_identity_file", None),
        tcp_flag=bool(getattr(args, "tcp_flag", False)), start_timeout=float(start_timeout),
        output_filename=getattr(args, "output_filename", None), run_func=args.run_func is not None,
        nics=args.nics, prefix_output_with_timestamp=bool(getattr(args, "prefix_output_with_timestamp", False)),
        discovery=host_discovery, min_num_proc=min_np, max_num_proc=args.max_np,
        elastic_timeout=getattr(args, "elastic_timeout", None), reset_limit=getattr(args, "reset_limit", None),
        cooldown_range=cooldown, monitor_port=_monitor_port(args),
        monitor_address=getattr(args, "monitor_address", None) or "127.0.0.1")


def _publish_function(args: Any, env: dict, rendezvous: Any) -> List[str]:
    """``horovod.run``: put the function into the rendezvous store; the command that runs it on each rank (the
    rank finds the store through its environment)."""
    from . import run_func

    rendezvous.store.put(run_func.FUNC_SCOPE, run_func.FUNC_KEY, run_func.encode_function(args.run_func))
    src_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.path.basename(src_dir) not in ("site-packages", "dist-packages"):
        # horovod runs from a source tree: make sure the ranks import this same copy.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src_dir, env.get("PYTHONPATH")) if p)
    return [args.executable or sys.executable, "-m", "horovod.runner.run_task"]


def _run_function(launch, rendezvous: Any, num_results: int, mpi: bool = False) -> List[Any]:
    """Run ``launch()`` and return the ranks' results; a rank's exception is raised as its RankFunctionError,
    whose message starts with the launcher's report in upstream's words (``mpi``: "mpirun failed ...")."""
    from . import run_func
    from .process import JobFailedError

    try:
        launch()
    except JobFailedError as exc:
        headline = f"mpirun failed with exit code {exc.exit_code}" if mpi else str(exc)
        error = run_func.failure_for_rank(rendezvous.store, exc.failure.rank, exc.failure.hostname, headline)
        if error is not None:
            raise error from error.__cause__
        raise
    return run_func.collect_results(rendezvous.store, num_results)


def _worker_base_env(args: Any) -> dict:
    """The launcher's environment with the flags' tunables applied.

    A flag that has a default and that the user did not give does not replace a value the user exported.
    """
    env = os.environ.copy()
    config_parser.set_env_from_args(env, args)
    explicit = getattr(args, "explicit_args", set())
    for dest, var in config_parser.DEFAULTED_ARGS.items():
        if dest not in explicit and os.environ.get(var):
            env[var] = os.environ[var]
    flight_folder.choose(env)           # one folder of flight records for every rank of the job
    return env


def _static_settings(args: Any):
    """The static launch's :class:`Settings` from the flags (``args.np`` and ``args.hosts`` already set)."""
    from horovod.common import config

    from .common.util.settings import Settings

    start_timeout = args.start_timeout or config.get("HOROVOD_START_TIMEOUT")
    return Settings(
        num_proc=args.np, hosts=args.hosts, verbose=2 if getattr(args, "verbose", None) else 0,
        ssh_port=getattr(args, "ssh_port", None), ssh_identity_file=getattr(args, "ssh_identity_file", None),
        extra_mpi_args=getattr(args, "mpi_args", None), tcp_flag=bool(getattr(args, "tcp_flag", False)),
        binding_args=getattr(args, "binding_args", None), start_timeout=float(start_timeout),
        output_filename=getattr(args, "output_filename", None), run_func=args.run_func is not None,
        nics=args.nics, prefix_output_with_timestamp=bool(getattr(args, "prefix_output_with_timestamp", False)),
        monitor_port=_monitor_port(args), monitor_address=getattr(args, "monitor_address", None) or "127.0.0.1",
    )


def _monitor_port(args: Any) -> Optional[int]:
    """The live page's port: ``--monitor-port``, else ``HOROVOD_MONITOR_PORT``, else None (no page)."""
    from horovod.common import config

    port = getattr(args, "monitor_port", None)
    if port is None:
        port = config.get("HOROVOD_MONITOR_PORT")
    if port is not None and not 0 <= port <= 65535:
        raise ValueError(f"HOROVOD_MONITOR_PORT={port} must be a port number in [0, 65535] (0: a free one).")
    return port


def _no_monitor(settings: Any, why: str) -> None:
    """Say in one line that this launch serves no live page although one was asked for."""
    if settings.monitor_port is not None:
        log.warning("--monitor-port / HOROVOD_MONITOR_PORT: no live page %s.", why)
        settings.monitor_port = None


def _run_job_file(args: Any) -> None:
    """``--job``: run a RiseML-style job file's lines on its workers (:mod:`horovod.runner.job_run`)."""
    from . import job_file, job_run

    if args.command or args.run_func is not None:
        raise ValueError("--job runs the job file's 'run' lines: drop the command after the flags.")
    if _is_elastic(args) or getattr(args, "use_mpi", None) or getattr(args, "use_jsrun", None):
        raise ValueError("--job runs on horovodrun's own controller with a fixed set of hosts: drop --mpi, "
                         "--jsrun, --min-np and --host-discovery-script.")
    job = job_file.load(args.job)
    workers = job_run.worker_hosts(job, getattr(args, "hosts", None), getattr(args, "hostfile", None))
    args.np = job_run.check_num_proc(job, args.np)
    args.hosts = job_run.hosts_string(job, workers)
    args.nics = _normalize_nics(getattr(args, "nics", None))
    job_run.check_resources(job, workers)
    settings = _static_settings(args)
    _no_monitor(settings, "with --job (each line of the job file has a rendezvous of its own)")
    job_run.run_job(job, settings, _worker_base_env(args))


def _run_static(args: Any) -> Optional[List[Any]]:
    from . import gloo_run
    from .common.util import network
    from .rendezvous import RendezvousServer

    np = args.np
    if np is None or np < 1:
        raise ValueError(f"The number of processes (-np) must be at least 1, got {np}.")
    command = list(args.command or [])
    if not args.run_func and not command:
        raise ValueError("No command to run was given, e.g. `horovodrun -np 2 python train.py`.")

    settings = _static_settings(args)
    plan = gloo_run.host_alloc_plan(settings)  # validates hosts and slots before anything starts
    if getattr(args, "slurm_step", False):
        from . import srun_launch

        _no_monitor(settings, "for ranks started by srun yet")
        return srun_launch.launch(settings, _worker_base_env(args), command)
    use_jsrun = _use_jsrun(args)
    if use_jsrun:    # jsrun reaches the hosts through LSF, no ssh; the address is for horovod.run's results
        remote_hosts = network.filter_local_addresses(list(dict.fromkeys(slot.hostname for slot in plan)))
        rendezvous_addr = ("127.0.0.1" if not remote_hosts or args.run_func is None
                           else network.get_driver_ip(settings.nics, remote_hosts))
    else:
        rendezvous_addr = gloo_run.reach_hosts(settings, plan)

    env = _worker_base_env(args)
    use_mpi = bool(getattr(args, "use_mpi", None))
    if use_jsrun or use_mpi:
        _no_monitor(settings, "under --mpi or --jsrun: the ranks bootstrap over MPI and put no heartbeats into the "
                              "launcher's rendezvous")
    if use_jsrun:
        return _launch_jsrun(args, settings, env, command, rendezvous_addr)
    if use_mpi and args.run_func is None:
        from . import mpi_run

        mpi_run.mpi_run(settings, settings.nics, env, command)
        return None

    rendezvous = RendezvousServer(settings.verbose)
    rendezvous.start()
    try:
        if args.run_func is None:
            gloo_run.launch_gloo(command, settings, env, rendezvous, rendezvous_addr)
            return None

        command = _publish_function(args, env, rendezvous) + [rendezvous_addr, str(rendezvous.port)]
        if use_mpi:
            return _run_function(lambda: _launch_run_func_mpi(settings, env, command, rendezvous), rendezvous, np,
                                 mpi=True)
        return _run_function(lambda: gloo_run.launch_gloo(command, settings, env, rendezvous, rendezvous_addr),
                             rendezvous, np)
    finally:
        rendezvous.stop()


def _launch_jsrun(args: Any, settings: Any, env: dict, command: List[str],
                  rendezvous_addr: str) -> Optional[List[Any]]:
    """Run the job with jsrun; for ``horovod.run`` the ranks report their results to a store of the launcher,
    whose secret jsrun passes on in its environment."""
    from horovod.common.wire import SECRET_ENV

    from . import js_run
    from .rendezvous import RendezvousServer

    if args.run_func is None:
        js_run.js_run(settings, settings.nics, env, command)
        return None
    rendezvous = RendezvousServer(settings.verbose)
    rendezvous.start()
    try:
        command = _publish_function(args, env, rendezvous) + [rendezvous_addr, str(rendezvous.port)]
        env[SECRET_ENV] = rendezvous.secret

        def launch() -> None:
            try:
                js_run.js_run(settings, settings.nics, env, command, export_secret=True)
            except js_run.JsrunError:
                _raise_stored_failure(rendezvous, settings.num_proc)
                raise

        return _run_function(launch, rendezvous, settings.num_proc)
    finally:
        rendezvous.stop()


def _raise_stored_failure(rendezvous: Any, num_proc: int, headline: str = "") -> None:
    """The launcher named no rank: raise the exception of the first rank that stored one, if any did."""
    from . import run_func

    for rank in range(num_proc):
        error = run_func.failure_for_rank(rendezvous.store, rank, None, headline)
        if error is not None:
            raise error from error.__cause__


def _launch_run_func_mpi(settings: Any, env: dict, command: List[str], rendezvous: Any) -> None:
    """``horovod.run(..., use_mpi=True)``: the ranks run ``run_task`` under mpirun and report to the store.

    They need the job secret to reach the store: it is exported to them by name (``-x _HOROVOD_SECRET_KEY``),
    its value travelling only in mpirun's environment.
    """
    import subprocess

    from horovod.common.wire import SECRET_ENV

    from . import mpi_run

    env[SECRET_ENV] = rendezvous.secret
    try:
        mpi_run.mpi_run(settings, settings.nics, env, command, export_secret=True, stdin=subprocess.DEVNULL)
    except mpi_run.MpirunError as exc:
        _raise_stored_failure(rendezvous, settings.num_proc, f"mpirun failed with exit code {exc.exit_code}")
        raise


def _configure_logging(verbose: bool) -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[horovodrun] %(levelname)s: %(message)s"))
        root.addHandler(handler)
    logging.getLogger("horovod.runner").setLevel(logging.INFO if verbose else logging.WARNING)
    # An elastic job's driver says what it does (rounds, failures, blacklisted hosts) without --verbose.
    logging.getLogger("horovod.elastic").setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("horovod.runner.monitor").setLevel(logging.INFO)     # the live page's URL


def run_commandline(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point of ``horovodrun`` and ``python -m horovod.runner``; exits with the job's status."""
    from .mpi_run import MpirunError
    from .process import JobFailedError, JobInterruptedError, WorkerStartError

    args = parse_args(argv)
    _configure_logging(bool(args.verbose))
    try:
        _run(args)
    except (JobFailedError, JobInterruptedError, MpirunError) as exc:   # JsrunError is an MpirunError
        log.error("%s%s", exc, flight_folder.failure_note())
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        log.error("Interrupted (SIGINT): all ranks were stopped.")
        sys.exit(130)
    except (NotImplementedError, ValueError, WorkerStartError, RuntimeError, OSError) as exc:
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    run_commandline()
