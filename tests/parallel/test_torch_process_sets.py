"""horovod.torch collectives, autograd and helpers on process sets (upstream's process-set tests of
test_torch.py, rebuilt): each test adds the even and the odd ranks as two sets, runs the op on the set this
rank is in, compares with the value computed from every member's input, and removes the sets.

At 3 ranks the sets have unequal sizes ([0, 2] and [1]), so Average and the gradients must use the set's size,
and a rank's position in its set differs from its global rank (rank 2 is position 1 of the even set).
At 1 rank there is only the global set: the tests skip.
"""
import pytest
import torch

import horovod.torch as hvd
from tests.support.process_sets import even_odd_sets  # (turns dynamic process sets on)

torch.set_num_threads(1)

FLOATS = [torch.float32, torch.float64]
ALL_REDUCE_DTYPES = [torch.int32, torch.int64, torch.float32, torch.float64]


@pytest.fixture
def sets():
    """(this rank's set, the other set): the even and the odd ranks; removed afterwards."""
    yield from even_odd_sets()


def data(rank, shape, dtype=torch.float64, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 10).round().to(dtype)


# ---------------------------------------------------------------------------------------------- global set
def test_the_global_set_given_explicitly_is_the_job():
    """At any size (1 included): process_set=hvd.global_process_set is the default's behaviour."""
    rank, size = hvd.rank(), hvd.size()
    ps = hvd.global_process_set
    assert ps.size() == size and ps.rank() == rank and ps.included()
    averaged = hvd.allreduce(data(rank, [3]), name="global.avg", process_set=ps)
    torch.testing.assert_close(averaged, sum(data(r, [3]) for r in range(size)) / size)
    x = data(rank, [rows(rank), 2]).requires_grad_(True)
    hvd.allgather(x, name="global.ag", process_set=ps).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(rows(rank), 2, dtype=torch.float64))
    assert hvd.allgather_object(rank, process_set=ps) == list(range(size))


# ---------------------------------------------------------------------------------------------- allreduce
@pytest.mark.parametrize("dtype", ALL_REDUCE_DTYPES, ids=str)
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_allreduce_sum_on_a_set(sets, dtype, dim):
    ps, _ = sets
    shape = [5] * dim
    summed = hvd.allreduce(data(hvd.rank(), shape, dtype), op=hvd.Sum, name="ps.sum", process_set=ps)
    expected = sum(data(r, shape, dtype) for r in ps.ranks)
    assert torch.equal(summed, expected)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_allreduce_average_divides_by_the_set_size(sets, dtype):
    ps, _ = sets
    averaged = hvd.allreduce(data(hvd.rank(), [4, 3], dtype), name="ps.avg", process_set=ps)
    expected = sum(data(r, [4, 3], dtype) for r in ps.ranks) / ps.size()
    torch.testing.assert_close(averaged, expected)
    inplace = data(hvd.rank(), [4, 3], dtype)
    hvd.allreduce_(inplace, op=hvd.Average, name="ps.avg_", process_set=ps)
    torch.testing.assert_close(inplace, expected)
    handle = hvd.allreduce_async(data(hvd.rank(), [4, 3], dtype), name="ps.avg.async", process_set=ps)
    torch.testing.assert_close(hvd.synchronize(handle), expected)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_allreduce_grad_on_a_set(sets, op_name):
    ps, _ = sets
    x = data(hvd.rank(), [4, 3]).requires_grad_(True)
    hvd.allreduce(x, op=getattr(hvd, op_name), name="ps.ar.grad", process_set=ps).sum().backward()
    expected = ps.size() if op_name == "Sum" else 1.0    # the gradient of ones, reduced over the set
    torch.testing.assert_close(x.grad, torch.full((4, 3), float(expected), dtype=torch.float64))


def test_grouped_allreduce_and_its_grad_on_a_set(sets):
    ps, _ = sets
    xs = [data(hvd.rank(), [3], salt=1).requires_grad_(True), data(hvd.rank(), [2, 2], salt=2).requires_grad_(True)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="ps.gar", process_set=ps)
    for out, salt, shape in zip(outs, (1, 2), ([3], [2, 2])):
        torch.testing.assert_close(out, sum(data(r, shape, salt=salt) for r in ps.ranks))
    (outs[0].sum() + 2 * outs[1].sum()).backward()
    torch.testing.assert_close(xs[0].grad, torch.full((3,), float(ps.size()), dtype=torch.float64))
    torch.testing.assert_close(xs[1].grad, torch.full((2, 2), 2.0 * ps.size(), dtype=torch.float64))
    averaged = hvd.grouped_allreduce([data(hvd.rank(), [3], salt=3)], name="ps.gar.avg", process_set=ps)
    torch.testing.assert_close(averaged[0], sum(data(r, [3], salt=3) for r in ps.ranks) / ps.size())


# ---------------------------------------------------------------------------------------------- allgather
def rows(rank):
    return rank % 3 + 1            # ranks contribute different numbers of rows


