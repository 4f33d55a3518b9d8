"""One class per MPI implementation that ``horovodrun --mpi`` can drive: how to recognize its ``mpirun``, and
which flags its command line needs (output tags, hosts and rank counts, binding, ssh, tcp-only, network
interfaces, exported environment).

Written the way JAX's cluster detectors are (``jax._src.clusters``): :class:`MPIFlavor` is the interface and
keeps a registry of its subclasses; each subclass sets ``name`` and answers small questions. The command
itself is put together in one fixed order by :meth:`MPIFlavor.command`; ``mpi_run.build_mpirun_command`` is
its public entry point.

- :class:`OpenMPIFlavor` (and :class:`SpectrumFlavor`, IBM's derivative): ``-H host:slots``, ``-x NAME``,
  ``--mca``.
- :class:`MPICHFlavor` and :class:`IntelMPIFlavor`: both launch through the Hydra process manager
  (``-hosts``/``-ppn``, ``-genvlist``), which runs the same number of ranks on every host.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import shlex
import socket
from typing import ClassVar, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type

from horovod.common.wire import SECRET_ENV

from .common.util.env import is_exportable
from .common.util.hosts import parse_hosts_and_slots
from .common.util.settings import Settings
from .mpi_output import MPICH_PREPEND_PATTERN

log = logging.getLogger(__name__)

OPENMPI = "openmpi"
SPECTRUM = "spectrum"
MPICH = "mpich"
INTEL = "intel"
IMPLEMENTATIONS = (OPENMPI, SPECTRUM, MPICH, INTEL)
HYDRA_IMPLEMENTATIONS = (MPICH, INTEL)   # the Hydra process manager: -hosts/-ppn, -genv, -l

# Upstream's threshold above which Open MPI's ssh launcher needs help (tree spawn off, more concurrent ssh).
LARGE_CLUSTER_THRESHOLD = 64

# Open MPI's binding for Horovod (one rank per slot, unbound: a rank runs several threads), and Spectrum MPI's.
OPENMPI_BINDING = ["--bind-to", "none", "--map-by", "slot"]
SPECTRUM_BINDING = ["--bind-to", "socket", "--map-by", "socket", "--rank-by", "core"]
HYDRA_BINDING = ["-bind-to", "none"]

# Never exported to the ranks: values that belong to one host or one shell (the launcher's host name, its ssh
# session, the shell's ``$_``), and the per-process variables of a launcher this horovodrun may itself run
# under (nested jobs): the ranks get their own from mpirun. OMPI_MCA_*/PRTE_MCA_*/PMIX_MCA_* settings are kept.
_HOST_SPECIFIC = re.compile(r"HOSTNAME|_|SSH_\w*")
_LAUNCHER_INTERNAL = re.compile(
    r"(?:OMPI|PRTE|PMIX)_(?!MCA_)\w*|PMI_\w*|HYDI_\w*|MPI_LOCALRANKID|MPI_LOCALNRANKS|"
    r"HOROVOD_(?:HOSTNAME|RANK|SIZE|LOCAL_RANK|LOCAL_SIZE|CROSS_RANK|CROSS_SIZE|"
    r"GLOO_RENDEZVOUS_ADDR|GLOO_RENDEZVOUS_PORT)"
)


@dataclasses.dataclass(frozen=True)
class MPIImplementation:
    """Which MPI ``mpirun`` belongs to: ``name`` is one of IMPLEMENTATIONS; ``major`` when it was printed."""

    name: str
    major: Optional[int] = None
    version_text: str = ""

    @property
    def ssh_mca_prefix(self) -> str:
        """``plm_ssh`` for Open MPI 5 and later (PRRTE renamed the rsh launcher), else ``plm_rsh``."""
        if self.name == OPENMPI and (self.major is None or self.major >= 5):
            return "plm_ssh"
        return "plm_rsh"


# --- what every implementation's command is made of ---------------------------------------------------------

def exported_env_names(env: Mapping[str, str], exclude: Iterable[str] = ()) -> List[str]:
    """The names of the variables of ``env`` that mpirun exports to every rank, sorted.

    That is every variable the default mode forwards (see ``common.util.env``: never the secret, shell functions,
    ``OLDPWD`` or ``*CUDA_VISIBLE_DEVICES``), less host- and launcher-specific ones (``HOSTNAME``, ``SSH_*``,
    ``_``, an enclosing job's ``OMPI_*``/``PMI_*``/``HOROVOD_RANK``...) and ``exclude``.
    """
    skip = set(exclude)
    return sorted(
        name for name in env
        if name not in skip and is_exportable(name)
        and not _HOST_SPECIFIC.fullmatch(name) and not _LAUNCHER_INTERNAL.fullmatch(name)
    )


def ssh_args(settings: Settings) -> List[str]:
    """The ssh options of ``-p/--ssh-port`` and ``-i/--ssh-identity-file``, for mpirun's ssh launcher."""
    args: List[str] = []
    if settings.ssh_port:
        args += ["-p", str(settings.ssh_port)]
    if settings.ssh_identity_file:
        args += ["-i", settings.ssh_identity_file]
    return args


def running_as_root() -> bool:
    """Does this process run as root (Open MPI then needs ``--allow-run-as-root``)?"""
    geteuid = getattr(os, "geteuid", None)
    return geteuid is not None and geteuid() == 0


def oversubscribed_here(host_names: Sequence[str], num_proc: int) -> bool:
    """True when every host is this machine and the job has more ranks than it has cores."""
    local = {"localhost", "127.0.0.1", socket.gethostname()}
    return all(h in local for h in host_names) and num_proc > (os.cpu_count() or 1)


@dataclasses.dataclass(frozen=True)
class MpirunJob:
    """What one mpirun command line is built from, worked out once from the settings and the ranks' env."""

    settings: Settings
    host_names: List[str]
    host_to_slots: Dict[str, int]
    nics: List[str]
    env_names: List[str]            # exported by name; the values travel in mpirun's own environment
    ssh_args: List[str]
    user_binding: Optional[List[str]]   # --binding-args, split; None: the implementation's default
    is_root: bool

    @classmethod
    def from_settings(cls, settings: Settings, env: Mapping[str, str], nics: Optional[Sequence[str]],
                      export_secret: bool, run_as_root: Optional[bool]) -> MpirunJob:
        """The job of ``settings``; ``nics`` defaults to ``settings.nics``, ``run_as_root`` to
        :func:`running_as_root`."""
        nic_list = list(nics if nics is not None else (settings.nics or []))
        host_names, host_to_slots = parse_hosts_and_slots(settings.hosts)
        names = exported_env_names(env, {"NCCL_SOCKET_IFNAME"} if nic_list else set())
        if export_secret and env.get(SECRET_ENV):
            names.append(SECRET_ENV)
        return cls(settings, host_names, host_to_slots, nic_list, names, ssh_args(settings),
                   shlex.split(settings.binding_args) if settings.binding_args else None,
                   running_as_root() if run_as_root is None else run_as_root)


# The order in which `mpirun --version` is matched: the specific names before the generic ones (Spectrum MPI
# derives from Open MPI, and Intel MPI's launcher is a Hydra, like MPICH's).
DETECTION_ORDER = (SPECTRUM, OPENMPI, INTEL, MPICH)


@dataclasses.dataclass(frozen=True)
class VersionSignature:
    """How ``mpirun --version`` names an implementation: any of ``markers`` in it, and its major version as
    the first group of ``major_pattern``."""

    markers: Tuple[str, ...]
    major_pattern: str


_PRRTE = re.compile(r"\bprterun\b|\bPRRTE\b")


def _major(pattern: str, text: str) -> Optional[int]:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else None


# --- the interface and its registry -------------------------------------------------------------------------

class MPIFlavor:
    """One MPI implementation's ``mpirun``: how to recognize it and which flags its command line needs.

    Subclasses that set ``name`` register themselves; :meth:`detect` asks them in DETECTION_ORDER.
    """

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""                 # for messages
    signature: ClassVar[VersionSignature] = VersionSignature((), "")
    hydra: ClassVar[bool] = False             # Hydra's output tags and failure reports
    _flavors: ClassVar[Dict[str, Type[MPIFlavor]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            MPIFlavor._flavors[cls.name] = cls

    def __init__(self, impl: MPIImplementation) -> None:
        self.impl = impl

    # detection

    @classmethod
    def is_version_output(cls, text: str) -> bool:
        """Did this implementation's ``mpirun --version`` print ``text``?"""
        return any(marker in text for marker in cls.signature.markers)

    @classmethod
    def major(cls, text: str) -> Optional[int]:
        """The major version in ``text`` (its ``mpirun --version``), when it names one."""
        return _major(cls.signature.major_pattern, text)

    @classmethod
    def parse_version(cls, text: str) -> Optional[MPIImplementation]:
        """This implementation, with its major version, when it printed ``text``; else None."""
        return MPIImplementation(cls.name, cls.major(text), text) if cls.is_version_output(text) else None

    @classmethod
    def detect(cls, text: str) -> Optional[MPIImplementation]:
        """The implementation that printed ``text`` (``mpirun --version``, stripped), or None."""
        for name in DETECTION_ORDER:
            impl = cls._flavors[name].parse_version(text)
            if impl is not None:
                return impl
        return None

    @classmethod
    def of(cls, impl: MPIImplementation) -> MPIFlavor:
        """The flavor of ``impl``; ValueError when its name is none of IMPLEMENTATIONS."""
        flavor = cls._flavors.get(impl.name)
        if flavor is None:
            raise ValueError(
                f"unknown MPI implementation {impl.name!r} (expected one of {', '.join(IMPLEMENTATIONS)})")
        return flavor(impl)

    # the command line, in this order

    def command(self, job: MpirunJob, mpirun: str, program: Sequence[str]) -> List[str]:
        """The whole argv: mpirun, its flags, ``--mpi-args``, then ``program``."""
        self.check_hosts(job)
        cmd = [mpirun, *self.output_flags(job), *self.placement_flags(job), *self.binding_flags(job),
               *self.launcher_flags(job), *self.tuning_flags(job), *self.tcp_only_flags(job),
               *self.nic_flags(job), *self.env_flags(job)]
        if job.settings.extra_mpi_args:
            cmd += shlex.split(job.settings.extra_mpi_args)
        return cmd + list(program)

    def check_hosts(self, job: MpirunJob) -> None:
        """ValueError for hosts this implementation cannot express."""

    def output_flags(self, job: MpirunJob) -> List[str]:
        """Flags before the placement: output tags, timestamps, run-as-root."""
        raise NotImplementedError

    def placement_flags(self, job: MpirunJob) -> List[str]:
        """How many ranks, on which hosts."""
        raise NotImplementedError

    def default_binding(self) -> List[str]:
        """The binding flags when ``--binding-args`` gives none."""
        raise NotImplementedError

    def binding_flags(self, job: MpirunJob) -> List[str]:
        """``--binding-args`` as given, else :meth:`default_binding`."""
        return job.user_binding if job.user_binding is not None else self.default_binding()

    def launcher_flags(self, job: MpirunJob) -> List[str]:
        """How mpirun reaches the other hosts (the ssh options)."""
        return []

    def tuning_flags(self, job: MpirunJob) -> List[str]:
        """Settings that make the job run well where it runs."""
        return []

    def tcp_only_flags(self, job: MpirunJob) -> List[str]:
        """What ``--tcp`` asks of this MPI (it also sets ``NCCL_IB_DISABLE`` for every implementation)."""
        return []

    def nic_flags(self, job: MpirunJob) -> List[str]:
        """The network interfaces of ``--network-interfaces``, for MPI and for NCCL."""
        raise NotImplementedError

    def env_flags(self, job: MpirunJob) -> List[str]:
        """The ranks' environment, by name."""
        raise NotImplementedError

    def launcher_env(self, settings: Settings) -> Dict[str, str]:
        """Variables for mpirun itself (not exported to the ranks)."""
        return {}

    # how its output and failures read (see mpi_run.execute)

    def regroups_writes(self) -> bool:
        """Does its output need :class:`~horovod.runner.mpi_output.HydraDemux` (a tag per write, not per
        line)?"""
        return False

    def strips_tag_space(self) -> bool:
        """Does its output tag come with a space after it (``[1,0]<stdout>: text``) that is not the rank's?"""
        return False

    def prints_exit_codes(self) -> bool:
        """Does it list every rank's exit code (``-print-all-exitcodes``) when the job fails?"""
        return False


def flavor_of(impl: MPIImplementation | str) -> MPIFlavor:
    """The :class:`MPIFlavor` of ``impl`` (a name is taken as that implementation without a version)."""
    return MPIFlavor.of(MPIImplementation(impl) if isinstance(impl, str) else impl)


# --- Open MPI and Spectrum MPI ------------------------------------------------------------------------------

class OpenMPIFlavor(MPIFlavor):
    """Open MPI (and a standalone PRRTE, Open MPI 5's runtime): ``-H``, ``-x NAME``, ``--mca`` settings."""

    name = OPENMPI
    label = "Open MPI"
    signature = VersionSignature(("Open MPI", "OpenRTE"), r"\((?:Open MPI|OpenRTE)\)\s+(\d+)")
    runtime_marker: ClassVar[Optional[re.Pattern]] = _PRRTE   # also this one, as Open MPI 5, when it is found

    @classmethod
    def is_version_output(cls, text: str) -> bool:
        return super().is_version_output(text) or (cls.runtime_marker is not None
                                                   and cls.runtime_marker.search(text) is not None)

    @classmethod
    def major(cls, text: str) -> Optional[int]:
        if super().is_version_output(text):
            return _major(cls.signature.major_pattern, text)
        # A standalone PRRTE (the runtime of Open MPI 5) or an Open MPI that reports its runtime's name.
        return 5

    def output_flags(self, job: MpirunJob) -> List[str]:
        flags = ["--allow-run-as-root"] if job.is_root else []
        flags.append("--tag-output")
        if job.settings.prefix_output_with_timestamp:
            flags.append("--timestamp-output")
        return flags

    def placement_flags(self, job: MpirunJob) -> List[str]:
        return ["-np", str(job.settings.num_proc), "-H", job.settings.hosts]

    def default_binding(self) -> List[str]:
        return list(OPENMPI_BINDING)

    def launcher_flags(self, job: MpirunJob) -> List[str]:
        plm = self.impl.ssh_mca_prefix
        flags: List[str] = []
        if len(job.host_names) >= LARGE_CLUSTER_THRESHOLD:
            flags += ["--mca", f"{plm}_no_tree_spawn", "true",
                      "--mca", f"{plm}_num_concurrent", str(len(job.host_names))]
        if job.ssh_args:
            flags += ["--mca", f"{plm}_args", " ".join(job.ssh_args)]
        return flags

    def tuning_flags(self, job: MpirunJob) -> List[str]:
        if oversubscribed_here(job.host_names, job.settings.num_proc):
            # More ranks than cores on this machine: Open MPI sees -H slots, not cores, and would busy-poll,
            # stealing the cores the ranks need (measured: 2x slower at 3 ranks on 2 cores).
            return ["--mca", "mpi_yield_when_idle", "1"]
        return []

    def nic_flags(self, job: MpirunJob) -> List[str]:
        if not job.nics:
            return []
        joined = ",".join(job.nics)
        return ["--mca", "btl_tcp_if_include", joined, "-x", f"NCCL_SOCKET_IFNAME={joined}"]

    def env_flags(self, job: MpirunJob) -> List[str]:
        return [arg for name in job.env_names for arg in ("-x", name)]

    def strips_tag_space(self) -> bool:
        return self.impl.major is None or self.impl.major >= 5


class SpectrumFlavor(OpenMPIFlavor):
    """IBM Spectrum MPI: Open MPI's command line, bound by socket, with ``-tcp`` for ``--tcp``."""

    name = SPECTRUM
    label = "Spectrum MPI"
    signature = VersionSignature(("IBM Spectrum MPI",), r"IBM Spectrum MPI\)?\s+(\d+)")
    runtime_marker = None

    def default_binding(self) -> List[str]:
        return list(SPECTRUM_BINDING)

    def tcp_only_flags(self, job: MpirunJob) -> List[str]:
        return ["-tcp"] if job.settings.tcp_flag else []

    def strips_tag_space(self) -> bool:
        return False


# --- the Hydra process manager: MPICH and Intel MPI ---------------------------------------------------------

class HydraFlavor(MPIFlavor):
    """What MPICH and Intel MPI share: ``-hosts``/``-ppn`` (equal slots only), ``-genv``, ``-genvlist``."""

    hydra = True

    def check_hosts(self, job: MpirunJob) -> None:
        slots = {job.host_to_slots[h] for h in job.host_names}
        if len(slots) > 1:
            listing = ", ".join(f"{h}:{job.host_to_slots[h]}" for h in job.host_names)
            raise ValueError(
                f"{self.label} (Hydra) runs the same number of ranks on every host (-ppn), but the hosts "
                f"have different slots: {listing}. Give every host the same slots, or pass your own machine "
                "file with --mpi-args."
            )

    def output_flags(self, job: MpirunJob) -> List[str]:
        if job.settings.prefix_output_with_timestamp:
            log.warning("--prefix-output-with-timestamp: %s has no timestamp option; output is not "
                        "timestamped", self.label)
        return self.tag_flags()

    def tag_flags(self) -> List[str]:
        """The flags that tag each rank's output."""
        raise NotImplementedError

    def placement_flags(self, job: MpirunJob) -> List[str]:
        return ["-np", str(job.settings.num_proc), "-hosts", ",".join(job.host_names),
                "-ppn", str(job.host_to_slots[job.host_names[0]])]

    def default_binding(self) -> List[str]:
        return list(HYDRA_BINDING)

    def nic_flags(self, job: MpirunJob) -> List[str]:
        return ["-iface", job.nics[0], "-genv", "NCCL_SOCKET_IFNAME", ",".join(job.nics)] if job.nics else []

    def env_flags(self, job: MpirunJob) -> List[str]:
        return ["-genvlist", ",".join(job.env_names)] if job.env_names else []


class MPICHFlavor(HydraFlavor):
    """MPICH: an unambiguous tag per write (put back into lines), every rank's exit code, ssh options through
    ``HYDRA_LAUNCHER_EXTRA_ARGS``."""

    name = MPICH
    label = "MPICH"
    signature = VersionSignature(("MPICH", "HYDRA"), r"Version:\s+(\d+)")

    def tag_flags(self) -> List[str]:
        return ["-prepend-pattern", MPICH_PREPEND_PATTERN, "-print-all-exitcodes"]

    def launcher_flags(self, job: MpirunJob) -> List[str]:
        return ["-launcher", "ssh"] if job.ssh_args else []   # the options: launcher_env

    def launcher_env(self, settings: Settings) -> Dict[str, str]:
        """MPICH's ssh launcher takes the ssh options from ``HYDRA_LAUNCHER_EXTRA_ARGS`` (split at spaces),
        having no command-line flag for them."""
        args = ssh_args(settings)
        return {"HYDRA_LAUNCHER_EXTRA_ARGS": " ".join(args)} if args else {}

    def regroups_writes(self) -> bool:
        return True

    def prints_exit_codes(self) -> bool:
        return True


class IntelMPIFlavor(HydraFlavor):
    """Intel MPI: Hydra's ``-l`` tags, ssh options through ``-bootstrap-exec-args``."""

    name = INTEL
    label = "Intel MPI"
    signature = VersionSignature(("Intel(R) MPI",), r"Version\s+(\d+)")

    def tag_flags(self) -> List[str]:
        return ["-l"]

    def launcher_flags(self, job: MpirunJob) -> List[str]:
        if not job.ssh_args:
            return []
        return ["-bootstrap", "ssh", "-bootstrap-exec-args", " ".join(job.ssh_args)]
