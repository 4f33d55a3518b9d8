"""The integer handles of ``horovod.numpy`` and ``horovod.torch`` (``horovod.core.handle_map``)."""
import threading

import pytest

from horovod.core.handle_map import HandleMap

pytestmark = pytest.mark.timeout(60)


def test_handles_count_up_and_are_never_reused():
    handles = HandleMap()
    assert [handles.add(x) for x in "abc"] == [0, 1, 2]
    assert handles.pop(1) == "b" and handles.pop(1) is None
    handles.clear()
    assert handles.add("d") == 3 and handles.get(3) == "d"


def test_unknown_handle_is_upstreams_value_error():
    handles = HandleMap()
    hid = handles.add("x")
    assert handles.require(hid) == "x"
    handles.clear()
    assert handles.get(hid) is None
    with pytest.raises(ValueError, match=f"Handle {hid} was not created or has been cleared"):
        handles.require(hid)


def test_concurrent_adds_get_distinct_handles():
    handles = HandleMap()
    got = []

    def add_many():
        got.extend(handles.add(i) for i in range(500))

    threads = [threading.Thread(target=add_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(2000))


@pytest.mark.parametrize("binding", ["horovod.numpy", "horovod.torch"])
def test_bindings_poll_and_synchronize_unknown_handles_as_before(binding):
    hvd = pytest.importorskip(binding)
    with pytest.raises(ValueError, match="Handle 123456 was not created or has been cleared"):
        hvd.poll(123456)
    assert hvd.synchronize(123456) is None
