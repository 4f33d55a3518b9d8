"""Upstream's import path ``horovod.runner.common.util.host_hash``: a name for "this host" that processes sharing
memory (the same machine and the same container namespaces) agree on.

Upstream's Spark integration groups tasks into hosts by it. Our integrations place ranks by host name and
``HOROVOD_HOSTNAME``, so this is a small implementation of upstream's function for code that calls it.
"""
from __future__ import annotations

import hashlib
import os
import socket
from typing import Any

NAMESPACE_PATH = "/proc/self/ns"


def _namespaces() -> str:
    """The link targets of this process's namespaces (Linux), space-separated; '' elsewhere."""
    if not os.path.exists(NAMESPACE_PATH):
        return ""
    links = []
    for name in os.listdir(NAMESPACE_PATH):
        try:
            links.append(os.readlink(os.path.join(NAMESPACE_PATH, name)))
        except OSError:         # a namespace this process may not read
            continue
    return " ".join(links)


def _hash(string: str) -> str:
    """The hex MD5 of ``string`` (an identifier, not a security measure)."""
    return hashlib.md5(string.encode("ascii"), usedforsecurity=False).hexdigest()


def host_hash(salt: Any = None) -> str:
    """``<short host name>-<hash>`` of the full host name, the namespaces and ``salt`` (when truthy)."""
    hostname = socket.gethostname()
    host_info = f"{hostname}-{_namespaces()}"
    if salt:
        host_info = f"{host_info}-{salt}"
    return f"{hostname.split('.')[0]}-{_hash(host_info)}"
