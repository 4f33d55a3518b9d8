"""The controller: the coordinator's negotiation (which tensors are ready everywhere, in what order, fused how),
the messages it exchanges with the workers, and the response cache that shortens them."""
from horovod.core.controller.coordinator import Coordinator

__all__ = ["Coordinator"]
