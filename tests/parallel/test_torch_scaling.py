"""prescale_factor / postscale_factor give upstream's exact numbers, bit for bit, at any number of ranks.

Upstream scales integers as ``(T)(double factor * value)`` (truncation toward zero), float16 in float32 with
``(float)factor`` and one rounding back, float32 with ``(float)factor`` and float64 with the double; Average is
a Sum whose postscale factor is divided by the size first (in double). bfloat16 is ours: like float16.

So that the sum itself is exact in every dtype and at every size, each element has one owner rank (element i
belongs to rank i % size) and the other ranks contribute zeros; the result then depends only on how the factor
is applied, which is what these tests pin down. The expected values are computed with torch, independently of
the data plane's numpy kernel. Every check is agreed across ranks before it is asserted, so a wrong number
fails the test on every rank at the same point instead of leaving the ranks on different collectives.
"""
import numpy as np
import pytest
import torch

import horovod.torch as hvd

torch.set_num_threads(1)

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]
FACTORS = [0.7392813412, 1 / 3, 2.5]


def dt_id(dtype):
    return str(dtype).replace("torch.", "")


def owned(rank, size, shape, dtype, seed):
    """This rank's contribution: the full random tensor where this rank owns the element, zero elsewhere."""
    g = torch.Generator().manual_seed(seed)
    full = torch.randint(-100, 101, shape, generator=g, dtype=torch.int64)
    if dtype == torch.uint8:
        full = full.abs()
    elif dtype.is_floating_point:
        full = full.double() + torch.rand(shape, generator=g, dtype=torch.float64)
    full = full.to(dtype)
    mine = (torch.arange(full.numel()) % size == rank).reshape(shape)
    return torch.where(mine, full, torch.zeros_like(full)), full


def upstream_scale(t, factor):
    """What upstream's ScaleBufferCPUImpl makes of ``t * factor``."""
    if factor == 1.0:
        return t.clone()
    if not t.dtype.is_floating_point:
        return (t.double() * factor).trunc().to(t.dtype)
    if t.dtype in (torch.float16, torch.bfloat16):
        return (t.float() * torch.tensor(factor, dtype=torch.float32)).to(t.dtype)
    if t.dtype == torch.float32:
        return t * torch.tensor(factor, dtype=torch.float32)
    return t * factor


def expected(full, op, pre, post, size):
    scaled = upstream_scale(full, pre)              # one owner per element: the sum is that owner's value
    return upstream_scale(scaled, post / size if op == hvd.Average else post)


def agree(ok, what):
    """Assert ``ok`` on every rank together (each rank learns every rank's verdict first)."""
    verdicts = hvd.allgather_object((hvd.rank(), bool(ok)), name=f"verdict.{what}")
    bad = [r for r, good in verdicts if not good]
    assert not bad, f"{what}: rank(s) {bad} got numbers that differ from upstream's"


def same_bits(out, exp):
    return out.dtype == exp.dtype and out.shape == exp.shape and torch.equal(out, exp)


def rs_block(t, rank, size):
    n = t.shape[0]
    rows = [n // size + (1 if r < n % size else 0) for r in range(size)]
    start = sum(rows[:rank])
    return t[start:start + rows[rank]]


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_allreduce_scale_factors(dtype, op_name):
    rank, size, op = hvd.rank(), hvd.size(), getattr(hvd, op_name)
    for k, factor in enumerate(FACTORS):
        for pre, post in [(factor, 1.0), (1.0, factor), (factor, 1 / factor)]:
            mine, full = owned(rank, size, (17, 5), dtype, seed=k)
            name = f"scale.ar.{dt_id(dtype)}.{op_name}.{k}.{pre != 1}.{post != 1}"
            out = hvd.allreduce(mine, op=op, prescale_factor=pre, postscale_factor=post, name=name)
            agree(same_bits(out, expected(full, op, pre, post, size)), name)


@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_average_of_integers_truncates_toward_zero(dtype):
    rank, size = hvd.rank(), hvd.size()
    values = torch.tensor([0, 1, 2, 3, 5, 7, 100, 127] + ([] if dtype == torch.uint8 else [-1, -3, -7, -100]))
    values = values.to(dtype)
    mine = torch.where(torch.arange(values.numel()) % size == rank, values, torch.zeros_like(values))
    out = hvd.allreduce(mine, op=hvd.Average, name=f"scale.avg.{dt_id(dtype)}")
    agree(same_bits(out, upstream_scale(values, 1.0 / size)), f"average of {dt_id(dtype)}")


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.bfloat16, torch.float32], ids=dt_id)
def test_grouped_allreduce_scale_factors_across_fused_tensors(dtype):
    """Several tensors of one dtype are fused into one buffer; each keeps upstream's numbers."""
    rank, size = hvd.rank(), hvd.size()
    pairs = [owned(rank, size, shape, dtype, seed=10 + i) for i, shape in enumerate([(7,), (3, 4), (1,), (9, 2)])]
    for op in (hvd.Sum, hvd.Average):
        pre, post = 0.7392813412, 2.5
        name = f"scale.gar.{dt_id(dtype)}.{op}"
        outs = hvd.grouped_allreduce([m for m, _ in pairs], op=op, prescale_factor=pre, postscale_factor=post,
                                     name=name)
        agree(all(same_bits(o, expected(f, op, pre, post, size)) for o, (_, f) in zip(outs, pairs)), name)
        inplace = [m.clone() for m, _ in pairs]
        hvd.grouped_allreduce_(inplace, op=op, postscale_factor=post, name=name + ".inplace")
        agree(all(same_bits(o, expected(f, op, 1.0, post, size)) for o, (_, f) in zip(inplace, pairs)),
              name + ".inplace")


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_reducescatter_scale_factors(dtype, op_name):
    rank, size, op = hvd.rank(), hvd.size(), getattr(hvd, op_name)
    for k, (pre, post) in enumerate([(FACTORS[0], 1.0), (1.0, FACTORS[0]), (FACTORS[1], FACTORS[2])]):
        for n in (4 * size, 2 * size + 1):
            mine, full = owned(rank, size, (n, 3), dtype, seed=20 + k)
            name = f"scale.rs.{dt_id(dtype)}.{op_name}.{k}.{n}"
            out = hvd.reducescatter(mine, op=op, prescale_factor=pre, postscale_factor=post, name=name)
            exp = rs_block(expected(full, op, pre, post, size), rank, size)
            agree(same_bits(out, exp), name)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float16, torch.float32, torch.float64],
                         ids=dt_id)
