"""Bayesian optimisation over a box: Gaussian process regression plus Expected Improvement.

This is the optimiser behind the autotuner (upstream ``optim/bayesian_optimization.cc`` and
``optim/gaussian_process.cc``). Inputs are normalised to the unit cube and scores are standardised before the
Gaussian process (Matérn 5/2 plus white noise) is fitted, so the noise setting means the same thing whatever
the units of the score. The acquisition function (Expected Improvement, ``xi=0.01``) is maximised by scoring a
thousand random candidates and refining the best two with L-BFGS-B. Every random draw comes from one seeded
``numpy.random.Generator``, so a run is reproducible.

scikit-learn (and scipy, which it depends on) must be installed: ``pip install scikit-learn``.
"""
from __future__ import annotations

import logging
import warnings
from typing import List, Optional, Sequence, Tuple

import numpy as np

log = logging.getLogger(__name__)

_MIN_NOISE = 1e-6     # the least noise variance (standardised units) the model may assume
_JITTER = 1e-8        # added to the kernel diagonal for numerical stability
_LS_MIN = 0.2         # shortest length scale (unit cube): smoother fits resist noise
_INSTALL_HINT = "The autotuner needs scikit-learn (and scipy): pip install scikit-learn, or unset HOROVOD_AUTOTUNE."


def _import_sklearn():
    """Import the pieces of scikit-learn and scipy we use, or say what to install."""
    try:
        from scipy.optimize import minimize
        from scipy.special import ndtr
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel
    except ImportError as exc:
        raise ImportError(f"{_INSTALL_HINT} ({exc})") from exc
    return GaussianProcessRegressor, ConstantKernel, Matern, WhiteKernel, ConvergenceWarning, minimize, ndtr


