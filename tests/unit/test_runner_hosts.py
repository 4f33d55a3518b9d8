"""-H and hostfile parsing, and upstream's slot assignment (including its quirks)."""
import pytest

from horovod.runner.common.util import hosts
from horovod.runner.common.util.hosts import HostInfo, SlotInfo, get_host_assignments, parse_hosts


def test_parse_hosts():
    infos = parse_hosts("host-1:2, host.example.com:4,10.0.0.1:1")
    assert infos == [HostInfo("host-1", 2), HostInfo("host.example.com", 4), HostInfo("10.0.0.1", 1)]
    assert hosts.parse_hosts_and_slots("a:2,b:1") == (["a", "b"], {"a": 2, "b": 1})


@pytest.mark.parametrize("bad", ["a", "a:", "a:x", "a b:2", ":2", "a:2:3", ""])
def test_parse_hosts_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_hosts(bad)


def test_parse_hosts_rejects_duplicates():
    with pytest.raises(ValueError, match="more than once"):
        parse_hosts("a:2,a:2")


def test_hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# cluster\nhost1 slots=4\n\nhost2   slots=2  # gpu box\nhost3\nhost4 slots=8 max_slots=16\n")
    assert hosts.parse_host_files(str(path)) == "host1:4,host2:2,host3:1,host4:8"


@pytest.mark.parametrize("text", ["host1 slot=4\n", "host1 slots=four\n", "\n# only comments\n"])
def test_hostfile_errors_name_the_file(tmp_path, text):
    path = tmp_path / "hostfile"
    path.write_text(text)
    with pytest.raises(ValueError, match="hostfile|Host file"):
        hosts.parse_host_files(str(path))


def test_assignment_a2_b1_np3():
    slots = get_host_assignments(parse_hosts("a:2,b:1"), 3)
    assert slots == [
        SlotInfo("a", rank=0, local_rank=0, cross_rank=0, size=3, local_size=2, cross_size=2),
        SlotInfo("a", rank=1, local_rank=1, cross_rank=0, size=3, local_size=2, cross_size=1),
        SlotInfo("b", rank=2, local_rank=0, cross_rank=1, size=3, local_size=1, cross_size=2),
    ]
    assert slots[2].to_response_string() == "2,3,0,1,1,2"


def test_quirk_without_max_np_every_slot_is_used():
    slots = get_host_assignments(parse_hosts("localhost:4"), 2)
    assert [s.rank for s in slots] == [0, 1, 2, 3]
    assert all(s.size == 4 and s.local_size == 4 and s.cross_size == 1 for s in slots)


def test_max_np_caps_the_assignment():
    slots = get_host_assignments(parse_hosts("localhost:4"), 2, 2)
    assert [(s.rank, s.size, s.local_size) for s in slots] == [(0, 2, 2), (1, 2, 2)]
    slots = get_host_assignments(parse_hosts("a:2,b:2,c:2"), 3, 3)
    assert [(s.hostname, s.local_rank, s.cross_rank, s.cross_size) for s in slots] == [
        ("a", 0, 0, 2), ("a", 1, 0, 1), ("b", 0, 1, 2)]


def test_two_simulated_hosts():
    slots = get_host_assignments(parse_hosts("localhost:2,127.0.0.1:2"), 4, 4)
    assert [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in slots] == [
        ("localhost", 0, 0, 2, 0, 2), ("localhost", 1, 1, 2, 0, 2),
        ("127.0.0.1", 2, 0, 2, 1, 2), ("127.0.0.1", 3, 1, 2, 1, 2)]


def test_not_enough_slots():
    with pytest.raises(ValueError, match=r"Requested more processes \(5\) than there are available slots \(3\)"):
        get_host_assignments(parse_hosts("a:2,b:1"), 5)


def test_zero_slot_host_is_skipped():
    slots = get_host_assignments(parse_hosts("a:0,b:2"), 2)
    assert [(s.hostname, s.cross_rank, s.cross_size) for s in slots] == [("b", 0, 1), ("b", 0, 1)]


def test_invalid_slot_info():
    assert hosts.INVALID_SLOT_INFO.rank == -1 and hosts.INVALID_SLOT_INFO.to_response_string() == "-1,-1,-1,-1,-1,-1"
