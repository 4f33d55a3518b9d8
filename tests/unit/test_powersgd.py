"""PowerSGD's single-process pieces (horovod/torch/powersgd.py): Gram-Schmidt, which gradients are compressed,
the settings against DDP's, and the algorithm itself: several ranks' ``PowerSGDState``s run in lockstep in one
process (their P and Q summed here, as the allreduces would) against the independent reference in
tests/support/powersgd_reference.py."""
import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from horovod.common.compression import check_powersgd_op  # noqa: E402
from horovod.common.types import Adasum, Average  # noqa: E402
from horovod.torch.compression import Compression, PowerSGDCompressor  # noqa: E402
from horovod.torch.powersgd import PowerSGDState, orthogonalize_  # noqa: E402
from tests.support.powersgd_reference import PowerSGDReference  # noqa: E402

SHAPES = {"conv.weight": (6, 3, 3, 3), "conv.bias": (6,), "fc.weight": (10, 24), "fc.bias": (10,),
          "head.weight": (3, 4), "wide.weight": (40, 7)}


def test_gram_schmidt_gives_orthonormal_columns_spanning_what_qr_spans():
    a = torch.randn(50, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    q = orthogonalize_(a.clone())
    torch.testing.assert_close(q.T @ q, torch.eye(4, dtype=torch.float64))
    reference, _ = torch.linalg.qr(a)
    torch.testing.assert_close(q @ q.T, reference @ reference.T)       # the same projection, whatever the signs


def test_gram_schmidt_leaves_a_zero_column_zero_and_adds_epsilon_when_asked():
    a = torch.zeros(5, 2, dtype=torch.float64)
    a[:, 1] = 2.0
    q = orthogonalize_(a.clone())
    assert not torch.isnan(q).any()
    assert torch.equal(q[:, 0], torch.zeros(5, dtype=torch.float64))
    torch.testing.assert_close(q[:, 1].norm(), torch.tensor(1.0, dtype=torch.float64))
    column = torch.full((4, 1), 3.0, dtype=torch.float64)
    torch.testing.assert_close(orthogonalize_(column.clone(), 0.5), column / (6.0 + 0.5))


@pytest.mark.parametrize("rank", [1, 2, 4, 32])
@pytest.mark.parametrize("min_rate", [0.5, 1, 2, 4])
def test_which_gradients_are_compressed_matches_ddp(rank, min_rate):
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    settings = PowerSGDCompressor(matrix_approximation_rank=rank, min_compression_rate=min_rate)
    for shape in [(7,), (1, 1), (3, 4), (10, 24), (6, 3, 3, 3), (512, 128), (2048, 10), (64, 64, 1, 1)]:
        n = shape[0]
        m = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        r = min(n, m, rank)
        expected = r if _should_compress(n, m, r, min_rate)[0] else 0
        assert settings.approximation_rank(shape) == expected, shape
    assert settings.approximation_rank(()) == 0


def test_settings_have_ddps_names_and_defaults():
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState as DDPState

    ddp = {k: v.default for k, v in inspect.signature(DDPState.__init__).parameters.items()
           if v.default is not inspect.Parameter.empty}
    ours = {k: v.default for k, v in inspect.signature(Compression.powersgd).parameters.items()}
    assert set(ours) <= set(ddp)
    assert {k: ddp[k] for k in ours} == ours
    assert Compression.powersgd() is not Compression.powersgd()               # a fresh object per call
    assert Compression.powersgd(matrix_approximation_rank=4).matrix_approximation_rank == 4


def test_bad_settings_and_adasum_say_what_to_do():
    with pytest.raises(ValueError, match="matrix_approximation_rank must be an integer >= 1"):
        Compression.powersgd(matrix_approximation_rank=0)
    with pytest.raises(ValueError, match="start_powerSGD_iter must be an integer >= 0"):
        Compression.powersgd(start_powerSGD_iter=-1)
    with pytest.raises(ValueError, match="orthogonalization_epsilon must be >= 0"):
        Compression.powersgd(orthogonalization_epsilon=-1e-8)
    with pytest.raises(ValueError, match="Use op=hvd.Average"):
        check_powersgd_op(Compression.powersgd(), Adasum)
    check_powersgd_op(Compression.powersgd(), Average)
    check_powersgd_op(Compression.fp16, Adasum)
    with pytest.raises(ValueError, match="works in hvd.DistributedOptimizer only"):
        Compression.powersgd().compress(torch.zeros(3))


def make_states(ranks, **settings):
    compressor = Compression.powersgd(**settings)
    params = {name: torch.zeros(shape, dtype=torch.float64) for name, shape in SHAPES.items()}
    return [PowerSGDState(compressor, list(params.items())) for _ in range(ranks)], compressor


def lockstep(states, per_rank, average=True):
    """One step of every rank's state, the allreduces of P and Q done here; every rank's reduced gradients."""
    ranks = len(states)
    out = [{k: torch.from_numpy(v.copy()) for k, v in grads.items()} for grads in per_rank]
    started = states[0].step >= states[0].settings.start_powerSGD_iter
    plain = [k for k in SHAPES if k not in states[0].shapes or not started]
    for name in plain:
        total = sum(g[name] for g in out) / (ranks if average else 1)
        for g in out:
            g[name].copy_(total)
    compressed = sorted(set(SHAPES) - set(plain))
    if compressed:
        ps = [s.compress([(k, g[k]) for k in compressed]) for s, g in zip(states, out)]
        for column in zip(*ps):
            total = sum(column)
            for p in column:
                p.copy_(total)
        qs = [s.project() for s in states]
        for column in zip(*qs):
            total = sum(column) / (ranks if average else 1)
            for q in column:
                q.copy_(total)
        for s in states:
            s.decompress()
    for s in states:
        s.step += 1
    return out


@pytest.mark.parametrize("ranks,settings,average", [
    (3, dict(matrix_approximation_rank=2, start_powerSGD_iter=1), True),
    (2, dict(matrix_approximation_rank=1, start_powerSGD_iter=0, warm_start=False), True),
    (4, dict(matrix_approximation_rank=3, start_powerSGD_iter=2, use_error_feedback=False), False),
    (1, dict(matrix_approximation_rank=2, start_powerSGD_iter=0, min_compression_rate=1), True),
])
def test_ranks_in_lockstep_match_the_reference(ranks, settings, average):
    states, compressor = make_states(ranks, **settings)
    reference = PowerSGDReference(SHAPES, ranks, rank=compressor.matrix_approximation_rank,
                                  start=compressor.start_powerSGD_iter, min_rate=compressor.min_compression_rate,
                                  error_feedback=compressor.use_error_feedback, warm_start=compressor.warm_start,
                                  average=average)
    assert sorted(states[0].shapes) == reference.compressed() and reference.compressed()
    rng = np.random.default_rng(7)
    for _ in range(5):
        per_rank = [{k: rng.standard_normal(shape) for k, shape in SHAPES.items()} for _ in range(ranks)]
        expected = reference.step(per_rank)
        got = lockstep(states, per_rank, average)
        for name in SHAPES:
            for r in range(ranks):
                np.testing.assert_allclose(got[r][name].numpy(), expected[name], rtol=1e-9, atol=1e-10,
                                           err_msg=f"{name} on rank {r}")


def test_state_dict_round_trip_and_its_checks():
    states, _ = make_states(2, matrix_approximation_rank=2, start_powerSGD_iter=0)
    rng = np.random.default_rng(3)
    lockstep(states, [{k: rng.standard_normal(s) for k, s in SHAPES.items()} for _ in range(2)])
    saved = states[0].state_dict()
    assert saved["step"] == 1 and sorted(saved["q"]) == sorted(saved["error"]) == sorted(states[0].shapes)
    fresh, _ = make_states(1, matrix_approximation_rank=2, start_powerSGD_iter=0)
    fresh[0].load_state_dict(saved)
    assert fresh[0].step == 1
    loaded = fresh[0].state_dict()
    for key in ("q", "error"):
        for name in saved[key]:
            assert torch.equal(loaded[key][name], saved[key][name])
            assert loaded[key][name].data_ptr() != saved[key][name].data_ptr()           # copies
    assert all(tuple(q.shape) == (states[0].shapes[n][1], states[0].shapes[n][2]) for n, q in saved["q"].items())
    fresh[0].load_state_dict(None)
    assert fresh[0].step == 0 and not fresh[0].q and not fresh[0].error
    other, _ = make_states(1, matrix_approximation_rank=1, start_powerSGD_iter=0)
    with pytest.raises(ValueError, match="this optimizer expects"):
        other[0].load_state_dict(saved)
    with pytest.raises(ValueError, match="does not compress"):
        fresh[0].load_state_dict({"step": 0, "q": {"nope": torch.zeros(2, 2)}, "error": {}})


def test_compressed_parameters_leave_the_groups():
    states, _ = make_states(1, matrix_approximation_rank=1)
    params = {p: name for p, name in states[0].names.items()}
    matrix = next(iter(params))
    bias = torch.zeros(3)
    assert states[0].ungrouped([[matrix, bias], [matrix]]) == [[bias]]
    assert states[0].ungrouped(None) is None
