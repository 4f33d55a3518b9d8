"""A real headless browser for tests: Debian's Chromium driven by Selenium through Debian's chromedriver.

Nothing is downloaded at run time: the driver's path is given to Selenium (so its Selenium Manager, which would
fetch a browser or a driver, is never asked; :func:`headless_chromium` makes sure of it), and the browser runs
with a fresh profile in a temporary folder, without background networking, component updates or sync. The test
starts it and stops it: ``driver.quit()`` in a ``finally``, then any process of the browser still there is killed
by its pid. Install with ``apt-get install chromium chromium-driver`` (.ci/system-deps) and
``pip install selenium`` (the ``test`` extra).
"""
from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from typing import Iterator, List

import psutil

# .ci/run sets HOROVOD_TEST_REQUIRE_BROWSER=1: there a missing browser fails the browser tests instead of skipping
# them.
REQUIRED = os.environ.get("HOROVOD_TEST_REQUIRE_BROWSER") == "1"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARGUMENTS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
             "--window-size=1500,800")


def missing() -> str:
    """Why the browser cannot run here ('' when it can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium; the test extra has it)"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (apt-get install chromium chromium-driver; see .ci/system-deps)"
    return ""


def _no_selenium_manager(*args, **kwargs):
    raise AssertionError("Selenium Manager was asked for a browser or a driver: nothing may be downloaded")


def _descendants(pid: int) -> List[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@contextlib.contextmanager
def headless_chromium() -> Iterator:
    """A Selenium ``webdriver.Chrome`` on Debian's Chromium, quit afterwards with no process left behind."""
    from selenium import webdriver
    from selenium.webdriver.common.selenium_manager import SeleniumManager

    saved = SeleniumManager.binary_paths
    SeleniumManager.binary_paths = _no_selenium_manager
    with tempfile.TemporaryDirectory(prefix="horovod-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in (*ARGUMENTS, f"--user-data-dir={profile}"):
            options.add_argument(argument)
        service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
        driver = None
        try:
            driver = webdriver.Chrome(options=options, service=service)
            yield driver
        finally:
            pids = []
            if service.process is not None:
                pids = [service.process.pid] + [p.pid for p in _descendants(service.process.pid)]
            try:
                if driver is not None:
                    driver.quit()
            finally:
                SeleniumManager.binary_paths = saved
                _reap(pids)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _reap(pids: List[int], wait: float = 10.0) -> None:
    """Wait for the browser's processes to end; kill (by pid) any that outlive ``wait`` seconds."""
    deadline = time.monotonic() + wait
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _running(pid)]
        time.sleep(0.1)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
