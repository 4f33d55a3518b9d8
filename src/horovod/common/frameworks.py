"""A binding's framework, or an ImportError that says which extra installs it (``import horovod.torch`` without
PyTorch names ``pip install "horovod[torch]"`` instead of failing deep inside the binding)."""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# module -> (the framework's name, the extra that installs it)
EXTRAS = {"torch": ("PyTorch", "torch"), "tensorflow": ("TensorFlow", "tensorflow"), "keras": ("Keras 3", "keras"),
          "jax": ("JAX", "jax"), "mxnet": ("MXNet", "mxnet"), "pyspark": ("PySpark", "spark"), "ray": ("Ray", "ray")}


def missing(module: str, binding: str, cause: BaseException) -> ImportError:
    """The error for ``binding`` when ``module`` cannot be imported."""
    name, extra = EXTRAS[module]
    note = " (MXNet 1.9 needs numpy<1.24: install it in a venv of its own, docs/mxnet.md)" if module == "mxnet" else ""
    return ImportError(f"{binding} needs {name}, which could not be imported ({cause}). Install it with: "
                       f'pip install "horovod[{extra}]"{note}')


def require(module: str, binding: str) -> ModuleType:
    """Import ``module`` for ``binding``, or raise :func:`missing`'s error."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(module, binding, exc) from exc


def require_installed(module: str, binding: str) -> None:
    """Check that ``module`` is installed without importing it (for packages that import it only when used)."""
    if importlib.util.find_spec(module) is None:
        raise missing(module, binding, ModuleNotFoundError(f"No module named {module!r}"))
