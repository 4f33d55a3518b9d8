"""Never silent in the data plane: a rank frozen inside a collective (SIGSTOP, as a debugger or a wedged driver
would leave it) is named, with its state, by every rank that waits for it; with a shutdown time the job ends
with the report; without one the report comes once and the job goes on when the rank is continued.

The worker (tests/integration/workers/freeze.py) streams allreduces in small chunks, so that a collective has
hundreds of waits and rank 1 stops inside one of them. A stuck rank that never submits is the negotiation's
stall inspector's (tests/integration/test_timeline_stall.py); its report names the rank's state and stack too.
"""
import os
import re
import signal
import sys
import time

import pytest

from horovod.runner.process import FAILURE_HEADLINE
from tests.support.freeze import CHUNKED_MIB, WORKER
from tests.support.launch import horovodrun, mpirun, rank_lines
from tests.support.timing import SLACK_S

TIMEOUT = 120
CHECK, SHUTDOWN = 2.0, 4.0
# A log line's head: "[2026-11-27 14:37:41,857] [horovod WARNING rank 0] " (the engine's abort adds "rank 0: ").
LOGGED = re.compile(r"\[[\d-]+ [\d:,]+\] \[horovod (WARNING|ERROR) rank \d+\] (?:rank \d+: )?")
SMALL_CHUNKS = {"HOROVOD_SHM_CHUNK_BYTES": "65536", "HOROVOD_TCP_CHUNK_BYTES": "65536"}
PLANES = {"shm": {}, "tcp": {"HOROVOD_CPU_OPERATIONS": "tcp"}}
# A rank reports a peer it waits on to receive from, or to take what it sends (its kernel buffer full).
STALLED = re.compile(r"Data plane stalled: rank (\d+) \(host [^)]*\) (has received nothing from|could send nothing "
                     r"more to) rank (\d+)(?: \(it takes no more bytes\))? for "
                     r"([\d.]+) s in ALLREDUCE of tensor 'allreduce\.stream\.\d' in the global process set "
                     r"\[(\w+) plane\]")


def run(np_, plane, tmp_path, env, stop_after=2.0, seconds=60.0, timeout=TIMEOUT):
    stop_file = tmp_path / "stopped"
    mib = CHUNKED_MIB if plane == "shm" else 16     # tests.support.freeze: the shm plane's chunked path
    full_env = {**SMALL_CHUNKS, **PLANES[plane], "STOP_FILE": str(stop_file), **env}
    return horovodrun(np_, [sys.executable, WORKER, str(mib), str(stop_after), str(seconds)], env=full_env,
                      timeout=timeout), stop_file


def stalls(out, rank):
    """The data-plane stall reports rank ``rank`` logged: [(level, waiting rank, silent peer, quiet s, plane,
    "receive" or "send")]."""
    found = []
    for line in rank_lines(out, rank):
        logged = LOGGED.match(line)
        m = STALLED.match(line, logged.end()) if logged else None
        if m:
            found.append((logged.group(1), int(m.group(1)), int(m.group(3)), float(m.group(4)), m.group(5),
                          "receive" if m.group(2).startswith("has") else "send"))
    return found


@pytest.mark.parametrize("np_,plane", [(2, "shm"), (3, "shm"), pytest.param(2, "tcp", marks=pytest.mark.slow),
                                      (3, "tcp")])     # quick tier: shm at 2 ranks
