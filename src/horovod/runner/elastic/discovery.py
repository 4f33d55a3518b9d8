"""Which hosts an elastic job may use, and in which order (upstream's ``horovod.runner.elastic.discovery``).

A :class:`HostDiscovery` answers ``{host: slots}``: :class:`HostDiscoveryScript` runs the user's script (one
``host`` or ``host:slots`` per line), :class:`FixedHosts` is ``-H`` with ``--min-np``. :class:`HostManager` keeps the
assignment order stable (older hosts first, so they keep the lower ranks), says what changed
(:class:`HostUpdateResult`), and keeps failing hosts out: a blacklisted host stays out for good, or, with a
cooldown range ``(a, b)``, for ``clamp(a * 2**count + U(0, 1) * a, a, b)`` seconds, after which it is resurrected.
"""
from __future__ import annotations

import logging
import random
import subprocess
import threading
import time
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from horovod.common.elastic import HostUpdateResult

log = logging.getLogger("horovod.elastic")  # a named channel: see horovod.common.logging_setup

DEFAULT_COOLDOWN_LOWER_LIMIT_SECONDS = 1
DEFAULT_COOLDOWN_UPPER_LIMIT_SECONDS = 1 * 60 * 60
DISCOVERY_SCRIPT_TIMEOUT_SECONDS = 60.0


class HostState:
    """One host's blacklist state and cooldown."""

    def __init__(self, cooldown_range: Optional[Tuple[float, float]] = None) -> None:
        self._event = threading.Event()
        self._blacklisted = False
        self._blacklist_count = 0
        if cooldown_range:
            validate_cooldown_range(cooldown_range)
            self._cooldown_lower_limit, self._cooldown_upper_limit = cooldown_range
        else:
            self._cooldown_lower_limit = self._cooldown_upper_limit = -1
        self._cooldown_period_end_ts = 0.0

    def get_event(self) -> threading.Event:
        """An event set when the host is next blacklisted (a fresh one once the last was set)."""
        if self._event.is_set():
            self._event = threading.Event()
        return self._event

    def set_event(self) -> None:
        self._event.set()

    def _in_cooldown_period(self, now: float) -> bool:
        return self._cooldown_period_end_ts > now

    def _set_cooldown_period(self, now: float) -> None:
        if self._cooldown_lower_limit == -1:
            return
        self._blacklist_count += 1
        delay = (self._cooldown_lower_limit * (1 << self._blacklist_count)
                 + random.uniform(0, 1) * self._cooldown_lower_limit)
        self._cooldown_period_end_ts = now + max(self._cooldown_lower_limit, min(self._cooldown_upper_limit, delay))

    def blacklist(self) -> None:
        """Keep the host out of the job (for its cooldown period, when there is a cooldown range)."""
        self._blacklisted = True
        now = time.time()
        if self._in_cooldown_period(now):
            return
        self._set_cooldown_period(now)
        self.set_event()

    def whitelist(self) -> None:
        """End the cooldown and let the host back in."""
        self._cooldown_period_end_ts = 0.0
        self._blacklisted = False

    def is_blacklisted(self) -> bool:
        return self._blacklisted

    def is_resurrected(self) -> bool:
        """True once a cooldown period has run out."""
        return self._cooldown_period_end_ts > 0 and not self._in_cooldown_period(time.time())


def validate_cooldown_range(cooldown_range: Sequence[float]) -> None:
    """ValueError unless ``1 <= lower`` and ``upper <= 3600`` (upstream's limits) and ``lower <= upper``."""
    lower, upper = cooldown_range
    if lower < DEFAULT_COOLDOWN_LOWER_LIMIT_SECONDS:
        raise ValueError(f"Provided cooldown lower limit: {lower} cannot be lower than default cooldown lower "
                         f"limit: {DEFAULT_COOLDOWN_LOWER_LIMIT_SECONDS}")
    if upper > DEFAULT_COOLDOWN_UPPER_LIMIT_SECONDS:
        raise ValueError(f"Provided cooldown upper limit: {upper} cannot be higher than default cooldown upper "
                         f"limit: {DEFAULT_COOLDOWN_UPPER_LIMIT_SECONDS}")
    if lower > upper:
        raise ValueError(f"The cooldown range {lower} {upper} is reversed: give the lower limit first "
                         "(--blacklist-cooldown-range LOWER UPPER).")


class DiscoveredHosts:
    """One answer of the discovery: slots per host, and the order in which hosts get ranks."""

    def __init__(self, host_slots: Dict[str, int], host_assignment_order: List[str]) -> None:
        self._host_slots = host_slots
        self._host_assignment_order = host_assignment_order

    @property
    def host_slots(self) -> Dict[str, int]:
        return self._host_slots

    @property
    def available_hosts(self) -> set:
        return set(self._host_assignment_order)

    @property
    def host_assignment_order(self) -> List[str]:
        return self._host_assignment_order

    def get_slots(self, host: str) -> int:
        return self._host_slots.get(host, 0)

    def count_available_slots(self) -> int:
        """Slots on the hosts that may be used (the assignment order leaves blacklisted hosts out)."""
        return sum(self.get_slots(host) for host in self._host_assignment_order)

    def update(self, hosts_state: Dict[str, HostState]) -> DiscoveredHosts:
        self._host_assignment_order = [h for h in self._host_assignment_order if not hosts_state[h].is_blacklisted()]
        return self

    def __str__(self) -> str:
        return f"slots: {self._host_slots} order: {self._host_assignment_order}"


