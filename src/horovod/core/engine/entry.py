"""``Entry``: this rank's side of one named collective, as the op layer submits it to the engine."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from horovod.core.controller.messages import Request
from horovod.core.engine.handles import Handle


class Entry:
    """This rank's side of one named collective: its request, buffers and handle."""

    __slots__ = ("request", "tensor", "output", "allocate", "handle", "index", "flight", "carried")

    def __init__(self, request: Request, tensor: Optional[np.ndarray], output: Optional[np.ndarray],
                 handle: Handle, index: int = 0,
                 allocate: Optional[Callable[[tuple, np.dtype], np.ndarray]] = None) -> None:
        self.request = request
        self.tensor = tensor
        self.output = output
        self.allocate = allocate
        self.handle = handle
        self.index = index
        self.flight: Optional[list] = None      # this collective's flight record (core/engine/flight.py)
        self.carried = False        # its input goes to rank 0 with its request (core/engine/carried.py)

    @property
    def name(self) -> str:
        return self.request.name