def test_allgather_and_its_grad_on_a_set(sets):
    ps, _ = sets
    rank = hvd.rank()
    x = data(rank, [rows(rank), 2]).requires_grad_(True)
    gathered = hvd.allgather(x, name="ps.ag", process_set=ps)
    torch.testing.assert_close(gathered, torch.cat([data(r, [rows(r), 2]) for r in ps.ranks]))
    # Every member backpropagates the same gradient: block i (member i's rows) filled with i. Averaged over the
    # set it is unchanged, so this rank gets the block of its position in the set.
    grad = torch.cat([torch.full((rows(r), 2), float(i), dtype=torch.float64) for i, r in enumerate(ps.ranks)])
    gathered.backward(grad)
    torch.testing.assert_close(x.grad, torch.full((rows(rank), 2), float(ps.rank()), dtype=torch.float64))
    handle = hvd.allgather_async(data(rank, [rows(rank), 2]), name="ps.ag.async", process_set=ps)
    torch.testing.assert_close(hvd.synchronize(handle), torch.cat([data(r, [rows(r), 2]) for r in ps.ranks]))


def test_grouped_allgather_and_its_grad_on_a_set(sets):
    ps, _ = sets
    rank = hvd.rank()
    xs = [data(rank, [rows(rank)], salt=1).requires_grad_(True), data(rank, [rows(rank) + 1, 3], salt=2)
          .requires_grad_(True)]
    outs = hvd.grouped_allgather(xs, name="ps.gag", process_set=ps)
    torch.testing.assert_close(outs[0], torch.cat([data(r, [rows(r)], salt=1) for r in ps.ranks]))
    torch.testing.assert_close(outs[1], torch.cat([data(r, [rows(r) + 1, 3], salt=2) for r in ps.ranks]))
    grads = [torch.cat([torch.full((rows(r),), float(i), dtype=torch.float64) for i, r in enumerate(ps.ranks)]),
             torch.cat([torch.full((rows(r) + 1, 3), 10.0 + i, dtype=torch.float64)
                        for i, r in enumerate(ps.ranks)])]
    torch.autograd.backward(outs, grads)
    torch.testing.assert_close(xs[0].grad, torch.full((rows(rank),), float(ps.rank()), dtype=torch.float64))
    torch.testing.assert_close(xs[1].grad, torch.full((rows(rank) + 1, 3), 10.0 + ps.rank(), dtype=torch.float64))


# ---------------------------------------------------------------------------------------------- broadcast
def test_broadcast_and_its_grad_on_a_set(sets):
    ps, _ = sets
    rank = hvd.rank()
    for root in ps.ranks:                  # roots are global ranks
        x = data(rank, [3, 2]).requires_grad_(True)
        out = hvd.broadcast(x, root_rank=root, name=f"ps.bc.{root}", process_set=ps)
        torch.testing.assert_close(out, data(root, [3, 2]))
        out.backward(torch.ones(3, 2, dtype=torch.float64))
        expected = 1.0 if rank == root else 0.0
        torch.testing.assert_close(x.grad, torch.full((3, 2), expected, dtype=torch.float64))
    inplace = data(rank, [4])
    hvd.broadcast_(inplace, root_rank=ps.ranks[-1], name="ps.bc_", process_set=ps)
    torch.testing.assert_close(inplace, data(ps.ranks[-1], [4]))


# ---------------------------------------------------------------------------------------------- alltoall
def test_alltoall_and_its_grad_on_a_set(sets):
    ps, _ = sets
    n, me = ps.size(), ps.rank()
    # Member i sends (j + 1) rows of value 100 * i + j to member j.
    splits = torch.tensor([j + 1 for j in range(n)], dtype=torch.int32)
    x = torch.cat([torch.full((j + 1, 2), 100.0 * me + j, dtype=torch.float64) for j in range(n)])
    x.requires_grad_(True)
    out, received = hvd.alltoall(x, splits, name="ps.a2a", process_set=ps)
    expected = torch.cat([torch.full((me + 1, 2), 100.0 * i + me, dtype=torch.float64) for i in range(n)])
    torch.testing.assert_close(out, expected)
    assert received.tolist() == [me + 1] * n
    out.backward(out.detach() * 2)           # goes back to each sender: twice what it sent
    torch.testing.assert_close(x.grad, x.detach() * 2)
    equal = hvd.alltoall(torch.arange(n, dtype=torch.float32) + 10 * me, name="ps.a2a.equal", process_set=ps)
    torch.testing.assert_close(equal, torch.tensor([me + 10.0 * i for i in range(n)]))


