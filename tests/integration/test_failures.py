"""Failures a real job meets, end to end through the launcher: a killed rank, mismatches, intruders on the
wire, and Horovod without a launcher. Each worker script lives in ``tests/integration/workers``."""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from horovod.common import wire
from tests.support.launch import ROOT, horovodrun, rank_lines

pytestmark = pytest.mark.timeout(180)

WORKERS = ROOT / "tests" / "integration" / "workers"
TIMEOUT = 90


def worker(name, *args):
    return [sys.executable, str(WORKERS / name), *[str(a) for a in args]]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_") and k != wire.SECRET_ENV}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def names_rank(message, rank):
    return re.search(rf"\b[Rr]anks?(\(s\))? (\d+, )*{rank}\b", message) is not None


# ---------------------------------------------------------------------------------------------- dead rank
@pytest.mark.parametrize("np_", [2, 3, 4])
def test_sigkilled_rank_fails_every_survivor_fast_and_the_launcher_names_it(tmp_path, np_):
    kill_file, result_dir = tmp_path / "killed_at", tmp_path / "results"
    result_dir.mkdir()
    result = horovodrun(np_, worker("kill_rank.py"), timeout=TIMEOUT,
                        env={"KILL_FILE": str(kill_file), "RESULT_DIR": str(result_dir)})
    output = result.stdout
    assert kill_file.exists(), output
    survivors = [r for r in range(np_) if r != 1]
    reports = {}
    for r in survivors:
        path = result_dir / f"rank.{r}.json"
        assert path.exists(), f"survivor rank {r} never reported an error:\n{output[-6000:]}"
        reports[r] = json.loads(path.read_text())
    for r, report in reports.items():
        assert report["type"] == "HorovodInternalError", report
        assert report["elapsed"] < 5.0, f"rank {r} noticed the dead rank only after {report['elapsed']:.2f}s"
        assert names_rank(report["message"], 1), f"rank {r}'s error does not name rank 1: {report['message']}"
        assert "LATER_CALL_FAILS_FAST" in rank_lines(output, r), f"rank {r}: a later call did not fail at once"
    # The launcher exits non-zero and names rank 1 (the first to fail) as the root cause.
    assert result.returncode != 0, output[-6000:]
    assert "Process name: 1" in output, output[-6000:]
    assert "SIGKILL" in output, output[-6000:]


# ---------------------------------------------------------------------------------------------- mismatches
def error_lines(output, np_):
    lines = {}
    for r in range(np_):
        mine = [line for line in rank_lines(output, r) if line.startswith("ERROR ")]
        assert len(mine) == 1, f"rank {r} printed {mine}:\n{output[-5000:]}"
        lines[r] = mine[0]
    return lines


def test_mismatched_shapes_two_ranks(tmp_path):
    result = horovodrun(2, worker("mismatch.py", "shape"), timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-5000:]
    for line in error_lines(result.stdout, 2).values():
        assert line.startswith("ERROR HorovodInternalError"), line
        assert "weights" in line, line                      # the tensor
        assert "[2, 3]" in line and "[3, 3]" in line, line  # both shapes
        assert names_rank(line, 0) and names_rank(line, 1), line
    for r in range(2):
        assert "AFTER [1.0, 1.0]" in rank_lines(result.stdout, r), result.stdout[-3000:]


def test_mismatched_broadcast_roots_three_ranks(tmp_path):
    result = horovodrun(3, worker("mismatch.py", "root"), timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-5000:]
    for line in error_lines(result.stdout, 3).values():
        assert line.startswith("ERROR HorovodInternalError"), line
        assert "params" in line and "root" in line.lower(), line
        for other in range(3):
            assert names_rank(line, other), line
        assert re.search(r"root 0\b", line) and re.search(r"root 1\b", line) and re.search(r"root 2\b", line), line
    for r in range(3):
        assert "AFTER [3.0, 3.0]" in rank_lines(result.stdout, r)


