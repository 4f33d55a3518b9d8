"""Gradients of the differentiable horovod.torch collectives, checked against single-process autograd.

Every rank builds every rank's input x_r and upstream weight w_r deterministically (seeded by rank). Each rank
computes its distributed output y_r and backpropagates loss_r = sum(y_r * w_r). The reference is the same
computation done in one process on all ranks' data:

* allreduce and alltoall: the gradient each rank gets is d(sum_r loss_r)/dx_rank;
* allgather and broadcast: upstream averages the gradient across ranks (contract 1.2), so the gradient each
  rank gets is d(mean_r loss_r)/dx_rank (zero on non-root ranks for broadcast);
* reducescatter: upstream multiplies the incoming gradient by the size for Sum, then by both scale factors, and
  allgathers it; for Sum and Average alike that is size * d(sum_r loss_r)/dx_rank.

The grouped forms follow the same rule per tensor.
"""
import pytest
import torch

import horovod.torch as hvd

torch.set_num_threads(1)

DTYPES = [torch.float32, torch.float64]


def ident(dtype):
    return str(dtype).replace("torch.", "")


def rand(seed, shape, dtype):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def leaves(tensors):
    return [t.clone().requires_grad_(True) for t in tensors]


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)


def check_grad(dist_x, ref_xs, rank, dtype):
    assert dist_x.grad is not None, "no gradient reached the input"
    assert dist_x.grad.dtype == dtype and dist_x.grad.shape == dist_x.shape
    torch.testing.assert_close(dist_x.grad, ref_xs[rank].grad, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=ident)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("factors", [(1.0, 1.0), (0.5, 3.0)], ids=["plain", "scaled"])
def test_allreduce_grad(dtype, op_name, factors):
    rank, size = hvd.rank(), hvd.size()
    op = getattr(hvd, op_name)
    pre, post = factors
    shape = (4, 3)
    xs = [rand(100 + r, shape, dtype) for r in range(size)]
    ws = [rand(200 + r, shape, dtype) for r in range(size)]

    x = xs[rank].clone().requires_grad_(True)
    y = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post,
                      name=f"grad.ar.{op_name}.{ident(dtype)}.{pre}")
    (y * ws[rank]).sum().backward()

    ref_xs = leaves(xs)
    ref_y = sum(ref_xs) * pre * post / (size if op == hvd.Average else 1)
    torch.testing.assert_close(y.detach(), ref_y.detach(), **tol(dtype))
    sum((ref_y * w).sum() for w in ws).backward()
    check_grad(x, ref_xs, rank, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=ident)
def test_grouped_allreduce_grad(dtype):
    rank, size = hvd.rank(), hvd.size()
    xs = [rand(300 + r, (5,), dtype) for r in range(size)]
    ws = [rand(400 + r, (5,), dtype) for r in range(size)]
    x = xs[rank].clone().requires_grad_(True)
    ys = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum, name=f"grad.gar.{ident(dtype)}")
    (ys[0] * ws[rank] + ys[1]).sum().backward()
    ref_xs = leaves(xs)
    total = sum(ref_xs)
    sum((total * w + total * 2).sum() for w in ws).backward()
    check_grad(x, ref_xs, rank, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=ident)
def test_allgather_grad_uneven_rows(dtype):
    rank, size = hvd.rank(), hvd.size()
    xs = [rand(500 + r, (r + 1, 3), dtype) for r in range(size)]
    rows = size * (size + 1) // 2
    ws = [rand(600 + r, (rows, 3), dtype) for r in range(size)]

    x = xs[rank].clone().requires_grad_(True)
    y = hvd.allgather(x, name=f"grad.ag.{ident(dtype)}")
    (y * ws[rank]).sum().backward()

    ref_xs = leaves(xs)
    ref_y = torch.cat(ref_xs)
    torch.testing.assert_close(y.detach(), ref_y.detach())
    (sum((ref_y * w).sum() for w in ws) / size).backward()      # upstream: the gradient is averaged
    check_grad(x, ref_xs, rank, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=ident)
