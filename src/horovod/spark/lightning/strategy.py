"""The Lightning estimator's strategy is the public ``horovod.lightning.HorovodStrategy``; this module keeps the
import path it had here (``strategy_class``, and ``_named_parameters``, which the estimator's tests use)."""
from horovod.lightning.strategy import _named_parameters, strategy_class  # noqa: F401

__all__ = ["strategy_class"]
