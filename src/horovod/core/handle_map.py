"""The integer handles that the bindings' ``*_async`` functions return, as upstream's ``poll``/``synchronize`` take.

Each binding keeps one :class:`HandleMap` from integers to what it needs to finish an operation (the op layer's
``Handle`` for ``horovod.numpy``; the handle plus the conversion back to torch tensors for ``horovod.torch``).
"""
from __future__ import annotations

import threading
from typing import Dict, Generic, Optional, TypeVar

Item = TypeVar("Item")


class HandleMap(Generic[Item]):
    """A thread-safe map from fresh integer handles to pending operations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: Dict[int, Item] = {}
        self._next = 0

    def add(self, item: Item) -> int:
        """Register ``item`` and return its new handle (handles count up from 0 and are never reused)."""
        with self._lock:
            hid = self._next
            self._next += 1
            self._items[hid] = item
        return hid

    def get(self, hid: int) -> Optional[Item]:
        """The item behind ``hid``, or None when there is none."""
        with self._lock:
            return self._items.get(hid)

    def require(self, hid: int) -> Item:
        """The item behind ``hid``; ValueError (upstream's message) when it was never created or was cleared."""
        item = self.get(hid)
        if item is None:
            raise ValueError(f"Handle {hid} was not created or has been cleared.")
        return item

    def pop(self, hid: int) -> Optional[Item]:
        """Remove and return the item behind ``hid`` (None when there is none)."""
        with self._lock:
            return self._items.pop(hid, None)

    def clear(self) -> None:
        """Forget every pending item (``horovod.torch``'s ``init``/``shutdown``); the counter keeps counting."""
        with self._lock:
            self._items.clear()