def test_broadcast_grad(dtype):
    rank, size = hvd.rank(), hvd.size()
    for root in sorted({0, size - 1}):
        xs = [rand(700 + r, (3, 2), dtype) for r in range(size)]
        ws = [rand(800 + r, (3, 2), dtype) for r in range(size)]

        x = xs[rank].clone().requires_grad_(True)
        y = hvd.broadcast(x, root, name=f"grad.bc.{ident(dtype)}.{root}")
        (y * ws[rank]).sum().backward()

        ref_xs = leaves(xs)
        ref_y = ref_xs[root]
        torch.testing.assert_close(y.detach(), ref_y.detach())
        (sum((ref_y * w).sum() for w in ws) / size).backward()   # averaged, and kept only on the root
        if rank != root:
            assert ref_xs[rank].grad is None
            torch.testing.assert_close(x.grad, torch.zeros_like(x))
        else:
            check_grad(x, ref_xs, rank, dtype)


def a2a_splits(src, size):
    return [(src + 2 * d) % 3 + (1 if d == src else 0) for d in range(size)]


@pytest.mark.parametrize("dtype", DTYPES, ids=ident)
@pytest.mark.parametrize("with_splits", [True, False], ids=["splits", "equal"])
def test_alltoall_grad(dtype, with_splits):
    rank, size = hvd.rank(), hvd.size()
    if with_splits:
        splits = [a2a_splits(s, size) for s in range(size)]
    else:
        splits = [[2] * size for _ in range(size)]
    xs = [rand(900 + r, (sum(splits[r]), 3), dtype) for r in range(size)]
    received = [[splits[s][r] for s in range(size)] for r in range(size)]
    ws = [rand(1000 + r, (sum(received[r]), 3), dtype) for r in range(size)]

    x = xs[rank].clone().requires_grad_(True)
    name = f"grad.a2a.{ident(dtype)}.{with_splits}"
    if with_splits:
        y, got = hvd.alltoall(x, splits=splits[rank], name=name)
        assert got.tolist() == received[rank]
    else:
        y = hvd.alltoall(x, name=name)
    (y * ws[rank]).sum().backward()

    ref_xs = leaves(xs)
    chunks = [torch.split(ref_xs[s], splits[s]) for s in range(size)]
    ref_ys = [torch.cat([chunks[s][r] for s in range(size)]) for r in range(size)]
    torch.testing.assert_close(y.detach(), ref_ys[rank].detach())
    sum((ref_ys[r] * ws[r]).sum() for r in range(size)).backward()
    check_grad(x, ref_xs, rank, dtype)


def rs_rows(n, size, r):
    return n // size + (1 if r < n % size else 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=ident)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("factors", [(1.0, 1.0), (2.0, 0.25)], ids=["plain", "scaled"])
def test_reducescatter_grad_uneven_rows(dtype, op_name, factors):
    rank, size = hvd.rank(), hvd.size()
    op = getattr(hvd, op_name)
    pre, post = factors
    n = 2 * size + 1                                   # rank 0 gets one extra row (size > 1)
    counts = [rs_rows(n, size, r) for r in range(size)]
    xs = [rand(1100 + r, (n, 2), dtype) for r in range(size)]
    ws = [rand(1200 + r, (counts[r], 2), dtype) for r in range(size)]

    x = xs[rank].clone().requires_grad_(True)
    y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post,
                          name=f"grad.rs.{op_name}.{ident(dtype)}.{pre}")
    assert y.shape[0] == counts[rank]
    (y * ws[rank]).sum().backward()

    ref_xs = leaves(xs)
    total = sum(ref_xs) * pre * post / (size if op == hvd.Average else 1)
    ref_ys = torch.split(total, counts)
    torch.testing.assert_close(y.detach(), ref_ys[rank].detach(), **tol(dtype))
    (size * sum((ref_ys[r] * ws[r]).sum() for r in range(size))).backward()     # upstream's factor: size
    check_grad(x, ref_xs, rank, dtype)


