"""End-to-end tests of the real launcher (``python -m horovod.runner``), each call under a hard timeout.

The workers are tiny ``python -c`` scripts; they do not call ``hvd.init()``.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from horovod.common import wire
from horovod.common.kvstore import KVStoreClient
from horovod.runner.rendezvous import RendezvousServer

pytestmark = pytest.mark.timeout(120)

HOROVODRUN = [sys.executable, "-m", "horovod.runner"]
TIMEOUT = 60


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_") and k != wire.SECRET_ENV}
    env.update(extra)
    return env


def hvdrun(*args, timeout=TIMEOUT, env=None):
    return subprocess.run(HOROVODRUN + [str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env(), stdin=subprocess.DEVNULL)


def py(*parts):
    return [sys.executable, "-c", "\n".join(textwrap.dedent(p) for p in parts)]


def gone(pid, timeout=5.0):
    """True when ``pid`` no longer runs (absent or a zombie awaiting its reaper)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def wait_for_files(directory, count, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = [n for n in os.listdir(directory) if not n.endswith(".tmp")]
        if len(names) >= count:
            return sorted(names)
        time.sleep(0.05)
    raise AssertionError(f"only {os.listdir(directory)} appeared in {directory}")


# A worker that records its pid (and optionally a grandchild's) atomically under PIDDIR.
PID_WRITER = """
import os, subprocess, sys, time
piddir = os.environ["PIDDIR"]
rank = os.environ["HOROVOD_RANK"]
pids = [os.getpid()]
if os.environ.get("GRANDCHILD"):
    pids.append(subprocess.Popen(["sleep", "100"]).pid)
with open(os.path.join(piddir, rank + ".tmp"), "w") as f:
    f.write(" ".join(map(str, pids)))
os.rename(os.path.join(piddir, rank + ".tmp"), os.path.join(piddir, "pid." + rank))
"""


def read_pids(piddir):
    pids = []
    for name in os.listdir(piddir):
        if name.startswith("pid."):
            with open(os.path.join(piddir, name)) as f:
                pids += [int(p) for p in f.read().split()]
    return pids


@pytest.mark.parametrize("np_", [2, 3])
def test_output_is_prefixed_per_rank(np_):
    result = hvdrun("-np", np_, *py("""
        import os, sys
        print("rank=%s size=%s" % (os.environ["HOROVOD_RANK"], os.environ["HOROVOD_SIZE"]))
        print("err%s" % os.environ["HOROVOD_RANK"], file=sys.stderr)
        """))
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"[{r}]<stdout>:rank={r} size={np_}" for r in range(np_)]
    assert sorted(result.stderr.splitlines()) == [f"[{r}]<stderr>:err{r}" for r in range(np_)]


def test_rank_environment_on_two_simulated_hosts():
    result = hvdrun("-np", 4, "-H", "localhost:2,127.0.0.1:2", *py("""
        import json, os
        print(json.dumps({k: v for k, v in os.environ.items()
                          if k.startswith("HOROVOD_") or k in ("PYTHONUNBUFFERED", "_HOROVOD_SECRET_KEY")}))
        """))
    assert result.returncode == 0, result.stderr
    envs = {}
    for line in result.stdout.splitlines():
        prefix, _, payload = line.partition(":")
        env = json.loads(payload)
        assert prefix == f"[{env['HOROVOD_RANK']}]<stdout>"
        envs[int(env["HOROVOD_RANK"])] = env
    assert sorted(envs) == [0, 1, 2, 3]
    expected = {  # rank: (host, local_rank, local_size, cross_rank, cross_size)
        0: ("localhost", 0, 2, 0, 2), 1: ("localhost", 1, 2, 0, 2),
        2: ("127.0.0.1", 0, 2, 1, 2), 3: ("127.0.0.1", 1, 2, 1, 2),
    }
    for rank, (host, local_rank, local_size, cross_rank, cross_size) in expected.items():
        env = envs[rank]
        assert env["HOROVOD_HOSTNAME"] == host
        assert env["HOROVOD_SIZE"] == "4"
        assert (env["HOROVOD_LOCAL_RANK"], env["HOROVOD_LOCAL_SIZE"]) == (str(local_rank), str(local_size))
        assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == (str(cross_rank), str(cross_size))
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"
        assert int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) > 0
        assert env["HOROVOD_CONTROLLER"] == "gloo"
        assert env["HOROVOD_START_TIMEOUT"] == "30"
        assert env["PYTHONUNBUFFERED"] == "1"
        assert "HOROVOD_GLOO_IFACE" not in env
        assert len(env["_HOROVOD_SECRET_KEY"]) == 64
    assert len({e["_HOROVOD_SECRET_KEY"] for e in envs.values()}) == 1
    assert len({e["HOROVOD_GLOO_RENDEZVOUS_PORT"] for e in envs.values()}) == 1


