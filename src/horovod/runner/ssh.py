"""Commands that start a rank on a remote host over ssh, and the ssh reachability check.

The job secret never appears on a command line: the remote shell reads it from ssh's stdin
(``IFS= read -r _HOROVOD_SECRET_KEY``) and exports it before it starts the rank. ssh's stdin then stays open;
when the launcher (and so the local ssh process) goes away, the remote side sees end-of-file and stops the rank.
"""
from __future__ import annotations

import logging
import shlex
import subprocess
import threading
from typing import Iterable, List, Mapping, Optional, Sequence

from horovod.common.wire import SECRET_ENV

log = logging.getLogger(__name__)

SSH_OPTIONS = ["-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no"]
# Elastic workers: ssh ends within about 4 s when the host stops answering (a cut link, a host gone), so the
# driver learns of the failure from the worker's exit instead of waiting on it.
ELASTIC_SSH_OPTIONS = ["-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=3"]
SSH_CHECK_ATTEMPTS = 5


def ssh_base_command(host: str, port: Optional[int] = None, identity_file: Optional[str] = None,
                     options: Sequence[str] = ()) -> List[str]:
    """``ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no [options] [-p port] [-i file] host``."""
    cmd = ["ssh", *SSH_OPTIONS, *options]
    if port:
        cmd += ["-p", str(port)]
    if identity_file:
        cmd += ["-i", identity_file]
    cmd.append(host)
    return cmd


def remote_shell_command(command: Sequence[str], env: Mapping[str, str], cwd: str) -> str:
    """The POSIX shell script run on the remote host for one rank.

    It reads the secret from stdin, changes to ``cwd``, starts ``env K=V ... command`` and stops it when stdin
    reaches end-of-file (the launcher went away). ``env`` must not contain the secret (ValueError if it does).
    """
    if SECRET_ENV in env:
        raise ValueError(f"{SECRET_ENV} must not be put on a command line")
    assignments = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())
    program = " ".join(shlex.quote(str(a)) for a in command)
    return (
        f"IFS= read -r {SECRET_ENV} || exit 1; export {SECRET_ENV}; "
        f"cd {shlex.quote(cwd)} > /dev/null 2>&1; "
        "exec 3<&0; "
        f"env {assignments} {program} < /dev/null 3<&- & _hvd_pid=$!; "
        "( while IFS= read -r _hvd_line; do :; done; kill -TERM $_hvd_pid 2> /dev/null ) <&3 > /dev/null 2>&1 & "
        "_hvd_watch=$!; exec 3<&-; "
        "wait $_hvd_pid; _hvd_rc=$?; kill $_hvd_watch 2> /dev/null; exit $_hvd_rc"
    )


def build_ssh_command(host: str, command: Sequence[str], env: Mapping[str, str], cwd: str,
                      port: Optional[int] = None, identity_file: Optional[str] = None,
                      options: Sequence[str] = ()) -> List[str]:
    """The argv that starts one rank on ``host`` (send :func:`secret_stdin` to its stdin)."""
    return ssh_base_command(host, port, identity_file, options) + [remote_shell_command(command, env, cwd)]


def secret_stdin(secret_hex: str) -> bytes:
    """What to write to the ssh process's stdin so that the remote rank gets the job secret."""
    if "\n" in secret_hex:
        raise ValueError("the secret must be a single line")
    return secret_hex.encode() + b"\n"


def check_ssh(host: str, port: Optional[int] = None, identity_file: Optional[str] = None,
              attempts: int = SSH_CHECK_ATTEMPTS, timeout: float = 30.0) -> Optional[str]:
    """Run ``ssh ... -o ConnectTimeout=10 host true`` up to ``attempts`` times; None on success, else the error."""
    cmd = ssh_base_command(host, port, identity_file)
    cmd = cmd[:-1] + ["-o", "ConnectTimeout=10", host, "true"]
    error = "unknown error"
    for _ in range(attempts):
        try:
            result = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        except FileNotFoundError:
            return "the ssh client is not installed on this machine"
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout:.0f}s"
            continue
        if result.returncode == 0:
            return None
        error = result.stderr.decode("utf-8", "replace").strip() or f"ssh exited with {result.returncode}"
    return error


def check_all_hosts_ssh(hosts: Iterable[str], port: Optional[int] = None, identity_file: Optional[str] = None,
                        timeout: float = 30.0) -> None:
    """Check ssh to every host in parallel; RuntimeError listing the unreachable ones and how to fix it."""
    hosts = list(hosts)
    errors: dict = {}

    def check(h: str) -> None:
        err = check_ssh(h, port, identity_file, timeout=timeout)
        if err is not None:
            errors[h] = err

    threads = [threading.Thread(target=check, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        details = "\n".join(f"  {h}: {e}" for h, e in errors.items())
        example = " ".join(shlex.quote(a) for a in ssh_base_command(next(iter(errors)), port, identity_file))
        raise RuntimeError(
            f"could not connect to some hosts via ssh:\n{details}\n"
            f"Passwordless ssh must work from this machine to every remote host; try `{example} true`, "
            "and use -p/--ssh-port and -i/--ssh-identity-file if needed."
        )