def test_reducescatter_grad_is_upstreams_exactly():
    """Upstream's test: ones in, ones back; Sum gives size everywhere, Average gives 1."""
    size = hvd.size()
    for op_name, expected in [("Sum", float(size)), ("Average", 1.0)]:
        x = torch.ones(4 * size, 3, dtype=torch.float64, requires_grad=True)
        y = hvd.reducescatter(x, op=getattr(hvd, op_name), name=f"grad.rs.ones.{op_name}")
        y.backward(torch.ones_like(y))
        torch.testing.assert_close(x.grad, torch.full_like(x, expected), rtol=0, atol=0)
    # The factors multiply in after the size: 0.5 * 3 = 1.5 per element for Average.
    x = torch.ones(2 * size, dtype=torch.float64, requires_grad=True)
    hvd.reducescatter(x, op=hvd.Average, prescale_factor=0.5, postscale_factor=3.0, name="grad.rs.ones.scaled") \
        .sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 1.5), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=ident)
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("factors", [(1.0, 1.0), (2.0, 0.25)], ids=["plain", "scaled"])
def test_grouped_reducescatter_grad(dtype, op_name, factors):
    rank, size = hvd.rank(), hvd.size()
    op = getattr(hvd, op_name)
    pre, post = factors
    n_a, n_b = 2 * size + 1, size
    xs = [(rand(1500 + r, (n_a, 2), dtype), rand(1600 + r, (n_b,), dtype)) for r in range(size)]
    counts_a = [rs_rows(n_a, size, r) for r in range(size)]
    counts_b = [rs_rows(n_b, size, r) for r in range(size)]
    ws = [(rand(1700 + r, (counts_a[r], 2), dtype), rand(1800 + r, (counts_b[r],), dtype)) for r in range(size)]

    a, b = (t.clone().requires_grad_(True) for t in xs[rank])
    ya, yb = hvd.grouped_reducescatter([a, b], op=op, prescale_factor=pre, postscale_factor=post,
                                       name=f"grad.grs.{op_name}.{ident(dtype)}.{pre}")
    ((ya * ws[rank][0]).sum() + (yb * ws[rank][1]).sum()).backward()

    ref_a, ref_b = leaves([x[0] for x in xs]), leaves([x[1] for x in xs])
    scale = pre * post / (size if op == hvd.Average else 1)
    ys_a, ys_b = torch.split(sum(ref_a) * scale, counts_a), torch.split(sum(ref_b) * scale, counts_b)
    torch.testing.assert_close(ya.detach(), ys_a[rank].detach(), **tol(dtype))
    torch.testing.assert_close(yb.detach(), ys_b[rank].detach(), **tol(dtype))
    (size * sum((ys_a[r] * ws[r][0]).sum() + (ys_b[r] * ws[r][1]).sum() for r in range(size))).backward()
    check_grad(a, ref_a, rank, dtype)
    check_grad(b, ref_b, rank, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=ident)
def test_grouped_allgather_grad_uneven_rows(dtype):
    rank, size = hvd.rank(), hvd.size()
    xs = [(rand(1900 + r, (r + 1, 3), dtype), rand(2000 + r, (size - r,), dtype)) for r in range(size)]
    rows_a, rows_b = size * (size + 1) // 2, size * (size + 1) // 2
    ws = [(rand(2100 + r, (rows_a, 3), dtype), rand(2200 + r, (rows_b,), dtype)) for r in range(size)]

    a, b = (t.clone().requires_grad_(True) for t in xs[rank])
    ya, yb = hvd.grouped_allgather([a, b], name=f"grad.gag.{ident(dtype)}")
    ((ya * ws[rank][0]).sum() + (yb * ws[rank][1]).sum()).backward()

    ref_a, ref_b = leaves([x[0] for x in xs]), leaves([x[1] for x in xs])
    ga, gb = torch.cat(ref_a), torch.cat(ref_b)
    torch.testing.assert_close(ya.detach(), ga.detach())
    torch.testing.assert_close(yb.detach(), gb.detach())
    (sum((ga * w[0]).sum() + (gb * w[1]).sum() for w in ws) / size).backward()      # averaged, as allgather
    check_grad(a, ref_a, rank, dtype)
    check_grad(b, ref_b, rank, dtype)


def test_grouped_allgather_grad_reaches_only_inputs_that_need_it():
    rank, size = hvd.rank(), hvd.size()
    a = torch.full((2, 2), float(rank), requires_grad=True)
    b = torch.full((1,), float(rank))                                  # no gradient wanted
    ya, yb = hvd.grouped_allgather([a, b], name="grad.gag.mixed")
    assert ya.requires_grad
    assert yb.tolist() == [float(r) for r in range(size)]
    (ya * 2).sum().backward()
    torch.testing.assert_close(a.grad, torch.full((2, 2), 2.0))
    assert b.grad is None


