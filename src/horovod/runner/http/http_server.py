"""Upstream's server names, backed by the authenticated KV store (``horovod.common.kvstore``)."""
from horovod.common.kvstore import KVStoreServer
from horovod.runner.rendezvous import RendezvousServer

__all__ = ["KVStoreServer", "RendezvousServer"]
