"""The version of this Horovod (upstream's ``horovod.__version__``), importable without the rest of the package."""

__version__ = "0.29.0"
