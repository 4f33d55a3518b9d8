"""Upstream's import path ``horovod.runner.elastic.rendezvous``: the elastic driver's handler on the job's store.

Upstream's elastic workers ask the driver's HTTP server for their rank and size (``GET /rank_and_size/<host>:
<local rank>``) and register their notification servers (``PUT /worker_addresses/...``). Our workers join rounds
through :func:`horovod.common.elastic_rendezvous.request_assignment`, which the driver
(:class:`horovod.runner.elastic.driver.ElasticDriver`) watches by itself, and poll its host notices from the store,
so they open no server. The handler made here gives upstream's two scopes on our store all the same:

- a get of :data:`GET_RANK_AND_SIZE` ``<host>:<slot>`` answers the slot's place in the driver's current round
  (``driver.get_slot_info``) as upstream's ``"rank,size,local_rank,local_size,cross_rank,cross_size"``
  (``-1`` everywhere when the slot takes no part). A driver with upstream's ``record_ready`` is told first.
- a put of :data:`PUT_WORKER_ADDRESSES` is stored; a driver with upstream's ``register_worker_server`` gets the
  decoded ``(addresses, secret_key)`` too.

Install it with ``rendezvous.start(create_rendezvous_handler(driver))``.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Tuple, Type

from horovod.runner.common.util import codec
from horovod.runner.rendezvous import RendezvousHandler

log = logging.getLogger("horovod.elastic")  # a named channel: see horovod.common.logging_setup

# GET methods
GET_RANK_AND_SIZE = "rank_and_size"

# PUT methods
PUT_WORKER_ADDRESSES = "worker_addresses"


def _slot(key: str) -> Tuple[str, int]:
    """``("host", local_rank)`` of a ``host:local_rank`` key; ValueError for another key."""
    host, sep, local_rank = key.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected a key <host>:<local rank>, got {key!r}")
    return host, int(local_rank)


def create_rendezvous_handler(driver: Any) -> Type[RendezvousHandler]:
    """The handler class that answers upstream's elastic scopes from ``driver`` (see the module's docstring)."""

    class ElasticRendezvousHandler(RendezvousHandler):
        def _get_value(self, scope: str, key: str) -> Optional[bytes]:
            if scope == GET_RANK_AND_SIZE:
                return self._get_rank_and_size(*_slot(key))
            return super()._get_value(scope, key)

        def _get_rank_and_size(self, host: str, local_rank: int) -> bytes:
            log.debug("_get_rank_and_size: %s %d", host, local_rank)
            record_ready = getattr(driver, "record_ready", None)
            if record_ready is not None:
                record_ready(host, local_rank)
            slot_info = driver.get_slot_info(host, local_rank)
            log.debug("rank and size: %d %d", slot_info.rank, slot_info.size)
            return slot_info.to_response_string().encode("ascii")

        def _put_value(self, scope: str, key: str, value: bytes) -> None:
            if scope == PUT_WORKER_ADDRESSES:
                self._put_worker_addresses(*_slot(key), value)
            super()._put_value(scope, key, value)

        def _put_worker_addresses(self, host: str, local_rank: int, value: bytes) -> None:
            register = getattr(driver, "register_worker_server", None)
            if register is None:
                log.debug("worker %s:%d put its addresses; this driver notifies through the store", host,
                          local_rank)
                return
            addresses, secret_key = codec.loads_base64(value)     # from a peer that holds the job's secret
            register(host, local_rank, addresses, secret_key)

    return ElasticRendezvousHandler
