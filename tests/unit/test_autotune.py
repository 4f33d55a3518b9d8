"""The autotuner: Bayesian optimiser, sampling and scoring, the tuning chain, fixed parameters, the CSV log."""
import logging
import math

import numpy as np
import pytest

pytest.importorskip("sklearn")

from horovod.core.observers.autotune import (
    CSV_HEADER,
    MIB,
    Autotuner,
    Stage,
    fixed_from_env,
    make_autotuner,
)
from horovod.core.observers.bayesian_optimization import BayesianOptimizer

BOX = [(0.0, 64.0), (1.0, 100.0)]
SEEDS = [(4, 5), (32, 50), (16, 25), (8, 10)]


# ------------------------------------------------------------------------------------- the optimiser


def _grid_max(f):
    xs, ys = np.meshgrid(np.linspace(0, 64, 257), np.linspace(1, 100, 397))
    return float(f(xs, ys).max())


@pytest.mark.parametrize("f", [
    # Throughput-like: rises with x (fusion), falls with y (cycle time); the best is on the y=1 edge.
    lambda x, y: 100 / (5 + 64 / (x + 1) + 0.3 * y + 0.05 * x),
    # A bump inside the box, away from every seed point.
    lambda x, y: 1 + np.exp(-((x - 45) / 15) ** 2 - ((y - 12) / 20) ** 2),
    # A bump in the other corner.
    lambda x, y: 1 + np.exp(-((x - 20) / 12) ** 2 - ((y - 60) / 25) ** 2),
], ids=["throughput", "bump", "bump2"])
def test_optimizer_finds_the_max_of_smooth_functions(f):
    bo = BayesianOptimizer(BOX, noise=0.8, seed=0)
    for p in SEEDS:
        bo.add_sample(p, f(*p))
    for _ in range(20 - len(SEEDS)):
        p = bo.next_sample()
        assert all(lo <= v <= hi for v, (lo, hi) in zip(p, BOX))
        bo.add_sample(p, f(*p))
    point, score = bo.best()
    assert f(*point) >= 0.9 * _grid_max(f)
    assert len(bo.samples) == 20


def test_optimizer_is_deterministic_and_checks_its_input():
    def run():
        bo = BayesianOptimizer([(0.0, 1.0)], noise=0.5, seed=3)
        out = [bo.next_sample()[0]]                     # no samples yet: a seeded random point
        for _ in range(5):
            bo.add_sample(out[-1:], -(out[-1] - 0.3) ** 2)
            out.append(bo.next_sample()[0])
        return out

    assert run() == run()
    bo = BayesianOptimizer(BOX)
    with pytest.raises(ValueError, match="coordinates"):
        bo.add_sample([1.0], 1.0)
    with pytest.raises(ValueError, match="finite"):
        bo.add_sample([1.0, 2.0], math.nan)
    with pytest.raises(ValueError, match="low < high"):
        BayesianOptimizer([(1.0, 1.0)])


# -------------------------------------------------------------------------------- simulated workload


