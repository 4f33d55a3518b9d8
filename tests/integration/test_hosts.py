"""The namespace-hosts fixture (tests/support/hosts.py) and one real job over ssh across two of its hosts.

These tests need root, iproute2 and openssh-server: elsewhere they skip with the reason, and under ``.ci/run``
(HOROVOD_TEST_REQUIRE_HOSTS=1) they fail instead.
"""
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections import Counter

import psutil
import pytest

from tests.support.hosts import NETNS_ETC, ShapingUnavailable, hosts_or_skip, netns_pids
from tests.support.launch import horovodrun, rank_lines

pytestmark = pytest.mark.timeout(120)


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def _netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_each_host_answers_ssh_with_its_own_hostname_and_resolves_the_others():
    with hosts_or_skip(2) as cluster:
        names = [h.name for h in cluster.hosts]
        assert len(set(names)) == 2 and len({h.address for h in cluster.hosts}) == 2
        for host in cluster.hosts:
            result = host.run("hostname; getent hosts " + " ".join(names))
            assert result.returncode == 0, result.stderr
            lines = result.stdout.split("\n")
            assert lines[0] == host.name
            resolved = {line.split()[1]: line.split()[0] for line in lines[1:] if line.strip()}
            assert resolved == {h.name: h.address for h in cluster.hosts}
        assert socket.gethostname() not in names  # the root namespace keeps its own name


@pytest.mark.slow
def test_cut_link_makes_the_host_unreachable_and_restore_brings_it_back():
    with hosts_or_skip(2) as cluster:
        first, second = cluster.hosts
        first.cut()
        try:
            assert first.run("true", timeout=20, connect_timeout=1).returncode != 0
            # The other host still answers, and cannot reach the cut one either.
            probe = f"timeout 2 bash -c 'echo > /dev/tcp/{first.address}/{first.port}' && echo reachable"
            other = second.run(probe, timeout=20)
            assert other.returncode != 0 and "reachable" not in other.stdout
        finally:
            first.restore()
        assert first.pids(), "cutting the link must not stop the host's processes"
        deadline = time.monotonic() + 10
        while first.run("true", timeout=20, connect_timeout=2).returncode != 0:
            assert time.monotonic() < deadline, "ssh did not come back after restore()"
            time.sleep(0.2)
        assert second.run(f"timeout 3 bash -c 'echo > /dev/tcp/{first.address}/{first.port}'").returncode == 0


def test_kill_all_leaves_no_process_in_the_namespace_and_sshd_can_be_restarted():
    with hosts_or_skip(1) as cluster:
        (host,) = cluster.hosts
        sleeper = subprocess.Popen(host.ssh_command("sleep 300 & sleep 300; true"), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while len(host.pids()) < 3:  # sshd, its session, the sleeps
                assert time.monotonic() < deadline, f"the remote sleeps did not start: {host.pids()}"
                time.sleep(0.1)
            before = host.pids()
            host.kill_all()
            assert host.pids() == []
            assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                           for p in before)
            assert sleeper.wait(timeout=10) != 0  # the ssh session died with the host
        finally:
            if sleeper.poll() is None:
                sleeper.kill()
                sleeper.wait()
        host.start_sshd()
        assert host.run("hostname").stdout.strip() == host.name


def test_shape_limits_the_rate_towards_the_host():
    with hosts_or_skip(1) as cluster:
        (host,) = cluster.hosts
        payload = b"x" * 500_000

        def send_seconds() -> float:
            start = time.monotonic()
            subprocess.run(host.ssh_command("cat > /dev/null"), input=payload, check=True, timeout=60)
            return time.monotonic() - start

        host.shape(rate="2mbit")  # 500 kB at 250 kB/s: about two seconds (about 0.3 s unshaped)
        assert send_seconds() >= 1.5
        host.shape()
        assert "tbf" not in subprocess.run(["tc", "qdisc", "show", "dev", host.veth], capture_output=True,
                                           text=True, check=True).stdout


def test_shape_adds_latency_towards_the_host():
    with hosts_or_skip(1) as cluster:
        (host,) = cluster.hosts

        def connect_seconds() -> float:
            start = time.monotonic()
            socket.create_connection((host.address, host.port), timeout=5).close()
            return time.monotonic() - start

        try:
            host.shape(delay_ms=300)
        except ShapingUnavailable as exc:
            pytest.skip(f"this kernel cannot add latency: {exc}")
        assert connect_seconds() >= 0.3
        host.shape()
        assert min(connect_seconds() for _ in range(3)) < 0.3


