"""Horovod for PyTorch Lightning 2.x: ``Trainer(strategy="horovod")`` once this is imported.

Lightning 2 removed its Horovod strategy. Importing ``horovod.lightning`` registers ``HorovodStrategy`` under the
name ``"horovod"`` in the strategy registry of every Lightning 2.x package installed (``lightning.pytorch`` and
the standalone ``pytorch_lightning``), so that a program launched with ``horovodrun -np N`` trains with::

    import horovod.lightning  # noqa: F401  (registers strategy="horovod")
    trainer = lightning.Trainer(strategy="horovod", accelerator="cpu", devices=1)

``HorovodStrategy`` is the strategy for ``lightning.pytorch`` (for ``pytorch_lightning`` where that is the only
one installed); ``strategy_class(pytorch_lightning)`` is the one for the standalone package when both are.
See ``horovod.lightning.strategy`` for what it does, and docs/lightning.md.
"""
from __future__ import annotations

from horovod.lightning.registry import lightning_packages, register
from horovod.lightning.strategy import strategy_class

_PACKAGES = lightning_packages()
for _pl in _PACKAGES:
    register(_pl)

HorovodStrategy = strategy_class(_PACKAGES[0])

__all__ = ["HorovodStrategy", "register", "strategy_class"]
