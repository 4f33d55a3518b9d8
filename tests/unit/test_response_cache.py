"""The response cache: an LRU of responses with stable integer ids."""
import pytest

from horovod.common.types import DataType, ReduceOp, RequestType
from horovod.core.controller.messages import TensorResponse
from horovod.core.controller.response_cache import CACHEABLE, ResponseCache


def resp(name, shape=(4,), rtype=RequestType.ALLREDUCE):
    return TensorResponse(name, int(rtype), int(DataType.FLOAT32), list(shape), int(ReduceOp.SUM), 1.0, 1.0, -1,
                          None)


def test_put_lookup_get():
    cache = ResponseCache(4)
    assert cache.enabled and len(cache) == 0 and cache.lookup("a") is None
    cache.put(resp("a"))
    cache.put(resp("b"))
    assert len(cache) == 2
    ia, ib = cache.lookup("a"), cache.lookup("b")
    assert ia != ib and {ia, ib} == {0, 1}
    assert cache.get(ia).name == "a" and cache.get(ib).name == "b"
    assert cache.snapshot() == {"a": ia, "b": ib}


def test_lru_eviction_order():
    cache = ResponseCache(3)
    for name in "abc":
        cache.put(resp(name))
    cache.put(resp("d"))                                     # evicts the oldest: a
    assert cache.lookup("a") is None and list(cache.snapshot()) == ["b", "c", "d"]
    cache.touch(cache.lookup("b"))                           # b becomes the most recent
    cache.put(resp("e"))                                     # evicts c
    assert list(cache.snapshot()) == ["d", "b", "e"]
    cache.put(resp("d", shape=(9,)))                         # re-put refreshes d
    cache.put(resp("f"))                                     # evicts b
    assert list(cache.snapshot()) == ["e", "d", "f"]
    assert cache.get(cache.lookup("d")).shape == [9]


def test_ids_are_stable_and_reused_after_eviction():
    cache = ResponseCache(2)
    cache.put(resp("a"))
    cache.put(resp("b"))
    ia, ib = cache.lookup("a"), cache.lookup("b")
    cache.put(resp("a", shape=(8,)))                         # an update keeps the id
    assert cache.lookup("a") == ia and cache.get(ia).shape == [8]
    cache.put(resp("c"))                                     # evicts b (a was refreshed)
    assert cache.lookup("b") is None
    assert cache.lookup("c") == ib                           # b's id is reused


def test_eviction_with_capacity_one_reuses_the_only_id():
    cache = ResponseCache(1)
    cache.put(resp("a"))
    ia = cache.lookup("a")
    cache.put(resp("b"))
    assert cache.lookup("a") is None and cache.lookup("b") == ia and cache.get(ia).name == "b"


def test_get_of_an_id_never_handed_out_raises():
    cache = ResponseCache(4)
    cache.put(resp("a"))
    with pytest.raises(LookupError):
        cache.get(3)


def test_capacity_zero_disables_the_cache():
    cache = ResponseCache(0)
    assert not cache.enabled
    cache.put(resp("a"))
    assert len(cache) == 0 and cache.lookup("a") is None
    assert not ResponseCache(-5).enabled


def test_only_cacheable_types_are_stored():
    assert CACHEABLE == {RequestType.ALLREDUCE, RequestType.ALLGATHER, RequestType.ALLTOALL, RequestType.ADASUM}
    cache = ResponseCache(10)
    for rtype in RequestType:
        cache.put(resp(f"t{int(rtype)}", rtype=rtype))
    assert sorted(cache.snapshot()) == sorted(f"t{int(t)}" for t in CACHEABLE)


def test_touch_of_an_unused_id_is_harmless():
    cache = ResponseCache(2)
    cache.put(resp("a"))
    cache.put(resp("b"))
    cache.put(resp("c"))
    cache.touch(cache.lookup("b"))
    assert list(cache.snapshot()) == ["c", "b"]


def test_two_caches_fed_the_same_sequence_agree():
    # Every rank applies the same response lists in the same order, so ids agree everywhere.
    a, b = ResponseCache(5), ResponseCache(5)
    for step in range(50):
        name = f"t{(step * 7) % 11}"
        for cache in (a, b):
            if cache.lookup(name) is not None and step % 3:
                cache.touch(cache.lookup(name))
            else:
                cache.put(resp(name, shape=(step % 4 + 1,)))
    assert a.snapshot() == b.snapshot()
