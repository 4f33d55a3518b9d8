"""The compression scheme shared by the framework bindings: a compressor casts floating-point tensors to a
narrower wire dtype before the allreduce and back after it. Each binding supplies three framework hooks."""
from __future__ import annotations

from typing import Any, Tuple


class Compressor:
    """Interface: ``compress`` before the wire, ``decompress`` after it."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Leave tensors as they are."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class CastCompressor(Compressor):
    """Send floating-point tensors as ``wire_dtype`` and restore their dtype after. A binding subclasses it with
    ``dtype_of``, ``is_floating`` and ``cast`` for its tensors, then once per ``wire_dtype``."""

    wire_dtype: Any = None

    @staticmethod
    def dtype_of(tensor: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        raise NotImplementedError

    @staticmethod
    def cast(tensor: Any, dtype: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor: Any) -> Tuple[Any, Any]:
        dtype = cls.dtype_of(tensor)
        if cls.is_floating(dtype) and dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        return cls.cast(tensor, ctx) if ctx is not None else tensor