def test_reducescatter_of_identical_tensors_like_upstreams_test(dtype):
    """Upstream's check: every rank sends the same tensor, Sum, one factor; the sum is size * scaled value."""
    rank, size = hvd.rank(), hvd.size()
    factor = float(np.random.default_rng(1234).uniform())
    g = torch.Generator().manual_seed(1234)
    tensor = torch.randint(-100, 100, (size * 4, 3), generator=g).to(dtype)
    for which in ("pre", "post"):
        kwargs = {"prescale_factor" if which == "pre" else "postscale_factor": factor}
        out = hvd.reducescatter(tensor, op=hvd.Sum, name=f"scale.rs.same.{dt_id(dtype)}.{which}", **kwargs)
        if which == "pre":
            exp = upstream_scale(tensor, factor).double() * size
        else:
            exp = upstream_scale(tensor * size, factor).double()
        exp = exp[rank * 4:(rank + 1) * 4]
        # Half sums of more than two equal values may round, as upstream's do; the scaling itself is exact.
        exact = size <= 2 or not dtype.is_floating_point or dtype == torch.float64
        ok = torch.equal(out.double(), exp) if exact else torch.allclose(out.double(), exp, rtol=2e-3, atol=0)
        agree(ok, f"identical {dt_id(dtype)} {which}")


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.bfloat16, torch.float64], ids=dt_id)
def test_grouped_reducescatter_scale_factors(dtype):
    rank, size = hvd.rank(), hvd.size()
    pairs = [owned(rank, size, shape, dtype, seed=30 + i) for i, shape in enumerate([(2 * size + 1, 2), (size,)])]
    for op in (hvd.Sum, hvd.Average):
        pre, post = FACTORS[1], FACTORS[0]
        name = f"scale.grs.{dt_id(dtype)}.{op}"
        outs = hvd.grouped_reducescatter([m for m, _ in pairs], op=op, prescale_factor=pre, postscale_factor=post,
                                         name=name)
        agree(all(same_bits(o, rs_block(expected(f, op, pre, post, size), rank, size))
                  for o, (_, f) in zip(outs, pairs)), name)


def test_bool_tensors_cannot_be_scaled_and_every_rank_says_so():
    """torch refuses bool reductions before the op layer; the numpy binding reaches the op layer's own check."""
    import horovod.numpy as hvd_np

    flags = np.array([True, False, True])
    for call in [lambda: hvd_np.allreduce(flags, op=hvd.Sum, prescale_factor=2.0),
                 lambda: hvd_np.allreduce(flags, op=hvd.Max, postscale_factor=0.5),
                 lambda: hvd_np.grouped_allreduce([flags], op=hvd.Sum, postscale_factor=0.5),
                 lambda: hvd_np.reducescatter(np.ones(2 * hvd.size(), np.bool_), op=hvd.Sum, prescale_factor=3.0)]:
        with pytest.raises(ValueError, match="bool"):
            call()
    # Nothing was enqueued: the job goes on, and an unscaled bool reduction still works.
    out = hvd_np.allreduce(flags, op=hvd.Max, name="scale.bool.after")
    assert out.tolist() == [True, False, True]