def test_flags_reach_the_ranks_and_hostfile(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    result = hvdrun("-np", 2, "-hostfile", hostfile, "--fusion-threshold-mb", 4, "--cycle-time-ms", 2,
                    "--log-level", "INFO", "--start-timeout", 12, *py("""
        import os
        print(os.environ["HOROVOD_FUSION_THRESHOLD"], os.environ["HOROVOD_CYCLE_TIME"],
              os.environ["HOROVOD_LOG_LEVEL"], os.environ["HOROVOD_START_TIMEOUT"], os.environ["HOROVOD_HOSTNAME"])
        """))
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"[{r}]<stdout>:4194304 2.0 INFO 12 localhost" for r in (0, 1)]


def test_np_smaller_than_slots_starts_np_ranks():
    result = hvdrun("-np", 2, "-H", "localhost:4", *py("import os; print(os.environ['HOROVOD_SIZE'])"))
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[0]<stdout>:2", "[1]<stdout>:2"]


def test_output_filename_layout(tmp_path):
    out = tmp_path / "logs"
    result = hvdrun("-np", 3, "--output-filename", out, *py("""
        import os, sys
        print("hello", os.environ["HOROVOD_RANK"])
        print("oops", os.environ["HOROVOD_RANK"], file=sys.stderr)
        """))
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == ["rank.0", "rank.1", "rank.2"]
    for r in range(3):
        assert sorted(os.listdir(out / f"rank.{r}")) == ["stderr", "stdout"]
        assert (out / f"rank.{r}" / "stdout").read_text() == f"hello {r}\n"
        assert (out / f"rank.{r}" / "stderr").read_text() == f"oops {r}\n"
    assert "[1]<stdout>:hello 1" in result.stdout  # also teed to the console


def test_fail_fast_names_the_first_failed_rank_and_stops_the_others(tmp_path):
    piddir = str(tmp_path)
    start = time.monotonic()
    result = hvdrun("-np", 3, *py(PID_WRITER, """
        if rank == "1":
            deadline = time.time() + 20
            while len([n for n in os.listdir(piddir) if n.startswith("pid.")]) < 3 and time.time() < deadline:
                time.sleep(0.05)
            print("rank 1 is failing on purpose", file=sys.stderr)
            sys.exit(3)
        time.sleep(60)
        """), env=clean_env(PIDDIR=piddir, GRANDCHILD="1"))
    elapsed = time.monotonic() - start
    assert result.returncode == 3, result.stderr
    assert elapsed < 20, elapsed
    err = result.stderr
    assert ("Horovod detected that one or more processes exited with non-zero status, thus causing the job to be "
            "terminated. The first process to do so was:") in err
    assert "Process name: 1" in err and "Exit code: 3" in err and "Host: localhost" in err
    assert "    [1]<stderr>:rank 1 is failing on purpose" in err
    pids = read_pids(piddir)
    assert len(pids) == 6
    assert all(gone(pid) for pid in pids), [p for p in pids if not gone(p, 0)]


def test_rank_killed_by_sigkill_is_reported(tmp_path):
    result = hvdrun("-np", 2, *py("""
        import os, signal, time
        if os.environ["HOROVOD_RANK"] == "1":
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        """))
    assert result.returncode == 128 + signal.SIGKILL
    assert "Process name: 1" in result.stderr and "killed by SIGKILL" in result.stderr


