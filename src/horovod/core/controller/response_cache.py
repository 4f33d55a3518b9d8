"""The response cache: steady-state negotiation without re-validation.

Every rank keeps an identical LRU of the tensor responses it has executed, keyed by name and indexed by a
small integer (the cache bit). The coordinator answers a tensor whose requests match its cached response
by that integer alone, and skips validating it again. Identity across ranks holds because every rank
mutates the cache only when it *applies* a response list, and all ranks apply the same lists in the same
order; the coordinator encodes list k with the state after list k-1, exactly the state in which every
worker decodes it. Capacity 0 disables the cache (``HOROVOD_CACHE_CAPACITY``).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional

from horovod.common.types import RequestType
from horovod.core.controller.messages import TensorResponse

# Broadcast and reducescatter are not cached upstream; barrier and join never are.
CACHEABLE = frozenset({RequestType.ALLREDUCE, RequestType.ALLGATHER, RequestType.ALLTOALL, RequestType.ADASUM})


class ResponseCache:
    """An LRU of TensorResponses with stable integer ids."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, int(capacity))
        self._by_name: OrderedDict[str, int] = OrderedDict()   # name -> id, in LRU order (oldest first)
        self._by_id: List[Optional[TensorResponse]] = []
        self._free: List[int] = []

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return len(self._by_name)

    def lookup(self, name: str) -> Optional[int]:
        """The id of ``name``'s cached response, or None."""
        return self._by_name.get(name)

    def get(self, cache_id: int) -> TensorResponse:
        response = self._by_id[cache_id] if 0 <= cache_id < len(self._by_id) else None
        if response is None:
            raise KeyError(f"response cache id {cache_id} is not in use; the ranks' caches diverged")
        return response

    def put(self, response: TensorResponse) -> None:
        """Insert or refresh ``response`` (called only while applying a response list)."""
        if not self.enabled or response.rtype not in CACHEABLE:
            return
        cache_id = self._by_name.get(response.name)
        if cache_id is not None:
            self._by_id[cache_id] = response
            self._by_name.move_to_end(response.name)
            return
        if len(self._by_name) >= self.capacity:
            _, cache_id = self._by_name.popitem(last=False)
            self._by_id[cache_id] = None
            self._free.append(cache_id)
        if self._free:
            cache_id = self._free.pop()
            self._by_id[cache_id] = response
        else:
            cache_id = len(self._by_id)
            self._by_id.append(response)
        self._by_name[response.name] = cache_id

    def set_capacity(self, capacity: int) -> None:
        """Resize (0 disables and empties it). Every rank does this at the same point of the response stream,
        so the caches stay identical."""
        self.capacity = max(0, int(capacity))
        while len(self._by_name) > self.capacity:
            _, cache_id = self._by_name.popitem(last=False)
            self._by_id[cache_id] = None
            self._free.append(cache_id)

    def touch(self, cache_id: int) -> None:
        """Mark a cached response as used (when applying a list that referenced it)."""
        response = self._by_id[cache_id]
        if response is not None:
            self._by_name.move_to_end(response.name)

    def snapshot(self) -> Dict[str, int]:
        """Name -> id, for tests that compare caches across ranks."""
        return dict(self._by_name)