def test_a_rank_frozen_inside_a_collective_is_named_and_the_job_ends_after_the_shutdown_time(tmp_path, np_, plane):
    (result, stop_file) = run(np_, plane, tmp_path, {"HOROVOD_STALL_CHECK_TIME_SECONDS": str(CHECK),
                                                     "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(SHUTDOWN)})
    out = result.stdout
    assert stop_file.exists(), out[-5000:]
    assert result.returncode != 0, out[-5000:]
    # Some rank waits for rank 1 itself; its report says rank 1 is stopped, and why no stack can be had. A rank's
    # lines may also carry another rank's report (an abort relays the reason), so only its own reports count.
    reports = {r: [f for f in stalls(out, r) if f[1] == r] for r in range(np_) if r != 1}
    direct = [r for r, found in reports.items() if any(f[2] == 1 for f in found)]
    assert direct, out[-8000:]
    for r in direct:
        text = "\n".join(rank_lines(out, r))
        assert re.search(r"Rank 1 \(host [^,]+, pid \d+\): stopped \(SIGSTOP, or a debugger holds it\)", text), text
        assert "No Python stack can be taken from rank 1: it is stopped." in text, text
        assert all(f[4] == plane for f in reports[r])
        # Once per wait on rank 1, on time: a receive from it, and maybe a send to it (a ring sender's).
        warnings = [f for f in reports[r] if f[0] == "WARNING" and f[2] == 1]
        kinds = [f[5] for f in warnings]
        assert warnings and len(set(kinds)) == len(kinds), reports[r]
        assert all(CHECK <= w[3] < CHECK + SLACK_S for w in warnings), reports[r]
    # The job ends SHUTDOWN s into the stall: a rank that waited for rank 1 fails with the report.
    results = [line for r in direct for line in rank_lines(out, r) if line.startswith("RESULT ")]
    assert results, out[-5000:]
    kind, since_stop = results[0].split()[1], float(results[0].split()[2])
    assert kind == "HorovodInternalError" and SHUTDOWN - 0.5 <= since_stop < SHUTDOWN + SLACK_S, results
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=4 s" in results[0], results
    # The launcher names the failed rank, and its report carries the rank's error, however long the report (the
    # exception's first lines come above its last lines). At 3 ranks the first rank to exit may be one that
    # waited on rank 1 through another (rank 0 receives from rank 2 on the ring, and rank 2 from rank 1): its
    # report then names the peer it waited for, and that peer waiting for rank 1.
    assert FAILURE_HEADLINE in out, out[-3000:]
    report = out.split(FAILURE_HEADLINE)[-1]
    assert re.search(r"Data plane stalled: .* (?:from|to) rank 1 ", report) or re.search(
        r"Data plane stalled: .* from rank (\d+) .*\n.*Rank \1 \(.*waiting [\d.]+ s for rank 1\b", report), report
    assert re.search(r"When the job ended, rank 1 \(pid \d+ on \S+\) was stopped \(SIGSTOP", out), out[-3000:]


@pytest.mark.slow      # the quick tier keeps the shutdown case at 2 ranks on shm
def test_without_a_shutdown_time_the_stall_is_reported_once_and_the_job_goes_on_when_the_rank_continues(tmp_path):
    stop_file = tmp_path / "stopped"
    from threading import Thread

    def continue_rank_1():
        deadline = time.monotonic() + 60
        while not stop_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        stopped_at, pid = stop_file.read_text().split()
        time.sleep(max(0.0, float(stopped_at) + 3 * CHECK + 1 - time.time()))    # long enough for three checks
        os.kill(int(pid), signal.SIGCONT)

    helper = Thread(target=continue_rank_1, daemon=True)
    helper.start()
    (result, _) = run(2, "shm", tmp_path, {"HOROVOD_STALL_CHECK_TIME_SECONDS": str(CHECK)}, seconds=12.0)
    helper.join(5)
    out = result.stdout
    assert result.returncode == 0, out[-5000:]
    assert "RESULT ok" in "\n".join(rank_lines(out, 0)), out[-3000:]
    found = stalls(out, 0)
    assert [f[:3] for f in found] == [("WARNING", 0, 1)], found               # once per stall, not every check
    assert "set HOROVOD_STALL_SHUTDOWN_TIME_SECONDS to end it" in out, out[-3000:]
    assert stalls(out, 1) == [], "the continued rank does not count the time it was stopped itself"



@pytest.mark.slow      # the quick tier runs MPI in test_mpi_suite.py
def test_on_the_mpi_plane_a_frozen_rank_is_named_and_the_job_is_aborted(tmp_path):
    """MPI does not say whom a call waits for: the report names the other ranks' states, and ends the job with
    MPI_Abort (a blocking MPI call cannot be cut as a socket can)."""
    stop_file = tmp_path / "stopped"
    env = {"STOP_FILE": str(stop_file), "HOROVOD_CPU_OPERATIONS": "mpi", "HOROVOD_STALL_CHECK_TIME_SECONDS": str(CHECK),
           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(SHUTDOWN), "HOROVOD_FLIGHT_RECORDER_DIR": str(tmp_path)}
    result = mpirun(2, [sys.executable, WORKER, "16", "2", "60"], env=env, timeout=TIMEOUT)
    out = result.stdout
    assert stop_file.exists() and result.returncode != 0, out[-5000:]
    text = "\n".join(rank_lines(out, 0))
    assert re.search(r"\[horovod WARNING rank 0\] Data plane stalled: rank 0 \(host \S+\) has waited [\d.]+ s inside "
                     r"MPI_\w+ in ALLREDUCE of tensor 'allreduce\.stream\.\d' in the global process set \[mpi plane\], "
                     r"which has run [\d.]+ s\. MPI does not say which rank it waits for; the other ranks:", text), text[-5000:]
    assert re.search(r"Rank 1 \(host \S+, pid \d+\): stopped \(SIGSTOP, or a debugger holds it\)", text), text[-5000:]
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=4 s" in text and "MPI_ABORT was invoked on rank 0" in out, out[-5000:]

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_host_cut_off_during_a_collective_is_reported_unreachable(tmp_path):
    from tests.support.hosts import hosts_or_skip

    with hosts_or_skip(2) as cluster:
        streaming = tmp_path / "streaming"
        victim = cluster.hosts[1]
        cut = {}

        def cut_when_streaming():
            deadline = time.monotonic() + 120
            while not streaming.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            victim.cut()
            cut["at"] = time.time()

        from threading import Thread

        cutter = Thread(target=cut_when_streaming, daemon=True)
        cutter.start()
        env = cluster.launcher_env({**SMALL_CHUNKS, "STREAMING_FILE": str(streaming),
                                    "HOROVOD_STALL_CHECK_TIME_SECONDS": str(CHECK),
                                    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(SHUTDOWN)})
        try:
            with cluster.dump_stacks_after(170):
                result = horovodrun(2, [sys.executable, WORKER, "16", "-1", "90"], hosts=cluster.hosts_arg(1),
                                    extra_args=cluster.launcher_args(), env=env, timeout=180)
        finally:
            cutter.join(5)
            victim.restore()
        out = result.stdout
        assert "at" in cut, out[-5000:]
        assert result.returncode != 0, out[-5000:]
        text = "\n".join(rank_lines(out, 0))
        # Rank 0 waits for rank 1, in the data plane or in negotiation (its requests cannot arrive either): either
        # report says rank 1's host is unreachable, and the job ends.
        assert re.search(rf"Rank 1 \(host [^)]*\): host unreachable: \S+ \({re.escape(victim.address)}\) did not "
                         r"answer a connection attempt", text), text[-6000:]
        assert "No heartbeat for" in text, text[-6000:]
        # The cut-off rank's own watchdog ends it once it can run its report; at the latest when the link is back.
        deadline = time.monotonic() + 30
        while cluster.python_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cluster.python_pids() == [], "no rank may outlive the job on any host"
