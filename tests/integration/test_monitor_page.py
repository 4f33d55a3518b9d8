"""The live page of a running job (horovodrun --monitor-port 0): its JSON while ranks stream collectives, every
rank's stack on request, rank 0 naming a rank stopped between collectives, and, in a real headless browser (Debian's Chromium through Selenium), one row per rank
and a rank stopped with SIGSTOP shown as not answering while rank 0 waits for it.

The worker is tests/integration/workers/freeze.py (allreduces back to back; rank 1 stops itself inside one when
asked). The launcher runs in a session of its own and its output is read while it runs; every job has a hard
timeout, after which its process group is killed.
"""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.support import browser
from tests.support.freeze import CHUNKED_MIB, WORKER
from tests.support.launch import ROOT, _job_env

URL_LINE = re.compile(r"Live page of the job: (http://\S+)")
SMALL_CHUNKS = {"HOROVOD_SHM_CHUNK_BYTES": "65536"}


class LiveJob:
    """horovodrun in the background, its output collected line by line; ended by its process group."""

    def __init__(self, np_, command, env, timeout):
        args = [sys.executable, "-m", "horovod.runner", "-np", str(np_), "--monitor-port", "0", *command]
        self.deadline = time.monotonic() + timeout
        self.lines = []
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=_job_env(env), cwd=str(ROOT), start_new_session=True,
                                     stdin=subprocess.DEVNULL)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self):
        return "\n".join(self.lines)

    def url(self, within=60.0):
        """The page's URL, from the launcher's line."""
        end = min(self.deadline, time.monotonic() + within)
        while time.monotonic() < end:
            for line in list(self.lines):
                found = URL_LINE.search(line)
                if found:
                    return found.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no URL line from the launcher:\n{self.output[-3000:]}")

    def wait(self):
        """The launcher's exit status, within the job's timeout (else its process group is killed)."""
        try:
            code = self.proc.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job outlived its timeout:\n{self.output[-5000:]}") from None
        self._reader.join(10)
        return code

    def kill(self):
        """SIGTERM to the launcher (it stops its ranks, continuing a stopped one); what is left after 10 s, the
        launcher and every process under it (the ranks run in sessions of their own), is killed by pid."""
        try:
            launcher = psutil.Process(self.proc.pid)
            family = [launcher, *launcher.children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        for process in family:      # psutil checks that the pid still names the same process
            for signum in (signal.SIGCONT, signal.SIGKILL):      # a stopped process must be able to die
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(signum)
        self.proc.wait(30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.kill()


def get_json(url, path, method="GET"):
    base, token = url.split("/?token=")
    req = urllib.request.Request(f"{base}{path}?token={token}", method=method,
                                 data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=10) as reply:
        return json.loads(reply.read())


def poll(url, ready, within, what):
    """The first /api/status for which ``ready(status)`` holds, within ``within`` seconds."""
    end, status = time.monotonic() + within, None
    while time.monotonic() < end:
        status = get_json(url, "/api/status")
        if ready(status):
            return status
        time.sleep(0.2)
    raise AssertionError(f"{what}: never seen within {within:.0f} s; last status: {json.dumps(status)[:3000]}")


@pytest.mark.parametrize("np_,plane", [(2, {}), (3, {"HOROVOD_CPU_OPERATIONS": "tcp"})], ids=["2-shm", "3-tcp"])
def test_status_lists_every_rank_with_rising_sequence_numbers_and_stacks_come_from_each(np_, plane):
    with LiveJob(np_, [sys.executable, WORKER, "1", "-1", "8"], {**SMALL_CHUNKS, **plane}, timeout=90) as job:
        url = job.url()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{32}", url), url
        first = poll(url, lambda s: all(r["pid"] and (r["last_completed_seq"] or 0) > 0 for r in s["ranks"]),
                     45, "every rank beating")
        assert first["job"]["size"] == np_ and [r["rank"] for r in first["ranks"]] == list(range(np_))
        assert all(r["host"] for r in first["ranks"]) and len({r["pid"] for r in first["ranks"]}) == np_
        seqs = [r["last_completed_seq"] for r in first["ranks"]]
        later = poll(url, lambda s: all(r["last_completed_seq"] > seq for r, seq in zip(s["ranks"], seqs)), 10,
                     "sequence numbers rising")
        assert all(r["collectives_per_s"] is not None for r in later["ranks"]), later
        stacks = get_json(url, "/api/stacks", "POST")["stacks"]
        assert [(s["rank"], s["answered"]) for s in stacks] == [(r, True) for r in range(np_)], stacks
        for s in stacks:
            assert s["text"].startswith(f"Rank {s['rank']}'s Python stack") and "freeze.py" in s["text"], s
        assert job.wait() == 0, job.output[-3000:]


def test_a_rank_stopped_between_collectives_is_named_by_rank_0_negotiating(tmp_path):
    """Rank 1 stops before it submits the next allreduce: rank 0's row says which tensor waits for which rank."""
    stop_file = tmp_path / "stopped"
    worker = str(ROOT / "tests" / "integration" / "workers" / "stop_between.py")
    with LiveJob(2, [sys.executable, worker], {"STOP_FILE": str(stop_file)}, timeout=90) as job:
        url = job.url()
        wait_for("rank 1 stopped", stop_file.exists, 45)
        status = poll(url, lambda s: s["ranks"][0]["state"] == "negotiating"
                      and s["ranks"][1]["state"] in ("stopped", "not answering"), 30, "rank 0 negotiating")
        zero, one = status["ranks"]
        assert zero["missing_ranks"] == [1] and zero["negotiating"] == "allreduce.after.the.stop", zero
        assert zero["state_text"].endswith("tensor 'allreduce.after.the.stop' waits for rank 1 to submit it"), zero
        assert "stopped (SIGSTOP" in one["state_text"], one
        os.kill(int(stop_file.read_text().split()[1]), signal.SIGCONT)
        assert job.wait() == 0, job.output[-3000:]
        assert job.output.count("RESULT ok") == 2, job.output[-3000:]


def test_a_rank_stopped_before_its_first_heartbeat_is_named_stopped_from_its_process(tmp_path):
    """Rank 1 stops before hvd.init(): no heartbeat ever came, but the launcher started it and its row says
    what the kernel says of the process, not "starting"."""
    stop_file = tmp_path / "stopped"
    worker = str(ROOT / "tests" / "integration" / "workers" / "stop_at_start.py")
    with LiveJob(2, [sys.executable, worker], {"STOP_FILE": str(stop_file)}, timeout=90) as job:
        url = job.url()
        wait_for("rank 1 stopped", stop_file.exists, 45)
        status = poll(url, lambda s: s["ranks"][1]["state"] == "stopped", 30, "rank 1 stopped")
        one = status["ranks"][1]
        assert one["state_text"] == "no heartbeat yet, and the process is stopped (SIGSTOP, or a debugger holds it)"
        assert one["pid"] == int(stop_file.read_text().split()[1]) and one["heartbeat_age_s"] is None, one
        os.kill(one["pid"], signal.SIGCONT)
        assert job.wait() == 0, job.output[-3000:]
        assert job.output.count("RESULT ok") == 2, job.output[-3000:]


def rank_row(driver, rank):
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, f'#ranks tbody tr[data-rank="{rank}"]')
    return rows[0] if rows else None


def wait_for(what, check, within, seen=None):
    """Wait until ``check()`` holds; else fail with ``what`` and, from ``seen()``, what the page showed last."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            if check():
                return
        except Exception:       # a row redrawn between two lookups
            pass
        time.sleep(0.2)
    last = ""
    if seen is not None:
        try:
            last = f"; last seen: {seen()}"
        except Exception as exc:
            last = f"; the page could not be read: {exc}"
    raise AssertionError(f"{what}: not seen within {within:.0f} s{last}")


@pytest.mark.slow
@pytest.mark.skipif(bool(browser.missing()) and not browser.REQUIRED, reason=browser.missing() or "browser present")
def test_the_page_in_a_browser_shows_a_stopped_rank_and_rank_0_waiting_for_it(tmp_path):
    assert not browser.missing(), f"{browser.missing()} (HOROVOD_TEST_REQUIRE_BROWSER=1: CI must run this test)"
    from selenium.webdriver.common.by import By

    stop_file = tmp_path / "stopped"
    env = {**SMALL_CHUNKS, "STOP_FILE": str(stop_file), "HOROVOD_STALL_CHECK_TIME_SECONDS": "2"}
    with LiveJob(2, [sys.executable, WORKER, str(CHUNKED_MIB), "2", "8"], env, timeout=120) as job:
        url = job.url()
        with browser.headless_chromium() as driver:
            driver.get(url)
            wait_for("one row per rank", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#ranks tbody tr")) == 2,
                     45)
            wait_for("rank 1 stopped", stop_file.exists, 45)
            wait_for("rank 1 not answering and rank 0 waiting for it",
                     lambda: rank_row(driver, 1).get_attribute("data-state") in ("stopped", "not answering")
                     and rank_row(driver, 0).get_attribute("data-state") == "waiting", 30,
                     lambda: f"{[rank_row(driver, r).text for r in (0, 1)]}\n{job.output[-3000:]}")
            one, zero = rank_row(driver, 1).text, rank_row(driver, 0).text
            assert "no heartbeat for" in one and "stopped (SIGSTOP" in one, one
            assert "waiting" in zero and "for rank 1" in zero, zero
            wait_for("the data-plane report", lambda: "Data plane stalled" in
                     driver.find_element(By.ID, "reports").text, 15)
            shot = os.environ.get("HOROVOD_MONITOR_SCREENSHOT")     # docs/img/monitor-page.png came from here
            if shot:
                driver.save_screenshot(str(Path(shot).resolve()))
            # Without the token the page shows nothing of the job.
            driver.get(url.split("?")[0])
            body = driver.find_element(By.TAG_NAME, "body").text
            assert body.startswith("This page needs the token") and "waiting" not in body, body
            assert not driver.find_elements(By.ID, "ranks")
        os.kill(int(stop_file.read_text().split()[1]), signal.SIGCONT)     # the job ends by itself
        assert job.wait() == 0, job.output[-3000:]
