"""Which Lightning packages are installed, and registering ``strategy="horovod"`` in their strategy registries.

Lightning 2.x keeps one ``StrategyRegistry`` per package (``lightning.pytorch.strategies.StrategyRegistry`` and
``pytorch_lightning.strategies.StrategyRegistry`` are different objects, as are their ``Strategy`` classes); a
``Trainer`` looks its ``strategy=`` string up there and builds the class with no arguments. A Lightning 1.x
package is left alone: it has a ``strategy="horovod"`` of its own.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
from types import ModuleType
from typing import List

from horovod.lightning.strategy import strategy_class

log = logging.getLogger(__name__)

PACKAGES = ("lightning.pytorch", "pytorch_lightning")
INSTALL_HINT = 'pip install "lightning>=2.4" (or pytorch-lightning>=2.4)'


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # "lightning.pytorch" when there is no "lightning"
        return False


def lightning_packages() -> List[ModuleType]:
    """The installed Lightning 2.x packages, ``lightning.pytorch`` first; an ImportError that says what to
    install when there is none."""
    found, old = [], []
    for name in PACKAGES:
        if not _installed(name):
            continue
        package = importlib.import_module(name)
        major = int(str(getattr(package, "__version__", "0")).split(".")[0] or 0)
        (found if major >= 2 else old).append(package)
    if not found:
        seen = ", ".join(f"{p.__name__} {p.__version__}" for p in old)
        raise ImportError("horovod.lightning needs Lightning 2.x: " + INSTALL_HINT
                          + (f" (found {seen}, which has strategy='horovod' of its own)" if seen else ""))
    return found


def register(pl: ModuleType) -> type:
    """Register ``HorovodStrategy`` as ``"horovod"`` in ``pl``'s strategy registry; returns the class."""
    cls = strategy_class(pl)
    registry = pl.strategies.StrategyRegistry
    if "horovod" in registry and registry["horovod"].get("strategy") is cls:
        return cls  # registered already (``registry.get`` would build one: it is the registry's factory)
    cls.register_strategies(registry)
    log.debug("registered strategy='horovod' in %s.strategies.StrategyRegistry", pl.__name__)
    return cls
