"""ssh command construction for remote ranks: options, quoting, and the secret never on a command line."""
import shlex
import subprocess
import sys

import pytest

from horovod.common.wire import SECRET_ENV
from horovod.runner import gloo_run, ssh
from horovod.runner.common.util import network
from horovod.runner.common.util.hosts import SlotInfo
from horovod.runner.common.util.settings import Settings

SECRET = "ab" * 32


def test_base_command_options():
    assert ssh.ssh_base_command("h") == [
        "ssh", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "h"]
    cmd = ssh.ssh_base_command("h", port=2222, identity_file="/home/u/.ssh/id")
    assert cmd[-5:] == ["-p", "2222", "-i", "/home/u/.ssh/id", "h"]


def test_build_ssh_command_quotes_and_keeps_secret_off_argv():
    argv = ssh.build_ssh_command("worker1", ["python", "train.py", "--name", "it's"],
                                 {"HOROVOD_RANK": "3", "WEIRD": "a b;c"}, "/work dir", port=22)
    assert argv[0] == "ssh" and argv[-2] == "worker1"
    script = argv[-1]
    assert f"IFS= read -r {SECRET_ENV}" in script and f"export {SECRET_ENV}" in script
    assert "cd '/work dir'" in script
    assert "HOROVOD_RANK=3" in script and "WEIRD='a b;c'" in script
    assert shlex.join(["python", "train.py", "--name", "it's"]) in script
    assert SECRET not in " ".join(argv)


def test_remote_env_must_not_contain_secret():
    with pytest.raises(ValueError):
        ssh.remote_shell_command(["true"], {SECRET_ENV: SECRET}, "/")


def test_secret_stdin():
    assert ssh.secret_stdin(SECRET) == SECRET.encode() + b"\n"
    with pytest.raises(ValueError):
        ssh.secret_stdin("a\nb")


def test_remote_script_runs_under_sh_reads_secret_and_stops_on_eof(tmp_path):
    # Run the script that ssh would run remotely under a local /bin/sh.
    code = ("import os,sys,time; print(os.environ['_HOROVOD_SECRET_KEY'], os.environ['X'], os.getcwd()); "
            "sys.stdout.flush(); time.sleep(30)")
    script = ssh.remote_shell_command([sys.executable, "-c", code], {"X": "y z"}, str(tmp_path))
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdin.write(ssh.secret_stdin(SECRET))
        proc.stdin.flush()
        assert proc.stdout.readline().decode().split() == [SECRET, "y", "z", str(tmp_path)]
        proc.stdin.close()  # the launcher went away: the rank is stopped
        assert proc.wait(timeout=10) != 0
    finally:
        proc.kill()
        proc.wait()


def test_remote_script_propagates_exit_code():
    script = ssh.remote_shell_command(["sh", "-c", "exit 7"], {}, "/")
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.PIPE)
    proc.stdin.write(b"x\n")
    proc.stdin.flush()  # stdin stays open, as ssh's does while the launcher runs
    try:
        assert proc.wait(timeout=10) == 7
    finally:
        proc.stdin.close()


def _settings(**kw):
    return Settings(num_proc=2, hosts="remote1:1,localhost:1", **kw)


def test_worker_spec_remote(monkeypatch):
    monkeypatch.setattr(gloo_run, "is_local_host", lambda h: h in ("localhost",))
    slot = SlotInfo("remote1", rank=1, local_rank=0, cross_rank=1, size=2, local_size=1, cross_size=2)
    base_env = {"PATH": "/usr/bin", SECRET_ENV: "old", "CUDA_VISIBLE_DEVICES": "0", "BASH_FUNC_x%%": "() {}"}
    spec = gloo_run.worker_spec(slot, ["python", "t.py"], base_env, {"HOROVOD_CONTROLLER": "gloo"}, SECRET,
                                _settings(ssh_port=2022, ssh_identity_file="/id"), cwd="/w")
    joined = " ".join(spec.argv)
    assert spec.argv[:1] == ["ssh"] and "-p 2022 -i /id remote1" in joined
    assert "HOROVOD_RANK=1" in joined and "HOROVOD_HOSTNAME=remote1" in joined and "PATH=/usr/bin" in joined
    assert "CUDA_VISIBLE_DEVICES" not in joined and "BASH_FUNC" not in joined
    assert SECRET not in joined and SECRET not in spec.display and "old" not in joined
    assert SECRET_ENV not in spec.env  # the local ssh client does not get it either
    assert spec.stdin_data == SECRET.encode() + b"\n"


def test_worker_spec_local_gets_secret_in_env_only():
    slot = SlotInfo("localhost", rank=0, local_rank=0, cross_rank=0, size=1, local_size=1, cross_size=1)
    spec = gloo_run.worker_spec(slot, ["python", "t.py"], {"PATH": "/bin"}, {"HOROVOD_CONTROLLER": "gloo"}, SECRET,
                                _settings())
    assert spec.argv == ["python", "t.py"] and spec.stdin_data is None
    assert spec.env[SECRET_ENV] == SECRET and spec.env["HOROVOD_RANK"] == "0"
    assert SECRET not in spec.display and "HOROVOD_RANK=0" in spec.display


def test_local_host_detection():
    import socket

    for name in ("localhost", "127.0.0.1", "127.0.1.1", socket.gethostname()):
        assert network.is_local_host(name), name
    assert not network.is_local_host("no-such-host.invalid")
    assert network.filter_local_addresses(["localhost", "no-such-host.invalid"]) == ["no-such-host.invalid"]


def test_check_ssh_reports_failure(monkeypatch):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 255, b"", b"Permission denied (publickey).")

    monkeypatch.setattr(ssh.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match="Permission denied"):
        ssh.check_all_hosts_ssh(["h1"], port=2, identity_file="/id")
    assert len(calls) == ssh.SSH_CHECK_ATTEMPTS
    assert calls[0][-4:] == ["-o", "ConnectTimeout=10", "h1", "true"]
    assert ["-p", "2", "-i", "/id"] == calls[0][5:9]
