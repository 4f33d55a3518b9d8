"""Host discovery for elastic jobs: the discovery script's output, stable host order, what changed, and the
blacklist with its cooldown (upstream's formula and limits)."""
import stat

import pytest

from horovod.common.elastic import HostUpdateResult
from horovod.runner.elastic import discovery
from horovod.runner.elastic.discovery import (
    FixedHosts,
    HostDiscoveryScript,
    HostManager,
    HostState,
    parse_discovery_output,
)


def script(tmp_path, body):
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_script_output_with_and_without_slots(tmp_path):
    found = HostDiscoveryScript(script(tmp_path, "echo host-a:4\necho host-b\necho\necho '  host-c:1  '"), 2)
    assert found.find_available_hosts_and_slots() == {"host-a": 4, "host-b": 2, "host-c": 1}
    assert HostDiscoveryScript(script(tmp_path, "true"), 2).find_available_hosts_and_slots() == {}


@pytest.mark.parametrize("output,what", [
    ("host-a:four", "line 1"), ("host a:2", "line 1"), ("ok:1\n:3", "line 2"), ("h:1:2", "line 1"),
])
def test_garbage_from_the_script_says_which_line_and_what_is_expected(output, what):
    with pytest.raises(ValueError, match=rf"{what}; each line must be a host name, or 'host:slots'"):
        parse_discovery_output(output, 1)


def test_a_host_without_slots_needs_slots_per_host():
    with pytest.raises(ValueError, match="without a number of slots; print 'h:<slots>' or pass --slots-per-host"):
        parse_discovery_output("h", None)


def test_a_failing_script_says_so_with_its_exit_code_and_stderr(tmp_path):
    path = script(tmp_path, "echo 'no inventory service' >&2\nexit 3")
    with pytest.raises(RuntimeError, match=r"Failed to execute discovery script: .*Exit code: 3 \(no inventory "
                                           r"service\)\. Check that it is executable"):
        HostDiscoveryScript(path, 1).find_available_hosts_and_slots()


def test_older_hosts_keep_their_place_and_new_ones_come_last():
    assert HostManager.order_available_hosts({"c", "a", "b"}, ["b", "x", "a"]) == ["b", "a", "c"]


def test_update_results_added_removed_and_mixed():
    hosts = FixedHosts({"a": 2, "b": 2})
    manager = HostManager(hosts)
    assert manager.update_available_hosts() == HostUpdateResult.added
    assert manager.update_available_hosts() == HostUpdateResult.no_update
    hosts.set({"a": 2, "b": 2, "c": 1})
    assert manager.update_available_hosts() == HostUpdateResult.added
    hosts.set({"a": 2, "b": 1, "c": 1})
    assert manager.update_available_hosts() == HostUpdateResult.removed
    hosts.set({"a": 2, "c": 3, "d": 1})
    assert manager.update_available_hosts() == HostUpdateResult.mixed
    assert manager.current_hosts.host_assignment_order == ["a", "c", "d"]
    assert manager.current_hosts.count_available_slots() == 6


def test_a_blacklisted_host_stays_out_without_a_cooldown():
    manager = HostManager(FixedHosts({"a": 1, "b": 1}))
    manager.update_available_hosts()
    manager.blacklist("b")
    assert manager.is_blacklisted("b") and manager.current_hosts.host_assignment_order == ["a"]
    assert manager.update_available_hosts() == HostUpdateResult.no_update
    assert manager.current_hosts.count_available_slots() == 1


def test_a_blacklisted_host_comes_back_after_its_cooldown(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(discovery.time, "time", lambda: now[0])
    monkeypatch.setattr(discovery.random, "uniform", lambda a, b: 0.5)
    manager = HostManager(FixedHosts({"a": 1, "b": 1}), cooldown_range=(2, 100))
    manager.update_available_hosts()
    event = manager.get_host_event("b")
    manager.blacklist("b")
    assert event.is_set() and manager.current_hosts.host_assignment_order == ["a"]
    now[0] += 4.9                    # 2 * 2**1 + 0.5 * 2 = 5 s of cooldown
    assert manager.update_available_hosts() == HostUpdateResult.no_update
    now[0] += 0.2
    assert manager.update_available_hosts() == HostUpdateResult.added
    assert not manager.is_blacklisted("b") and manager.current_hosts.host_assignment_order == ["a", "b"]


def test_the_cooldown_grows_and_is_clamped():
    state = HostState((1, 5))
    delays = []
    for _ in range(4):
        state.whitelist()
        before = discovery.time.time()
        state.blacklist()
        delays.append(state._cooldown_period_end_ts - before)
    assert all(1 <= d <= 5.01 for d in delays) and delays[-1] >= 4.9


@pytest.mark.parametrize("bad,match", [((0, 10), "lower limit: 0"), ((1, 4000), "upper limit: 4000"),
                                       ((10, 5), "reversed")])
def test_cooldown_ranges_outside_upstreams_limits_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        HostState(bad)
