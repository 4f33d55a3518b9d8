"""Upstream's import path ``horovod.runner.http.http_server``: upstream's server names, on the authenticated
KV store (``horovod.common.kvstore``).

``KVStoreHandler`` / ``RendezvousHandler`` are the hook through which the store answers gets and puts
(:mod:`horovod.runner.rendezvous`); there is no HTTP server of upstream's kind behind them.
"""
from horovod.common.kvstore import KVStoreServer
from horovod.runner.rendezvous import KVStoreHandler, RendezvousHandler, RendezvousServer

__all__ = ["KVStoreHandler", "KVStoreServer", "RendezvousHandler", "RendezvousServer"]