def test_gradient_flows_through_a_chain_of_collectives():
    """allgather -> allreduce(Sum) -> reducescatter(Sum) in one graph, gradient vs single-process."""
    rank, size = hvd.rank(), hvd.size()
    xs = [rand(1300 + r, (2, 2), torch.float64) for r in range(size)]
    ws = [rand(1400 + r, (2, 2), torch.float64) for r in range(size)]
    x = xs[rank].clone().requires_grad_(True)
    g = hvd.allgather(x, name="chain.ag")
    s = hvd.allreduce(g * (rank + 1), op=hvd.Sum, name="chain.ar")
    y = hvd.reducescatter(s, op=hvd.Sum, name="chain.rs")
    (y * ws[rank]).sum().backward()

    ref_xs = leaves(xs)
    gathered = torch.cat(ref_xs)
    summed = sum(gathered * (r + 1) for r in range(size))
    total = summed * size                               # every rank contributes the same s
    ys = torch.split(total, [2] * size)
    torch.testing.assert_close(y.detach(), ys[rank].detach())
    # Backward by hand: reducescatter(Sum) -> allgather of size * w (upstream's factor): size * W, the same
    # everywhere; allreduce(Sum) sums that over ranks -> size^2 * W into g * (q + 1) on rank q; allgather's
    # backward averages over q (upstream's rule) and narrows to this rank's rows.
    w_all = torch.cat(ws)
    mean_factor = sum(q + 1 for q in range(size)) / size
    expected = (size * size * w_all * mean_factor)[2 * rank:2 * rank + 2]
    torch.testing.assert_close(x.grad, expected)


# Each differentiable call on x = full((2 * size, 3), rank + 1), the autograd Function it applies when autograd
# records, and its result then.
def _sum_of_ranks(size):
    return size * (size + 1) / 2


NO_GRAPH = {
    "allreduce": ("HorovodAllreduce", lambda x: hvd.allreduce(x, op=hvd.Sum, name="nograph.ar"),
                  lambda size: torch.full((2 * size, 3), _sum_of_ranks(size))),
    "grouped_allreduce": ("HorovodGroupedAllreduce",
                          lambda x: hvd.grouped_allreduce([x], op=hvd.Sum, name="nograph.gar")[0],
                          lambda size: torch.full((2 * size, 3), _sum_of_ranks(size))),
    "allgather": ("HorovodAllgather", lambda x: hvd.allgather(x, name="nograph.ag"),
                  lambda size: torch.cat([torch.full((2 * size, 3), r + 1.0) for r in range(size)])),
    "grouped_allgather": ("HorovodGroupedAllgather", lambda x: hvd.grouped_allgather([x], name="nograph.gag")[0],
                          lambda size: torch.cat([torch.full((2 * size, 3), r + 1.0) for r in range(size)])),
    "broadcast": ("HorovodBroadcast", lambda x: hvd.broadcast(x, 0, name="nograph.bc"),
                  lambda size: torch.full((2 * size, 3), 1.0)),
    "alltoall": ("HorovodAlltoall", lambda x: hvd.alltoall(x, name="nograph.a2a"),
                 lambda size: torch.cat([torch.full((2, 3), r + 1.0) for r in range(size)])),
    "reducescatter": ("HorovodReducescatter", lambda x: hvd.reducescatter(x, op=hvd.Sum, name="nograph.rs"),
                      lambda size: torch.full((2, 3), _sum_of_ranks(size))),
    "grouped_reducescatter": ("HorovodGroupedReducescatter",
                              lambda x: hvd.grouped_reducescatter([x], op=hvd.Sum, name="nograph.grs")[0],
                              lambda size: torch.full((2, 3), _sum_of_ranks(size))),
}


@pytest.mark.parametrize("mode", ["input_without_grad", "no_grad"])
@pytest.mark.parametrize("call", sorted(NO_GRAPH))
def test_calls_autograd_does_not_record_skip_the_function(call, mode, monkeypatch):
    """Where autograd records nothing (no input requires grad, or grad mode is off) a differentiable call gives
    its result without Function.apply, and the result has no graph; the gradient tests above show that it
    still applies the Function when autograd records."""
    from horovod.torch import autograd_ops

    function, run, expected = NO_GRAPH[call]

    def refuse(*args, **kwargs):
        raise AssertionError(f"{function}.apply ran although autograd records nothing")

    monkeypatch.setattr(getattr(autograd_ops, function), "apply", refuse)
    rank, size = hvd.rank(), hvd.size()
    x = torch.full((2 * size, 3), rank + 1.0, requires_grad=mode == "no_grad")
    if mode == "no_grad":
        with torch.no_grad():
            y = run(x)
    else:
        y = run(x)
    assert y.grad_fn is None and not y.requires_grad
    torch.testing.assert_close(y, expected(size))


def test_a_call_autograd_records_applies_the_function():
    x = torch.ones(3, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, name="graph.ar")
    assert type(y.grad_fn).__name__ == "HorovodAllreduceBackward"