@pytest.mark.parametrize("np_, variable, value, theirs, odd", [
    (2, "HOROVOD_FAST_ROUNDS", "0", "True", "False"),
    (3, "HOROVOD_TCP_ALLREDUCE_ALGORITHM", "ring", "'auto'", "'ring'"),
])
def test_a_setting_that_must_be_alike_but_differs_fails_every_rank_at_init_naming_it(np_, variable, value, theirs,
                                                                                       odd):
    """A rank whose environment chooses another way to exchange data (one rank with fast rounds off, say) would
    wait for the others for ever at its first collective; instead every rank's ``hvd.init`` raises at once,
    naming the variable and which ranks have which value."""
    started = time.monotonic()
    result = horovodrun(np_, worker("unalike.py", 1, variable, value), timeout=TIMEOUT,
                        env=clean_env())
    assert time.monotonic() - started < 60, result.stdout[-3000:]
    others = "rank 0" if np_ == 2 else "ranks 0, 2"
    for r in range(np_):
        lines = [line for line in rank_lines(result.stdout, r) if line.startswith(("ERROR", "STARTED"))]
        assert len(lines) == 1 and lines[0].startswith("ERROR ValueError"), result.stdout[-3000:]
        assert "These settings differ between the ranks of this job" in lines[0], lines[0]
        assert re.search(rf"{variable}: {others} \(host [^)]+\) ha(s|ve) {re.escape(theirs)}; rank 1 \(host [^)]+\) "
                         rf"has {re.escape(odd)}", lines[0]), lines[0]
        assert "horovodrun passes its own environment to every rank" in lines[0], lines[0]


# ---------------------------------------------------------------------------------------------- intruders
def _attack(state_dir, outcome):
    """Wait for the job's rendezvous port, then knock on it without the secret, with garbage, and hang up."""
    try:
        port_file = state_dir / "port"
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the job never published its rendezvous port")
            time.sleep(0.05)
        port = int(port_file.read_text())
        outcome["port"] = port
        wrong_key = bytes.fromhex(wire.make_secret())
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            try:
                wire.connect_handshake(sock, wrong_key, b"kv", timeout=10)
                outcome["wrong_key"] = "accepted"
            except wire.AuthenticationError as exc:
                outcome["wrong_key"] = f"rejected: {exc}"
        for garbage in (os.urandom(4096), b"GET /rendezvous/0 HTTP/1.1\r\nHost: localhost\r\n\r\n",
                        b"PUT /rendezvous/0 HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd", b"\xff" * 64):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(garbage)
                sock.settimeout(10)
                try:
                    while sock.recv(4096):
                        pass
                except OSError:
                    pass
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass                                            # connect and hang up without a word
        outcome["garbage"] = "sent"
    except BaseException as exc:  # reported by the test
        outcome["error"] = repr(exc)
    finally:
        (state_dir / "release").touch()


def test_connections_without_the_secret_are_rejected_and_the_job_completes(tmp_path):
    outcome = {}
    attacker = threading.Thread(target=_attack, args=(tmp_path, outcome), daemon=True)
    attacker.start()
    result = horovodrun(2, worker("wait_for_release.py"), env={"STATE_DIR": str(tmp_path)}, timeout=TIMEOUT)
    attacker.join(30)
    assert "error" not in outcome, outcome
    assert outcome.get("wrong_key", "").startswith("rejected"), outcome
    assert outcome.get("garbage") == "sent", outcome
    assert result.returncode == 0, result.stdout[-5000:]
    for r in range(2):
        assert any(line.startswith(f"RESULT ok {r} 2") for line in rank_lines(result.stdout, r)), result.stdout


# ---------------------------------------------------------------------------------------------- no launcher
def test_init_without_a_launcher_is_rank_0_of_1_and_reinit_works():
    result = subprocess.run([sys.executable, str(WORKERS / "single_process.py")], capture_output=True, text=True,
                            timeout=60, env=clean_env(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)])),
                            cwd=str(ROOT), stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    message = "Horovod has not been initialized; use hvd.init()."
    for name in ("rank", "size", "local_rank", "allreduce"):
        assert f"BEFORE_INIT {name} ValueError {message}" in lines, lines
    assert "INITIALIZED False" in lines
    assert "TOPOLOGY 0 1 0 1 0 1" in lines
    assert "SUM [0.0, 1.0, 2.0]" in lines
    assert "GATHER [0, 1] {'a': 1} 0" in lines
    assert "AFTER_SHUTDOWN False" in lines
    assert f"AFTER_SHUTDOWN_RANK ValueError {message}" in lines
    assert "REINIT 0 1 [1.0, 1.0]" in lines
    assert lines[-1] == "DONE"

