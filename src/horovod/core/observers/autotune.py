"""The autotuner: rank 0 measures throughput and tunes fusion threshold, cycle time and the response cache.

Upstream's ``ParameterManager`` (``parameter_manager.cc``), as a pure object that the engine drives. After
every executed response list the engine on rank 0 calls :meth:`Autotuner.record` with the tensor names, the
bytes they moved and the time. Whenever a parameter point has been measured, ``record`` returns the values to
apply next (the engine broadcasts them to every rank); otherwise it returns None.

How a point is measured: a *sample* ends once some tensor has been seen ``steps_per_sample`` more times (one
training step submits each gradient once, so a sample is about ``steps_per_sample`` steps); its score is the
bytes of the sample divided by its duration in microseconds. A point's score is the median of
``samples_per_point`` samples (5, as upstream). The first ``warmup_samples`` point scores are discarded, as
upstream's ``Tune`` does, so that start-up costs (JIT compilation, allocator growth) do not count.

What is tuned, in order:

0. The starting values are measured once more after the warmup (the *baseline*): they compete with the
   points the search tries, so a job that was already well tuned keeps its values.
1. Jointly, by Bayesian optimisation (see :mod:`horovod.core.observers.bayesian_optimization`): the fusion threshold
   in MB over [0, 64] and the cycle time in ms over [1, 100]: upstream's seed points (4, 5), (32, 50),
   (16, 25), (8, 10), then points proposed by Expected Improvement, ``bayes_max_samples`` points in all. The
   best is the point with the highest score (the baseline included).
2. Each categorical parameter (by default ``cache_enabled``), one after the other: every value is measured
   with the best values found so far, and the best is kept.

Then the best values are returned one last time, logged, and written as the last row of the CSV log. Only the
engine thread of rank 0 calls into an autotuner; it is not thread-safe.

A parameter set explicitly by the user is never changed: a fixed continuous parameter leaves a 1-D search
over the other one, and a fixed categorical parameter is skipped.
"""
from __future__ import annotations

import enum
import logging
from typing import IO, AbstractSet, Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from horovod.common import config

log = logging.getLogger(__name__)

MIB = 1024 * 1024

#: The continuous parameters: (name in the values dict, bounds of the search box in the search unit).
FUSION_THRESHOLD = "fusion_threshold"     # bytes in the values dict, MB in the search
CYCLE_TIME_MS = "cycle_time_ms"
CACHE_ENABLED = "cache_enabled"
CONTINUOUS_BOUNDS: Dict[str, Tuple[float, float]] = {FUSION_THRESHOLD: (0.0, 64.0), CYCLE_TIME_MS: (1.0, 100.0)}

#: Upstream's seed points, as (fusion threshold MB, cycle time ms).
SEED_POINTS: Tuple[Tuple[float, float], ...] = ((4.0, 5.0), (32.0, 50.0), (16.0, 25.0), (8.0, 10.0))

DEFAULT_CATEGORICALS: Tuple[Tuple[str, Tuple[Any, ...]], ...] = ((CACHE_ENABLED, (True, False)),)

#: The boolean columns of upstream's CSV log, in order; a categorical parameter must be one of them.
CATEGORICAL_COLUMNS = ("hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce", CACHE_ENABLED)
CSV_HEADER = ("hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
              "tensor_fusion_threshold,score")

#: Which environment variable fixes which parameter (set explicitly means not tuned).
FIXING_VARIABLES: Dict[str, str] = {
    "HOROVOD_FUSION_THRESHOLD": FUSION_THRESHOLD,
    "HOROVOD_CYCLE_TIME": CYCLE_TIME_MS,
    "HOROVOD_CACHE_CAPACITY": CACHE_ENABLED,
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "hierarchical_allreduce",
}   # the hierarchical-allgather and torus switches are inert here (common/config.py): nothing tunes or reads them


class Stage(enum.Enum):
    """Where the autotuner is: each stage measures points until it hands over to the next."""

    WARMUP = "warmup"            # measuring the starting values; their scores are discarded
    BASELINE = "baseline"        # measuring the starting values once more, for the record
    BAYESIAN = "bayesian"        # seed points, then Expected Improvement proposals
    CATEGORICAL = "categorical"  # every value of each categorical parameter in turn
    DONE = "done"


def fixed_from_env(environ: Optional[Mapping[str, str]] = None) -> Set[str]:
    """The parameter names that ``environ`` sets explicitly, which the autotuner must leave alone.

    ``HOROVOD_FUSION_THRESHOLD`` fixes ``fusion_threshold``, ``HOROVOD_CYCLE_TIME`` fixes ``cycle_time_ms``
    and ``HOROVOD_CACHE_CAPACITY`` fixes ``cache_enabled`` (and ``HOROVOD_HIERARCHICAL_ALLREDUCE`` fixes its
    switch).
    horovodrun exports these only for the flags the user gave.
    """
    return {name for variable, name in FIXING_VARIABLES.items() if config.is_set(variable, environ)}