# ---------------------------------------------------------------------------------------------- reducescatter
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
def test_reducescatter_and_its_grad_on_a_set(sets, op_name):
    ps, _ = sets
    n, me = ps.size(), ps.rank()
    op = getattr(hvd, op_name)
    x = data(hvd.rank(), [2 * n + 1, 2]).requires_grad_(True)     # uneven: position 0 gets one more row
    out = hvd.reducescatter(x, op=op, name=f"ps.rs.{op_name}", process_set=ps)
    total = sum(data(r, [2 * n + 1, 2]) for r in ps.ranks)
    if op == hvd.Average:
        total = total / n
    start = 2 * me + min(me, 1)
    torch.testing.assert_close(out, total[start:start + 2 + (me == 0)])
    out.backward(torch.ones_like(out))
    # Upstream's backward: the gradient times the set's size for Sum, then allgathered over the set.
    expected = float(n) if op == hvd.Sum else 1.0
    torch.testing.assert_close(x.grad, torch.full((2 * n + 1, 2), expected, dtype=torch.float64))


def test_grouped_reducescatter_on_a_set(sets):
    ps, _ = sets
    n, me = ps.size(), ps.rank()
    outs = hvd.grouped_reducescatter([data(hvd.rank(), [n, 3], salt=1), data(hvd.rank(), [2 * n], salt=2)],
                                     op=hvd.Sum, name="ps.grs", process_set=ps)
    torch.testing.assert_close(outs[0], sum(data(r, [n, 3], salt=1) for r in ps.ranks)[me:me + 1])
    torch.testing.assert_close(outs[1], sum(data(r, [2 * n], salt=2) for r in ps.ranks)[2 * me:2 * me + 2])


# ---------------------------------------------------------------------------------------------- helpers
def test_barrier_objects_and_parameters_on_a_set(sets):
    ps, _ = sets
    rank = hvd.rank()
    hvd.barrier(process_set=ps)
    root = ps.ranks[-1]
    assert hvd.broadcast_object({"from": rank}, root_rank=root, name="ps.obj", process_set=ps) == {"from": root}
    assert hvd.allgather_object(("r", rank), name="ps.objs", process_set=ps) == [("r", r) for r in ps.ranks]
    torch.manual_seed(rank)
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=ps)
    torch.manual_seed(root)
    reference = torch.nn.Linear(3, 2)
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(mine, theirs)


def test_broadcast_optimizer_state_on_a_set(sets):
    ps, _ = sets
    root = ps.ranks[0]
    param = torch.nn.Parameter(torch.full((3,), float(hvd.rank())))
    optimizer = torch.optim.Adam([param], lr=0.01 * (hvd.rank() + 1))
    param.grad = torch.full((3,), 1.0 + hvd.rank())
    optimizer.step()
    hvd.broadcast_optimizer_state(optimizer, root_rank=root, process_set=ps)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * (root + 1))
    state = optimizer.state[param]
    torch.testing.assert_close(state["exp_avg"], torch.full((3,), 0.1 * (1.0 + root)))


def test_distributed_optimizer_trains_on_a_set(sets):
    """loss_r = sum(w * x_r): the gradient of member r is x_r; the wrapped SGD steps on their mean over the set."""
    ps, _ = sets
    w = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                         process_set=ps)
    for step in range(2):
        optimizer.zero_grad()
        (w * data(hvd.rank(), [4], salt=step)).sum().backward()
        optimizer.step()
    expected = -sum(data(r, [4], salt=s) for r in ps.ranks for s in range(2)) / ps.size()
    torch.testing.assert_close(w.detach(), expected)


def test_distributed_optimizer_on_a_set_this_rank_is_not_in_steps_locally(sets):
    _, other = sets
    w = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                         process_set=other)
    (w * torch.tensor([1.0, 2.0], dtype=torch.float64)).sum().backward()
    optimizer.step()                         # no hooks here (upstream registers them only on members)
    torch.testing.assert_close(w.detach(), torch.tensor([-1.0, -2.0], dtype=torch.float64))


def test_a_rank_outside_the_set_gets_value_error_at_the_call(sets):
    _, other = sets
    t = torch.ones(2)
    message = rf"Rank {hvd.rank()} is not in process set {other.process_set_id}"
    for call in (lambda: hvd.allreduce(t, process_set=other),
                 lambda: hvd.allreduce_async_(t, process_set=other),
                 lambda: hvd.grouped_allreduce([t], process_set=other),
                 lambda: hvd.allgather(t, process_set=other),
                 lambda: hvd.broadcast(t, root_rank=other.ranks[0], process_set=other),
                 lambda: hvd.alltoall(t, process_set=other),
                 lambda: hvd.reducescatter(t, process_set=other),
                 lambda: hvd.barrier(process_set=other),
                 lambda: hvd.broadcast_object(1, root_rank=other.ranks[0], process_set=other)):
        with pytest.raises(ValueError, match=message):
            call()


def test_join_on_a_set_with_uneven_work(sets):
    ps, _ = sets
    position, n = ps.rank(), ps.size()
    for step in range(position + 1):
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"uneven.{step}", process_set=ps)
        assert out.tolist() == [float(n - step)] * 2
    assert hvd.join(process_set=ps) == ps.ranks[-1]