class BayesianOptimizer:
    """Maximise a noisy black-box function over a box, one sample at a time.

    Call :meth:`add_sample` with each measured point and its score, and :meth:`next_sample` for the point to
    measure next. Points are in the box's own units (for example megabytes and milliseconds).
    """

    def __init__(self, bounds: Sequence[Tuple[float, float]], noise: float = 0.8, xi: float = 0.01,
                 seed: int = 0, n_candidates: int = 1000, n_refine: int = 2,
                 min_distance: float = 0.05) -> None:
        """Create an optimiser over ``bounds`` (one ``(low, high)`` pair per dimension).

        ``noise`` (``HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE``, 0 to 1) is the measurement noise variance in
        units of the standardised score: the kernel's white-noise term starts there and may only shrink, by
        maximum likelihood, when the data are smoother than that; 0 means noise-free. (Upstream adds it as a
        fixed ``alpha``.) ``xi`` is the Expected Improvement margin, in standardised score units.
        ``n_candidates`` random points are scored by the acquisition function and the best ``n_refine`` of
        them are refined locally. A point closer than ``min_distance`` (in the unit cube) to one already
        sampled is not proposed while another candidate has some expected improvement.
        """
        if not bounds:
            raise ValueError("BayesianOptimizer needs at least one dimension in bounds")
        lows = np.array([float(lo) for lo, _ in bounds])
        highs = np.array([float(hi) for _, hi in bounds])
        if np.any(highs <= lows):
            raise ValueError(f"every bound must be (low, high) with low < high, got {list(bounds)}")
        if noise < 0:
            raise ValueError(f"noise must be >= 0, got {noise}")
        (self._gpr_cls, self._const_cls, self._matern_cls, self._white_cls, self._convergence_warning,
         self._minimize, self._ndtr) = _import_sklearn()
        self._lows, self._highs = lows, highs
        self._noise = float(noise)
        self._xi = float(xi)
        self._seed = int(seed)
        self._rng = np.random.default_rng(seed)
        self._n_candidates = max(1, int(n_candidates))
        self._n_refine = max(0, int(n_refine))
        self._min_distance = float(min_distance)
        self._xs: List[np.ndarray] = []   # normalised to [0, 1]
        self._ys: List[float] = []

    @property
    def dims(self) -> int:
        """Number of dimensions of the box."""
        return len(self._lows)

    @property
    def samples(self) -> List[Tuple[np.ndarray, float]]:
        """Every ``(point, score)`` added so far, in the box's units."""
        return [(self._denormalize(x), y) for x, y in zip(self._xs, self._ys)]

    def best(self) -> Optional[Tuple[np.ndarray, float]]:
        """The sampled point with the highest score and its score, or None before any sample."""
        if not self._ys:
            return None
        index = int(np.argmax(self._ys))
        return self._denormalize(self._xs[index]), self._ys[index]

    def add_sample(self, point: Sequence[float], score: float) -> None:
        """Record that ``point`` (in the box's units) scored ``score``."""
        x = np.asarray(point, dtype=float).reshape(-1)
        if x.shape != self._lows.shape:
            raise ValueError(f"point {list(x)} has {x.size} coordinates; this optimiser has {self.dims}")
        if not np.isfinite(score):
            raise ValueError(f"score must be a finite number, got {score}")
        self._xs.append(self._normalize(x))
        self._ys.append(float(score))

    def next_sample(self) -> np.ndarray:
        """The point (in the box's units) that maximises Expected Improvement under the current model.

        With fewer than two samples there is nothing to model, and a uniformly random point is returned.
        """
        if len(self._ys) < 2:
            return self._denormalize(self._rng.random(self.dims))
        gp, y_best = self._fit()
        candidates = self._rng.random((self._n_candidates, self.dims))
        ei = self._acquisition(gp, candidates, y_best)
        order = np.argsort(-ei, kind="stable")
        best_x, best_ei = candidates[order[0]], ei[order[0]]
        for start in candidates[order[:self._n_refine]]:
            result = self._minimize(lambda x: -self._expected_improvement(gp, x.reshape(1, -1), y_best)[0],
                                    start, method="L-BFGS-B", bounds=[(0.0, 1.0)] * self.dims,
                                    options={"maxiter": 20})
            x = np.clip(result.x, 0.0, 1.0)
            value = self._acquisition(gp, x.reshape(1, -1), y_best)[0]
            if value > best_ei:
                best_x, best_ei = x, value
        log.debug("Bayesian optimisation: next point %s (expected improvement %.4g)", best_x, best_ei)
        return self._denormalize(best_x)

    def _fit(self):
        """Fit the Gaussian process to the standardised scores; return it and the best standardised score."""
        xs = np.array(self._xs)
        ys = np.array(self._ys)
        std = ys.std()
        y = (ys - ys.mean()) / (std if std > 0 else 1.0)
        kernel = (self._const_cls(1.0, (1e-2, 1e2))
                  * self._matern_cls(length_scale=np.full(self.dims, 0.3), length_scale_bounds=(_LS_MIN, 10.0),
                                     nu=2.5))
        if self._noise > _MIN_NOISE:
            kernel = kernel + self._white_cls(self._noise, (_MIN_NOISE, self._noise))
        gp = self._gpr_cls(kernel=kernel, alpha=_JITTER, normalize_y=False, n_restarts_optimizer=0,
                           random_state=self._seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", self._convergence_warning)
            gp.fit(xs, y)
        # With noisy scores the incumbent is the best posterior mean at a sampled point, not the luckiest
        # measurement (which would make every later point look hopeless).
        return gp, float(gp.predict(xs).max())

    def _acquisition(self, gp, x: np.ndarray, y_best: float) -> np.ndarray:
        """Expected Improvement, zeroed within ``min_distance`` of a sampled point.

        With noisy scores the posterior variance at a sampled point never vanishes, so plain EI keeps
        proposing the incumbent again; each point is already measured as a median of several samples, so a
        repeat would waste budget.
        """
        ei = self._expected_improvement(gp, x, y_best)
        sampled = np.array(self._xs)
        distance = np.sqrt(((x[:, None, :] - sampled[None, :, :]) ** 2).sum(axis=-1)).min(axis=1)
        return np.where(distance < self._min_distance, 0.0, ei)

    def _expected_improvement(self, gp, x: np.ndarray, y_best: float) -> np.ndarray:
        mu, sigma = gp.predict(x, return_std=True)
        sigma = np.maximum(sigma, 1e-12)
        improvement = mu - y_best - self._xi
        z = improvement / sigma
        return improvement * self._ndtr(z) + sigma * np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)

    def _normalize(self, x: np.ndarray) -> np.ndarray:
        return (x - self._lows) / (self._highs - self._lows)

    def _denormalize(self, x: np.ndarray) -> np.ndarray:
        return self._lows + np.asarray(x, dtype=float) * (self._highs - self._lows)