class Workload:
    """A training loop whose step time depends on the parameters the way Horovod's does.

    Each step allreduces ``n`` gradients of 1 MB, packed greedily into buffers of at most the fusion
    threshold; each buffer is one executed response list. Step time = compute + transfer + a per-buffer
    latency (higher without the response cache) + the cycle time's cost (waiting grows with it, spinning
    grows as it shrinks) + lost overlap as buffers grow. The best point is near 34 MB and 2 ms with the cache.
    """

    def __init__(self, params, n=100, noise=0.03, seed=0, slow_steps=0):
        self.params = dict(params)
        self.n = n
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.now = 100.0
        self.steps = 0
        self.slow_steps = slow_steps
        self.applied = []

    @staticmethod
    def step_ms(threshold_bytes, cycle_ms, cache, n=100):
        """Works on numpy arrays too (for the grid search of the hand-tuned best)."""
        per_buffer = np.maximum(1, threshold_bytes // MIB)
        buffers = np.ceil(n / per_buffer)
        threshold_mb = threshold_bytes / MIB
        return (5.0 + n / 10.0 + buffers * (0.3 + np.where(cache, 0.0, 0.2)) + 0.02 * threshold_mb
                + 0.5 * cycle_ms + 2.0 / cycle_ms)

    @classmethod
    def throughput(cls, threshold_bytes, cycle_ms, cache, n=100):
        """Bytes per microsecond, noise-free."""
        return n * MIB / (cls.step_ms(threshold_bytes, cycle_ms, cache, n) * 1000.0)

    @classmethod
    def best_throughput(cls, n=100, fusion_mb=None, cycle_ms=None):
        """The hand-tuned best: a fine grid search (0.25 MB, 0.05 ms, cache on and off)."""
        mb = np.arange(0, 64.25, 0.25) if fusion_mb is None else np.array([fusion_mb])
        ms = np.arange(1, 100.05, 0.05) if cycle_ms is None else np.array([cycle_ms])
        grid_mb, grid_ms, grid_cache = np.meshgrid(mb, ms, [True, False])
        return float(cls.throughput((grid_mb * MIB).astype(np.int64), grid_ms, grid_cache, n).max())

    def step(self, tuner):
        p = self.params
        per_buffer = max(1, int(p["fusion_threshold"] // MIB))
        buffers = [list(range(i, min(i + per_buffer, self.n))) for i in range(0, self.n, per_buffer)]
        ms = self.step_ms(p["fusion_threshold"], p["cycle_time_ms"], p["cache_enabled"], self.n)
        ms *= math.exp(self.noise * self.rng.standard_normal())
        if self.steps < self.slow_steps:
            ms *= 5.0
        start, update = self.now, None
        for i, buffer in enumerate(buffers):
            self.now = start + ms / 1000.0 * (i + 1) / len(buffers)
            out = tuner.record([f"grad.{j}" for j in buffer], len(buffer) * MIB, self.now)
            if out is not None:
                update = out
        self.steps += 1
        if update is not None:          # applied from the next step, as the engine's next cycle would
            self.applied.append(update)
            self.params = dict(update)

    def run(self, tuner, max_steps):
        while not tuner.done and self.steps < max_steps:
            self.step(tuner)


MISTUNED = {"fusion_threshold": 1 * MIB, "cycle_time_ms": 20.0, "cache_enabled": True}


def _budget_steps(warmup=3, bayes=20, categorical=2, samples=5, steps=10):
    return (warmup + 1 + bayes + categorical) * samples * steps + steps


def test_autotuner_reaches_90_percent_of_hand_tuned_throughput(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="horovod.core.observers.autotune")
    tuner = Autotuner(MISTUNED, log_path=str(tmp_path / "a.csv"))
    work = Workload(MISTUNED)
    start = Workload.throughput(MIB, 20.0, True)
    work.run(tuner, max_steps=_budget_steps())
    assert tuner.done and tuner.stage is Stage.DONE
    final = work.params
    assert final == work.applied[-1] == tuner.values == tuner.best[0]
    reached = Workload.throughput(final["fusion_threshold"], final["cycle_time_ms"], final["cache_enabled"])
    best = Workload.best_throughput()
    assert reached >= 0.9 * best, (final, reached / best)
    assert reached > 2.5 * start
    # Baseline + 20 Bayesian points + 2 cache values, then the best row.
    rows = (tmp_path / "a.csv").read_text().splitlines()
    assert rows[0] == CSV_HEADER and len(rows) == 1 + 1 + 20 + 2 + 1
    assert rows[1].startswith("0,0,0, 1,20,1,")
    assert [r.split(",")[4:6] for r in rows[2:6]] == [["5", "4"], ["50", "32"], ["25", "16"], ["10", "8"]]
    assert any("Autotuner: Best params [0, 0, 0, 1, " in m for m in caplog.messages)
    assert sum("Warming up" in m for m in caplog.messages) == 3
    # Once done, record() is inert.
    assert tuner.record(["grad.0"] * 50, 1, work.now + 1) is None


def test_warmup_scores_are_discarded(tmp_path):
    """A slow start (5x step time for the 150 steps of the 3 warmup points) leaves no trace in the scores."""
    tuner = Autotuner(MISTUNED, bayes_max_samples=0, log_path=str(tmp_path / "w.csv"))
    work = Workload(MISTUNED, noise=0.0, slow_steps=3 * 5 * 10)
    work.run(tuner, max_steps=1000)
    rows = (tmp_path / "w.csv").read_text().splitlines()
    assert len(rows) == 1 + 1 + 2 + 1                 # baseline, cache on and off, best
    baseline = float(rows[1].split(",")[-1])
    assert baseline == pytest.approx(Workload.throughput(MIB, 20.0, True), rel=1e-3)
    # Warmup, baseline, two cache trials, nothing more: 5 samples of 10 steps per point (the first sample of
    # a point may start in the middle of a step).
    assert (3 + 1 + 2) * 49 <= work.steps <= (3 + 1 + 2) * 5 * 10


def test_fixed_cycle_time_is_never_changed_and_fusion_is_tuned_alone():
    initial = dict(MISTUNED, cycle_time_ms=3.0)
    tuner = Autotuner(initial, {"cycle_time_ms"}, warmup_samples=1, samples_per_point=3, bayes_max_samples=10)
    work = Workload(initial)
    work.run(tuner, max_steps=_budget_steps(warmup=1, bayes=10, samples=3))
    assert tuner.done
    assert {u["cycle_time_ms"] for u in work.applied} == {3.0}
    # The 1-D seeds are the fusion coordinates of upstream's seed points.
    assert [u["fusion_threshold"] for u in work.applied[:4]] == [4 * MIB, 32 * MIB, 16 * MIB, 8 * MIB]
    final = work.params
    reached = Workload.throughput(final["fusion_threshold"], 3.0, final["cache_enabled"])
    assert reached >= 0.9 * Workload.best_throughput(cycle_ms=3.0)


def test_both_continuous_fixed_tunes_only_the_cache():
    initial = dict(MISTUNED, cache_enabled=False)
    tuner = Autotuner(initial, {"fusion_threshold", "cycle_time_ms"}, warmup_samples=1, samples_per_point=1)
    work = Workload(initial, noise=0.0)
    work.run(tuner, max_steps=1000)
    assert tuner.done
    assert [u["cache_enabled"] for u in work.applied] == [True, False, True]
    assert all(u["fusion_threshold"] == MIB and u["cycle_time_ms"] == 20.0 for u in work.applied)


def test_fixed_cache_is_skipped_and_everything_fixed_means_nothing_to_do():
    tuner = Autotuner(MISTUNED, {"cache_enabled"}, warmup_samples=0, samples_per_point=1, bayes_max_samples=4)
    work = Workload(MISTUNED, noise=0.0)
    work.run(tuner, max_steps=1000)
    assert tuner.done and len(work.applied) == 4 + 1      # 4 seed points, then the best: no cache trials
    assert all(u["cache_enabled"] is True for u in work.applied)
    idle = Autotuner(MISTUNED, {"fusion_threshold", "cycle_time_ms", "cache_enabled"})
    assert idle.done and idle.record(["a"], 1, 0.0) is None


def test_sampling_scores_bytes_per_microsecond_and_median():
    """One tensor per step, steps of 1 ms moving 1000 bytes: every sample scores 1 byte/us."""
    tuner = Autotuner(MISTUNED, warmup_samples=0, steps_per_sample=4, samples_per_point=3,
                      bayes_max_samples=1, categoricals=())
    t, out = 0.0, []
    tuner.record(["a"], 1000, t)                   # starts the clock
    for step in range(1, 13):
        t += 0.001 if step != 2 else 0.005       # one slow step in the first sample: the median ignores it
        out.append(tuner.record(["a"], 1000, t))
    assert out[:11] == [None] * 11                 # 3 samples of 4 steps
    assert out[11] == {"fusion_threshold": 4 * MIB, "cycle_time_ms": 5.0, "cache_enabled": True}
    assert tuner.best[1] == pytest.approx(1.0)


def test_csv_and_log_lines_are_exact(tmp_path, caplog):
    """Step time = 1 + cycle/10 ms (+1 ms without the cache); one 1e6-byte tensor per step."""
    caplog.set_level(logging.INFO, logger="horovod.core.observers.autotune")
    path = tmp_path / "tune.csv"
    tuner = Autotuner(MISTUNED, warmup_samples=1, steps_per_sample=2, samples_per_point=1,
                      bayes_max_samples=2, log_path=str(path))
    params, t, applied = dict(MISTUNED), 0.0, []
    tuner.record(["w"], 10**6, t)
    while not tuner.done:
        t += (1 + params["cycle_time_ms"] / 10 + (0 if params["cache_enabled"] else 1)) / 1000
        out = tuner.record(["w"], 10**6, t)
        if out is not None:
            params = out
            applied.append(out)
    assert path.read_text() == "\n".join([
        CSV_HEADER,
        "0,0,0, 1,20,1,333.333",       # the baseline (after 1 warmup point)
        "0,0,0, 1,5,4,666.667",        # seed points
        "0,0,0, 1,50,32,166.667",
        "0,0,0, 1,5,4,666.667",        # the cache, on and off, at the best point
        "0,0,0, 0,5,4,400",
        "0,0,0,1,5,4,666.667",         # the best
    ]) + "\n"
    assert applied[-1] == {"fusion_threshold": 4 * MIB, "cycle_time_ms": 5.0, "cache_enabled": True}
    assert "Autotuner: [0, 0, 0, 1, 20 ms, 1 mb] 333.333" in caplog.messages
    assert "Autotuner: Best params [0, 0, 0, 1, 5 ms, 4 mb] 666.667" in caplog.messages


def test_same_inputs_give_the_same_sequence(tmp_path):
    def run(name):
        tuner = Autotuner(MISTUNED, warmup_samples=1, samples_per_point=2, bayes_max_samples=8,
                          log_path=str(tmp_path / name))
        work = Workload(MISTUNED, seed=7)
        work.run(tuner, max_steps=_budget_steps(warmup=1, bayes=8, samples=2))
        assert tuner.done
        return work.applied, (tmp_path / name).read_text()

    first, second = run("1.csv"), run("2.csv")
    assert first == second
    assert len(first[0]) == 8 + 2 + 1


def test_fixed_from_env():
    assert fixed_from_env({}) == set()
    assert fixed_from_env({"HOROVOD_CYCLE_TIME": "5", "HOROVOD_FUSION_THRESHOLD": ""}) == {"cycle_time_ms"}
    assert fixed_from_env({"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CACHE_CAPACITY": "0"}) == {
        "fusion_threshold", "cache_enabled"}


def test_make_autotuner_reads_the_environment(monkeypatch, tmp_path):
    for name in ("HOROVOD_AUTOTUNE", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY",
                 "HOROVOD_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"):
        monkeypatch.delenv(name, raising=False)
    assert make_autotuner(MISTUNED) is None
    monkeypatch.setenv("HOROVOD_AUTOTUNE", "1")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    monkeypatch.setenv("HOROVOD_AUTOTUNE_LOG", str(tmp_path / "log.csv"))
    monkeypatch.setenv("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "0")
    tuner = make_autotuner(dict(MISTUNED, cycle_time_ms=5.0))
    assert tuner is not None and tuner.stage is Stage.BASELINE
    assert (tmp_path / "log.csv").read_text() == CSV_HEADER + "\n"
    tuner.close()
    monkeypatch.setenv("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "1.5")
    with pytest.raises(ValueError, match=r"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE must be in \[0, 1\]"):
        make_autotuner(MISTUNED)
    monkeypatch.setenv("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.8")
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1048576")
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "0")
    assert make_autotuner(MISTUNED) is None           # everything fixed


def test_constructor_errors_say_what_is_wrong(tmp_path, caplog):
    with pytest.raises(ValueError, match="cycle_time_ms"):
        Autotuner({"fusion_threshold": MIB, "cache_enabled": True})
    with pytest.raises(ValueError, match="CSV log has columns"):
        Autotuner(MISTUNED, categoricals=[("adasum", (True, False))])
    with pytest.raises(ValueError, match="STEPS_PER_SAMPLE"):
        Autotuner(MISTUNED, steps_per_sample=0)
    caplog.set_level(logging.WARNING, logger="horovod.core.observers.autotune")
    tuner = Autotuner(MISTUNED, log_path=str(tmp_path / "missing-dir" / "x.csv"))
    assert not tuner.done
    assert any("cannot write the log" in m for m in caplog.messages)
