"""ZeRO-1's framework-free layout (``horovod.common.zero_layout``): owners, buckets and the flat buffer's layout."""
import pytest

from horovod.common.zero_layout import MAX_PADDING, Param, layout, plan

pytestmark = pytest.mark.timeout(60)


def params(*numels, itemsize=4, kind="f32"):
    return [Param(n, itemsize, kind) for n in numels]


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_every_parameter_gets_one_owner_and_one_bucket(size):
    ps = params(35, 5, 15, 3, 1, 0, 700, 64)
    made = plan(ps, size, bucket_bytes=256)
    assert sorted(made.owners) == list(range(len(ps)))
    assert all(0 <= r < size for r in made.owners.values())
    assert sorted(i for b in made.buckets for i in b) == list(range(len(ps)))
    assert made.loads == [sum(ps[i].numel for i, r in made.owners.items() if r == rank) for rank in range(size)]


def test_equal_parameters_balance_exactly():
    made = plan(params(*[100] * 12), 4, bucket_bytes=1 << 30)
    assert made.loads == [300] * 4 and len(made.buckets) == 1


def test_one_bucket_is_balanced_largest_first():
    made = plan(params(40, 30, 20, 10, 5, 5), 2, bucket_bytes=1 << 30)
    assert sorted(made.loads) == [55, 55]


def test_a_parameter_too_large_to_balance_alone_takes_company():
    # 1000 elements alone would pad to 2000 at 2 ranks: the bucket keeps taking parameters past its cap until
    # its split pads by at most MAX_PADDING.
    ps = params(1000, *[100] * 10)
    made = plan(ps, 2, bucket_bytes=4, indices=list(range(len(ps))))
    first = made.buckets[0]
    per_rank = [sum(ps[i].numel for i in first if made.owners[i] == r) for r in range(2)]
    total = sum(per_rank)
    assert 0 in first and (2 * max(per_rank) - total) / total <= MAX_PADDING


def test_kinds_never_share_a_bucket_and_loads_carry_over():
    ps = [Param(10, 4, "f32"), Param(10, 8, "f64"), Param(10, 4, "f32"), Param(10, 8, "f64")]
    made = plan(ps, 2, bucket_bytes=1 << 30)
    assert sorted(sorted(b) for b in made.buckets) == [[0, 2], [1, 3]]
    more = plan(ps + params(7), 2, bucket_bytes=1 << 30, indices=[4], loads=made.loads)
    assert more.owners == {4: 0} and more.loads == [27, 20]       # ties go to the lower rank


def test_layout_pads_every_segment_to_the_longest():
    owners = {0: 0, 1: 1, 2: 1, 3: 2}
    numels = [6, 2, 3, 1]
    lay = layout([0, 1, 2, 3], owners, numels, 3)
    assert lay.per_rank == ((0,), (1, 2), (3,))
    assert lay.used == (6, 5, 1) and lay.segment == 6 and lay.numel == 18
    assert [lay.padded_start(i, owners[i]) for i in range(4)] == [0, 6, 8, 12]
    assert [lay.packed_start(i, owners[i]) for i in range(4)] == [0, 6, 8, 11]


def test_a_rank_may_own_nothing():
    lay = layout([0], {0: 1}, [4], 3)
    assert lay.per_rank == ((), (0,), ()) and lay.segment == 4 and lay.used == (0, 4, 0)
