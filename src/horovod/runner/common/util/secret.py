"""Upstream's import path ``horovod.runner.common.util.secret``: the job key and HMAC digests of messages.

The job's key is the one :func:`horovod.common.wire.make_secret` makes (32 random bytes); the launcher hands it
to the workers in ``_HOROVOD_SECRET_KEY`` as hex (upstream: base64 of a pickle), which
:func:`horovod.common.wire.secret_from_env` reads. The digests are HMAC-SHA256, as upstream's and as the wire's
handshake.
"""
from __future__ import annotations

import hashlib
import hmac

from horovod.common import wire

SECRET_LENGTH = 32  # bytes
DIGEST_LENGTH = 32  # bytes
HOROVOD_SECRET_KEY = wire.SECRET_ENV


def make_secret_key() -> bytes:
    """A fresh random job key of :data:`SECRET_LENGTH` bytes."""
    return bytes.fromhex(wire.make_secret())


def compute_digest(key: bytes, message: bytes) -> bytes:
    """The HMAC-SHA256 of ``message`` under ``key`` (:data:`DIGEST_LENGTH` bytes)."""
    return hmac.new(key, message, hashlib.sha256).digest()


def check_digest(key: bytes, message: bytes, digest: bytes) -> bool:
    """True when ``digest`` is ``message``'s HMAC under ``key`` (compared in constant time)."""
    return hmac.compare_digest(compute_digest(key, message), digest)
