"""How the suite shares the machine between pytest-xdist workers: each file one unit of work, the files that make
namespace hosts one unit together, and a lock file that keeps two sets of namespace hosts from existing at once."""
import multiprocessing
import types

from tests import conftest
from tests.support import hosts


def test_a_test_runs_in_the_unit_of_its_file(request):
    mark = request.node.get_closest_marker("xdist_group")
    assert mark is not None and mark.args == ("tests/unit/test_suite_plan.py",)


def _module(**names) -> types.ModuleType:
    module = types.ModuleType("a_test_file")
    vars(module).update(names)
    return module


def test_files_that_make_namespace_hosts_are_found_by_what_they_import():
    assert conftest._makes_hosts(_module(hosts_or_skip=hosts.hosts_or_skip))
    assert conftest._makes_hosts(_module(namespace_hosts=hosts.namespace_hosts))
    assert not conftest._makes_hosts(_module(horovodrun=print, hosts=hosts))


def _try_lock(path, queue):
    import fcntl

    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            queue.put("held elsewhere")
        else:
            queue.put("free")


def _other_process_sees(path) -> str:
    queue = multiprocessing.get_context("spawn").Queue()
    process = multiprocessing.get_context("spawn").Process(target=_try_lock, args=(str(path), queue))
    process.start()
    try:
        return queue.get(timeout=60)
    finally:
        process.join(timeout=60)


def test_the_hosts_lock_excludes_other_processes_and_is_reentrant_in_one(tmp_path, monkeypatch):
    path = tmp_path / "hosts.lock"
    monkeypatch.setattr(hosts, "LOCK_PATH", path)
    with hosts._machine_lock():
        with hosts._machine_lock():      # a nested cluster in the same thread does not wait for itself
            assert _other_process_sees(path) == "held elsewhere"
        assert _other_process_sees(path) == "held elsewhere"
    assert _other_process_sees(path) == "free"