def test_sigint_to_horovodrun_stops_everything(tmp_path):
    piddir = str(tmp_path)
    proc = subprocess.Popen(HOROVODRUN + ["-np", "3"] + py(PID_WRITER, "time.sleep(60)"),
                            env=clean_env(PIDDIR=piddir, GRANDCHILD="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        wait_for_files(piddir, 3)
        pids = read_pids(piddir)
        assert len(pids) == 6 and not any(gone(p, 0) for p in pids)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert time.monotonic() - start < 10
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130
    assert "SIGINT" in err
    assert all(gone(pid) for pid in pids)


def test_sigterm_to_horovodrun_stops_everything(tmp_path):
    piddir = str(tmp_path)
    proc = subprocess.Popen(HOROVODRUN + ["-np", "2"] + py(PID_WRITER, "time.sleep(60)"),
                            env=clean_env(PIDDIR=piddir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    try:
        wait_for_files(piddir, 2)
        pids = read_pids(piddir)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert all(gone(pid) for pid in pids)


def test_secret_never_on_a_command_line_or_in_verbose_output(tmp_path):
    piddir = str(tmp_path)
    worker = """
        if rank == "0":
            with open(os.path.join(piddir, "secret.tmp"), "w") as f:
                f.write(os.environ["_HOROVOD_SECRET_KEY"])
            os.replace(os.path.join(piddir, "secret.tmp"), os.path.join(piddir, "secret"))
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(piddir, "release")) and time.time() < deadline:
            time.sleep(0.05)
        """
    proc = subprocess.Popen(HOROVODRUN + ["-np", "2", "--verbose"] + py(PID_WRITER, worker),
                            env=clean_env(PIDDIR=piddir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    try:
        wait_for_files(piddir, 3)  # pid.0, pid.1, secret
        with open(os.path.join(piddir, "secret")) as f:
            secret = f.read()
        assert len(secret) == 64
        for pid in read_pids(piddir) + [proc.pid]:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert secret.encode() not in f.read()
        open(os.path.join(piddir, "release"), "w").close()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert "HOROVOD_RANK=1" in err  # --verbose printed the per-rank commands...
    assert secret not in out and secret not in err  # ...without the secret


def test_horovod_run_returns_results_by_rank_and_surfaces_exceptions():
    script = textwrap.dedent("""
        import os
        import horovod.runner as hr

        def work(base, scale=1):
            return (int(os.environ["HOROVOD_RANK"]) + base) * scale

        print("RESULTS", hr.run(work, args=(10,), kwargs={"scale": 2}, np=2))

        def fails():
            import time
            if os.environ["HOROVOD_RANK"] == "1":
                raise KeyError("bad key on rank one")
            time.sleep(60)                  # the failure must stop this rank, not wait for it
            return 0

        import time
        start = time.monotonic()
        try:
            hr.run(fails, num_proc=2)
        except RuntimeError as exc:
            print("ERROR", type(exc.__cause__).__name__, str(exc).replace(chr(10), " | "))
        print("SECONDS", time.monotonic() - start)
        """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT,
                            env=clean_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert "RESULTS [20, 22]" in result.stdout
    error = [line for line in result.stdout.splitlines() if line.startswith("ERROR")]
    assert error, result.stdout + result.stderr
    assert error[0].startswith("ERROR KeyError")
    assert "rank 1" in error[0] and "bad key on rank one" in error[0] and "Traceback" in error[0]
    # upstream's sentence first (programs match on it), then ours
    assert ("Horovod detected that one or more processes exited with non-zero status" in error[0]
            and error[0].index("non-zero status") < error[0].index("bad key on rank one")), error[0]
    seconds = float(result.stdout.split("SECONDS")[1].split()[0])
    assert seconds < 30, f"horovod.run waited {seconds:.1f} s for the sleeping rank"


def test_horovod_run_argument_errors():
    import horovod.runner as hr

    with pytest.raises(ValueError):
        hr.run(print, hosts="localhost:1", hostfile="hf")
    with pytest.raises(ValueError):
        hr.run(print, use_gloo=True, use_mpi=True)
    with pytest.raises(ValueError, match="fewer than 2 hosts"):
        hr.run(print, np=1, min_np=1)


def test_rendezvous_rejects_wrong_secret_and_survives_garbage():
    server = RendezvousServer()
    port = server.start()
    try:
        with pytest.raises(wire.AuthenticationError):
            KVStoreClient("127.0.0.1", port, bytes.fromhex(wire.make_secret()), timeout=5)
        for garbage in (b"GET /rendezvous/0 HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(4096), b"\x00" * 64):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(garbage)
                s.settimeout(5)
                try:
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # connect and hang up without a word
        client = KVStoreClient("127.0.0.1", port, server.key, timeout=5)
        try:
            client.put("rendezvous", "0", b"addr")
            assert client.get("rendezvous", "0") == b"addr"
        finally:
            client.close()
        assert server.store.get("rendezvous", "0") == b"addr"
    finally:
        server.stop()


def test_unavailable_modes_exit_with_explanation():
    result = hvdrun("-np", 1, "--jsrun", "true")
    assert result.returncode == 1 and "did not detect an LSF job" in result.stderr
    result = hvdrun("-np", 2, "--min-np", 1, "-H", "localhost:2", "true")
    assert result.returncode == 1 and "Cannot run in fault tolerance mode with fewer than 2 hosts" in result.stderr


def test_missing_program_and_bad_hosts():
    result = hvdrun("-np", 1, "/no/such/program")
    assert result.returncode != 0 and "Could not start rank 0" in result.stderr
    result = hvdrun("-np", 3, "-H", "localhost:2", "true")
    assert result.returncode == 1 and "available slots (2)" in result.stderr


def test_version_and_check_build():
    from importlib.metadata import version

    result = hvdrun("--version")
    assert result.returncode == 0 and result.stdout.strip() == version("horovod")
    result = hvdrun("-cb", timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"Horovod v{version('horovod')}:"
    assert "Available Frameworks:" in lines and "Available Controllers:" in lines
    assert "Available Tensor Operations:" in lines and "    [X] Gloo" in lines