class HostDiscovery:
    """Answers which hosts are available now, with how many slots each."""

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        raise NotImplementedError()


class HostDiscoveryScript(HostDiscovery):
    """The user's ``--host-discovery-script``: prints one ``host`` or ``host:slots`` per line (``slots`` defaults to
    ``--slots-per-host``); an empty answer means no host is available right now."""

    def __init__(self, discovery_script: str, slots: Optional[int]) -> None:
        super().__init__()
        self._discovery_script = discovery_script
        self._default_slots = slots

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        return parse_discovery_output(self._execute_discovery_script(), self._default_slots, self._discovery_script)

    def _execute_discovery_script(self) -> str:
        try:
            proc = subprocess.run(self._discovery_script, shell=True, capture_output=True, text=True,
                                  timeout=DISCOVERY_SCRIPT_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"Failed to execute discovery script: {self._discovery_script}. It did not finish "
                               f"within {DISCOVERY_SCRIPT_TIMEOUT_SECONDS:.0f} s; it must print the available "
                               "hosts and exit.") from None
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-3:]
            raise RuntimeError(f"Failed to execute discovery script: {self._discovery_script}. Exit code: "
                               f"{proc.returncode}" + (f" ({' / '.join(tail)})" if tail else "") +
                               ". Check that it is executable and runs on its own.")
        return proc.stdout


def parse_discovery_output(text: str, default_slots: Optional[int], script: str = "the discovery script") \
        -> Dict[str, int]:
    """``{host: slots}`` from a discovery script's output; ValueError naming the line for anything else."""
    host_slots: Dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        host, sep, slots = line.partition(":")
        if not host or any(c.isspace() for c in host) or (sep and not slots.strip().isdigit()):
            raise ValueError(f"{script} printed {raw!r} on line {number}; each line must be a host name, or "
                             "'host:slots' with a whole number of slots (e.g. 'worker-1:4').")
        if sep:
            host_slots[host] = int(slots)
        elif default_slots is None:
            raise ValueError(f"{script} printed the host {host!r} without a number of slots; print "
                             f"'{host}:<slots>' or pass --slots-per-host.")
        else:
            host_slots[host] = default_slots
    return host_slots


class FixedHosts(HostDiscovery):
    """``-H`` with ``--min-np``: the given hosts, always (``set`` replaces them, for tests)."""

    def __init__(self, host_slots: Dict[str, int]) -> None:
        super().__init__()
        self._host_slots = host_slots

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        return self._host_slots

    def set(self, host_slots: Dict[str, int]) -> None:
        self._host_slots = host_slots


class HostManager:
    """The driver's view of the hosts: polls the discovery, orders the hosts, blacklists failing ones."""

    def __init__(self, discovery: HostDiscovery, cooldown_range: Optional[Tuple[float, float]] = None) -> None:
        self._current_hosts = DiscoveredHosts(host_slots={}, host_assignment_order=[])
        self._hosts_state: Dict[str, HostState] = defaultdict(lambda: HostState(cooldown_range))
        self._discovery = discovery

    def update_available_hosts(self) -> HostUpdateResult:
        """Ask the discovery again; what changed since the last answer (hosts whose cooldown ran out count as
        added, and are let back in)."""
        prev_slots = self._current_hosts.host_slots
        prev_order = self._current_hosts.host_assignment_order
        host_slots = self._discovery.find_available_hosts_and_slots()
        resurrected = [h for h in host_slots if self._hosts_state[h].is_resurrected()]
        if prev_slots == host_slots and not resurrected:
            return HostUpdateResult.no_update
        available = [h for h in host_slots
                     if not (self._hosts_state[h].is_blacklisted() and not self._hosts_state[h].is_resurrected())]
        self._current_hosts = DiscoveredHosts(host_slots, self.order_available_hosts(available, prev_order))
        result = self._changes(host_slots, prev_slots)
        for host in resurrected:
            self._hosts_state[host].whitelist()
        return result

    def _changes(self, current: Dict[str, int], previous: Dict[str, int]) -> HostUpdateResult:
        result = HostUpdateResult.no_update
        if any(h not in current for h in previous):
            result |= HostUpdateResult.removed
        for host, slots in current.items():
            if host not in previous or slots > previous[host]:
                result |= HostUpdateResult.added
            elif slots < previous[host]:
                result |= HostUpdateResult.removed
            elif self._hosts_state[host].is_resurrected():
                result |= HostUpdateResult.added
        return result

    @property
    def current_hosts(self) -> DiscoveredHosts:
        return self._current_hosts.update(self._hosts_state)

    def blacklist(self, host: str) -> None:
        if not self._hosts_state[host].is_blacklisted():
            log.info("blacklist failing host: %s", host)
        self._hosts_state[host].blacklist()

    def is_blacklisted(self, host: str) -> bool:
        return self._hosts_state[host].is_blacklisted()

    def get_host_event(self, host: str) -> threading.Event:
        return self._hosts_state[host].get_event()

    @staticmethod
    def order_available_hosts(available_hosts: Iterable[str], prev_host_assignment_order: List[str]) -> List[str]:
        """Keep the previous order of the hosts still available (older hosts keep the lower ranks); new hosts go
        last, in the order the discovery listed them (sorted when given as a set, so every run agrees)."""
        listed = sorted(available_hosts) if isinstance(available_hosts, (set, frozenset)) else list(available_hosts)
        available = set(listed)
        order = [h for h in prev_host_assignment_order if h in available]
        known = set(order)
        return order + [h for h in listed if h not in known]