def _format_value(value: Any) -> str:
    """A value as upstream's C++ stream writes it: booleans as 0/1, doubles with 6 significant digits."""
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):g}"
    return str(value)


class Autotuner:
    """Tunes the engine's parameters from the throughput it observes (rank 0 only).

    ``initial`` holds the engine's current values: ``fusion_threshold`` (bytes), ``cycle_time_ms`` (float)
    and a value for each categorical parameter (``cache_enabled`` by default). ``fixed`` names the parameters
    the user set explicitly (see :func:`fixed_from_env`); they are never changed. The other arguments are the
    ``HOROVOD_AUTOTUNE_*`` knobs; ``samples_per_point`` (5 upstream) may be lowered for quick experiments.
    ``seed`` makes the Bayesian optimisation, and so the whole sequence of points, reproducible.
    """

    def __init__(self, initial: Mapping[str, Any], fixed: AbstractSet[str] = frozenset(), *,
                 warmup_samples: int = 3, steps_per_sample: int = 10, bayes_max_samples: int = 20,
                 gaussian_process_noise: float = 0.8, samples_per_point: int = 5,
                 categoricals: Sequence[Tuple[str, Sequence[Any]]] = DEFAULT_CATEGORICALS,
                 log_path: Optional[str] = None, seed: int = 0) -> None:
        _check_arguments(warmup_samples, steps_per_sample, bayes_max_samples, gaussian_process_noise,
                         samples_per_point)
        self._categoricals: List[Tuple[str, Tuple[Any, ...]]] = [(n, tuple(v)) for n, v in categoricals]
        for name, values in self._categoricals:
            if name not in CATEGORICAL_COLUMNS:
                raise ValueError(f"Autotuner cannot tune categorical parameter {name!r}: the CSV log has columns "
                                 f"only for {', '.join(CATEGORICAL_COLUMNS)}")
            if not values:
                raise ValueError(f"categorical parameter {name!r} needs at least one value to try")
        missing = [n for n in (FUSION_THRESHOLD, CYCLE_TIME_MS, *(n for n, _ in self._categoricals))
                   if n not in initial]
        if missing:
            raise ValueError(f"Autotuner needs the current value of {', '.join(missing)} in `initial` "
                             f"(got {sorted(initial)})")
        self._values: Dict[str, Any] = dict(initial)
        self._values[FUSION_THRESHOLD] = int(initial[FUSION_THRESHOLD])
        self._values[CYCLE_TIME_MS] = float(initial[CYCLE_TIME_MS])
        self._fusion_mb = self._values[FUSION_THRESHOLD] / MIB
        self._fixed = frozenset(fixed)
        self._steps_per_sample = int(steps_per_sample)
        self._samples_per_point = int(samples_per_point)
        self._warmup_remaining = int(warmup_samples)
        self._bayes_max_samples = int(bayes_max_samples)

        # Measurement of the current sample and point.
        self._sample_start: Optional[float] = None
        self._sample_bytes = 0
        self._counts: Dict[str, int] = {}
        self._samples: List[float] = []

        # The search.
        self._free_dims = [n for n in (FUSION_THRESHOLD, CYCLE_TIME_MS) if n not in self._fixed]
        self._optimizer = None
        self._seeds: List[np.ndarray] = []
        self._bayes_scored = 0
        if self._free_dims and self._bayes_max_samples > 0:
            from horovod.core.observers.bayesian_optimization import BayesianOptimizer

            self._optimizer = BayesianOptimizer([CONTINUOUS_BOUNDS[n] for n in self._free_dims],
                                                noise=gaussian_process_noise, seed=seed)
            self._seeds = self._seed_points()
        self._pending_categoricals = [(n, v) for n, v in self._categoricals if n not in self._fixed]
        self._trial_scores: List[float] = []
        self._best_values: Dict[str, Any] = dict(self._values)
        self._best_mb = self._fusion_mb
        self._best_score = float("-inf")

        self._csv: Optional[IO[str]] = None
        if self._optimizer is None and not self._pending_categoricals:
            log.info("Autotuner: nothing to tune (every parameter is fixed)")
            self._stage = Stage.DONE
        else:
            if log_path:
                self._open_csv(log_path)
            self._stage = Stage.WARMUP if self._warmup_remaining > 0 else Stage.BASELINE
            log.info("Autotuner: tuning %s (fixed: %s)",
                     ", ".join(self._free_dims + [n for n, _ in self._pending_categoricals]),
                     ", ".join(sorted(self._fixed)) or "none")

    # ---------------------------------------------------------------------------------------------- API

    @property
    def done(self) -> bool:
        """True once tuning has finished and the best values have been returned."""
        return self._stage is Stage.DONE

    @property
    def stage(self) -> Stage:
        """The current stage."""
        return self._stage

    @property
    def values(self) -> Dict[str, Any]:
        """The parameter values the engine should be running with now."""
        return dict(self._values)

    @property
    def best(self) -> Tuple[Dict[str, Any], float]:
        """The best values found so far and their score (bytes per µs; -inf before any scored point)."""
        return dict(self._best_values), self._best_score

    def record(self, names: Sequence[str], nbytes: int, now: float) -> Optional[Dict[str, Any]]:
        """Account for one executed response list: its tensor ``names``, the ``nbytes`` it moved, and the
        time ``now`` (seconds, monotonic) when it completed.

        Returns the parameter values to apply from now on when a point has just been scored (every parameter,
        fixed ones included, e.g. ``{"fusion_threshold": 33554432, "cycle_time_ms": 2.5,
        "cache_enabled": True}``), or None. After the last point it returns the best values once and
        :attr:`done` becomes True; later calls do nothing.
        """
        if self._stage is Stage.DONE:
            return None
        if self._sample_start is None:       # the first call only starts the clock
            self._sample_start = now
            return None
        self._sample_bytes += int(nbytes)
        # Counts run from the start of the point, as upstream's do: sample j ends when some tensor has been
        # seen (j + 1) * steps_per_sample times, so that later samples span whole steps.
        threshold = (len(self._samples) + 1) * self._steps_per_sample
        ended = False
        for name in names:
            count = self._counts.get(name, 0) + 1
            self._counts[name] = count
            if count >= threshold:
                ended = True
        if not ended:
            return None
        duration_us = max((now - self._sample_start) * 1e6, 1.0)
        self._samples.append(self._sample_bytes / duration_us)
        self._sample_start = now
        self._sample_bytes = 0
        if len(self._samples) < self._samples_per_point:
            return None
        score = sorted(self._samples)[len(self._samples) // 2]    # the median (upper median, as upstream)
        self._samples.clear()
        self._counts.clear()
        return self._on_point_scored(score)

    def close(self) -> None:
        """Close the CSV log (the engine calls this at shutdown; finishing closes it too)."""
        if self._csv is not None:
            self._csv.close()
            self._csv = None

    # ---------------------------------------------------------------------------------------- the chain

    def _on_point_scored(self, score: float) -> Optional[Dict[str, Any]]:
        if self._stage is Stage.WARMUP:
            self._warmup_remaining -= 1
            log.info("Autotuner: Warming up (%d remaining)", self._warmup_remaining)
            if self._warmup_remaining > 0:
                return None
            self._stage = Stage.BASELINE
            return None                      # the baseline runs at the values already in place
        self._log_point(score)
        if self._stage is Stage.BASELINE:
            self._observe_continuous(score)
            if self._optimizer is not None:
                self._stage = Stage.BAYESIAN
                return self._next_bayesian_point()
            self._stage = Stage.CATEGORICAL
            return self._start_categorical()
        if self._stage is Stage.BAYESIAN:
            self._observe_continuous(score)
            self._bayes_scored += 1
            if self._bayes_scored < self._bayes_max_samples:
                return self._next_bayesian_point()
            self._stage = Stage.CATEGORICAL
            return self._start_categorical()
        return self._categorical_scored(score)

    def _observe_continuous(self, score: float) -> None:
        """Feed the measured point to the optimiser (when inside its box) and track the best measurement."""
        if self._optimizer is not None:
            point = self._continuous_point()
            bounds = [CONTINUOUS_BOUNDS[n] for n in self._free_dims]
            if all(lo <= x <= hi for x, (lo, hi) in zip(point, bounds)):
                self._optimizer.add_sample(point, score)
        if score > self._best_score:
            self._best_score = score
            self._best_values = dict(self._values)
            self._best_mb = self._fusion_mb

    def _next_bayesian_point(self) -> Dict[str, Any]:
        point = self._seeds.pop(0) if self._seeds else self._optimizer.next_sample()
        for name, x in zip(self._free_dims, point):
            if name == FUSION_THRESHOLD:
                self._fusion_mb = float(x)
                self._values[FUSION_THRESHOLD] = int(round(float(x) * MIB))
            else:
                self._values[CYCLE_TIME_MS] = float(x)
        return self.values

    def _start_categorical(self) -> Dict[str, Any]:
        """Fix the best continuous values found and start trying the first categorical parameter."""
        self._values = dict(self._best_values)
        self._fusion_mb = self._best_mb
        if not self._pending_categoricals:
            return self._finish()
        name, values = self._pending_categoricals[0]
        self._trial_scores = []
        self._values[name] = values[0]
        return self.values

    def _categorical_scored(self, score: float) -> Dict[str, Any]:
        name, values = self._pending_categoricals[0]
        self._trial_scores.append(score)
        if len(self._trial_scores) < len(values):
            self._values[name] = values[len(self._trial_scores)]
            return self.values
        best = int(np.argmax(self._trial_scores))
        self._best_values = dict(self._values)
        self._best_values[name] = values[best]
        self._best_mb = self._fusion_mb
        self._best_score = self._trial_scores[best]
        self._pending_categoricals.pop(0)
        return self._start_categorical()

    def _finish(self) -> Dict[str, Any]:
        self._values = dict(self._best_values)
        self._fusion_mb = self._best_mb
        self._stage = Stage.DONE
        columns = self._columns()
        log.info("Autotuner: Best params [%s, %s, %s, %s, %s ms, %s mb] %s", *columns[:4],
                 columns[4], columns[5], _format_value(self._best_score))
        self._write_row(",".join(columns) + "," + _format_value(self._best_score))
        self.close()
        return self.values

    # ----------------------------------------------------------------------------------------- helpers

    def _seed_points(self) -> List[np.ndarray]:
        """Upstream's seed points, projected onto the free dimensions, without duplicates, within budget."""
        index = {FUSION_THRESHOLD: 0, CYCLE_TIME_MS: 1}
        seeds: List[np.ndarray] = []
        for seed in SEED_POINTS:
            point = np.array([seed[index[n]] for n in self._free_dims])
            if not any(np.array_equal(point, s) for s in seeds):
                seeds.append(point)
        return seeds[:self._bayes_max_samples]

    def _continuous_point(self) -> List[float]:
        return [self._fusion_mb if n == FUSION_THRESHOLD else self._values[CYCLE_TIME_MS] for n in self._free_dims]

    def _columns(self) -> List[str]:
        """The six parameter columns of the CSV log, formatted, for the current values."""
        flags = [_format_value(self._values.get(name, False)) for name in CATEGORICAL_COLUMNS]
        return flags + [_format_value(self._values[CYCLE_TIME_MS]), _format_value(self._fusion_mb)]

    def _log_point(self, score: float) -> None:
        columns = self._columns()
        log.info("Autotuner: [%s, %s, %s, %s, %s ms, %s mb] %s", *columns[:4], columns[4], columns[5],
                 _format_value(score))
        # Upstream writes ", " after the torus value in these rows (and only in these rows).
        self._write_row(",".join(columns[:3]) + ", " + ",".join(columns[3:]) + "," + _format_value(score))

    def _open_csv(self, path: str) -> None:
        try:
            self._csv = open(path, "w", encoding="utf-8")     # kept open until tuning ends
            self._csv.write(CSV_HEADER + "\n")
            self._csv.flush()
        except OSError as exc:
            self._csv = None
            log.warning("Autotuner: cannot write the log %s (%s); tuning goes on without it. Set "
                        "HOROVOD_AUTOTUNE_LOG (or --autotune-log-file) to a writable path.", path, exc)

    def _write_row(self, row: str) -> None:
        if self._csv is not None:
            self._csv.write(row + "\n")
            self._csv.flush()


def _check_arguments(warmup_samples: int, steps_per_sample: int, bayes_max_samples: int, noise: float,
                     samples_per_point: int) -> None:
    if warmup_samples < 0:
        raise ValueError(f"HOROVOD_AUTOTUNE_WARMUP_SAMPLES must be >= 0, got {warmup_samples}")
    if steps_per_sample < 1:
        raise ValueError(f"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE must be >= 1, got {steps_per_sample}")
    if bayes_max_samples < 0:
        raise ValueError(f"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES must be >= 0, got {bayes_max_samples}")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE must be in [0, 1], got {noise}")
    if samples_per_point < 1:
        raise ValueError(f"samples_per_point must be >= 1, got {samples_per_point}")


def make_autotuner(initial: Dict[str, Any]) -> Optional[Autotuner]:
    """The autotuner configured from the ``HOROVOD_AUTOTUNE*`` environment, or None when autotuning is off.

    Call it on rank 0 only, with the engine's starting values (see :class:`Autotuner`). Parameters set
    explicitly in the environment are fixed. Returns None too when every parameter is fixed.
    """
    if not config.get("HOROVOD_AUTOTUNE"):
        return None
    tuner = Autotuner(
        initial, fixed_from_env(),
        warmup_samples=config.get("HOROVOD_AUTOTUNE_WARMUP_SAMPLES"),
        steps_per_sample=config.get("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"),
        bayes_max_samples=config.get("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"),
        gaussian_process_noise=config.get("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"),
        log_path=config.get("HOROVOD_AUTOTUNE_LOG") or None,
    )
    return None if tuner.done else tuner
