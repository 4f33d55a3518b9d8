"""Upstream's import path ``horovod.runner.http.http_client``: ``put_data_into_kvstore`` and
``read_data_from_kvstore``, on the authenticated KV store.

The values are cloudpickled as upstream did. The secret comes from ``_HOROVOD_SECRET_KEY`` unless ``key`` is
given; ValueError when there is none.
"""
from __future__ import annotations

from typing import Any, Optional

from horovod.common import wire
from horovod.common.kvstore import KVStoreClient


def _client(addr: str, port: int, key: Optional[bytes], timeout: float) -> KVStoreClient:
    key = key if key is not None else wire.secret_from_env()
    if key is None:
        raise ValueError(f"No job secret: set {wire.SECRET_ENV} (horovodrun does) or pass key=.")
    return KVStoreClient(addr, int(port), key, timeout=timeout)


def put_data_into_kvstore(addr: str, port: int, scope: str, key: str, value: Any,
                          secret: Optional[bytes] = None, timeout: float = 30.0) -> None:
    """Cloudpickle ``value`` and store it at ``scope/key``."""
    import cloudpickle

    client = _client(addr, port, secret, timeout)
    try:
        client.put(scope, key, cloudpickle.dumps(value))
    finally:
        client.close()


def read_data_from_kvstore(addr: str, port: int, scope: str, key: str, secret: Optional[bytes] = None,
                           timeout: float = 30.0) -> Any:
    """Wait up to ``timeout`` seconds for ``scope/key`` and return the unpickled value."""
    import cloudpickle

    client = _client(addr, port, secret, timeout)
    try:
        return cloudpickle.loads(client.wait(scope, [key], timeout)[0])
    finally:
        client.close()