def test_nothing_is_left_after_the_context_exits_even_on_error():
    with pytest.raises(RuntimeError, match="body failed"):
        with hosts_or_skip(2) as cluster:
            made = {
                "netns": [h.netns for h in cluster.hosts],
                "links": [cluster.bridge] + [h.veth for h in cluster.hosts],
                "sshd": [h.sshd.pid for h in cluster.hosts],
                "paths": [cluster.workdir] + [NETNS_ETC / h.netns for h in cluster.hosts],
            }
            assert all(name in _netns_list() for name in made["netns"])
            assert all(f" {name}:" in _links() or f" {name}@" in _links() for name in made["links"])
            raise RuntimeError("body failed")
    netns, links = _netns_list(), _links()
    assert not [n for n in made["netns"] if n in netns]
    assert not [n for n in made["netns"] if netns_pids(n)]
    assert not [n for n in made["links"] if n in links]
    assert not [p for p in made["sshd"] if psutil.pid_exists(p)]
    assert not [p for p in made["paths"] if os.path.exists(p)]
    workdir = str(made["paths"][0])
    leftovers = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(workdir in part for part in proc.info["cmdline"] or ()):
            leftovers.append(proc.pid)
    assert not leftovers


ALLREDUCE = """
import faulthandler, json, signal, socket, sys
faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
import numpy as np
import horovod.numpy as hvd
hvd.init()
total = hvd.allreduce(np.array([float(hvd.rank() + 1)]), op=hvd.Sum)
print("RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "host": socket.gethostname(),
                               "local_rank": hvd.local_rank(), "sum": float(total[0])}), flush=True)
hvd.shutdown()
"""


@pytest.mark.timeout(180)
def test_horovodrun_runs_a_job_over_ssh_across_two_namespace_hosts():
    with hosts_or_skip(2) as cluster:
        with cluster.dump_stacks_after(110):
            proc = horovodrun(4, [sys.executable, "-c", ALLREDUCE], hosts=cluster.hosts_arg(2),
                              extra_args=cluster.launcher_args(), env=cluster.launcher_env(), timeout=120)
        assert proc.returncode == 0, proc.stdout[-4000:]
        results = {}
        for rank in range(4):
            found = [json.loads(line[len("RESULT "):]) for line in rank_lines(proc.stdout, rank)
                     if line.startswith("RESULT ")]
            assert found, f"rank {rank} printed no result:\n{proc.stdout[-4000:]}"
            results[rank] = found[-1]
        assert all(r["sum"] == 1 + 2 + 3 + 4 and r["size"] == 4 for r in results.values())
        hosts_of = Counter(r["host"] for r in results.values())
        assert hosts_of == Counter({h.name: 2 for h in cluster.hosts}), results
        assert sorted(r["local_rank"] for r in results.values()) == [0, 0, 1, 1]
        assert cluster.python_pids() == [], "the ranks must be gone when the job is"


@pytest.mark.slow
def test_dump_stacks_after_makes_remote_ranks_print_their_stacks():
    with hosts_or_skip(1) as cluster:
        (host,) = cluster.hosts
        hang = ("import faulthandler, signal, sys, time; "
                "faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True); "
                "print('started', flush=True); time.sleep(30)")
        command = f"timeout 6 {sys.executable} -c {shlex.quote(hang)}"
        with cluster.dump_stacks_after(2):
            result = host.run(command, timeout=30)
        assert "started" in result.stdout
        assert "most recent call first" in result.stderr and '"<string>", line 1' in result.stderr, result.stderr


@pytest.mark.parametrize("required", ["", "1"])
def test_unavailable_hosts_skip_with_the_reason_or_fail_when_required(monkeypatch, required):
    import tests.support.hosts as hosts

    monkeypatch.setattr(hosts, "missing_requirements", lambda: "namespace hosts need root")
    monkeypatch.setenv(hosts.REQUIRE_ENV, required)
    expected = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(expected, match="namespace hosts need root"):
        with hosts_or_skip(2):
            raise AssertionError("the body must not run")
