"""What a ``.keras`` file saved with a tf_keras ``DistributedOptimizer`` resolves to when plain tf_keras loads it:
the file names ``horovod._keras.<Class>`` (see ``horovod._keras``), and tf_keras calls ``from_config`` on what it
finds there. Importing this module imports neither TensorFlow nor tf_keras."""
from __future__ import annotations

from typing import Any, Dict, Optional


class SavedOptimizerName:
    """``horovod._keras.<name>`` for plain tf_keras: ``from_config`` builds tf_keras's own optimizer of that name,
    legacy or v2 as the saved config says (tf_keras's own loader decides the same way)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<horovod._keras.{self.name}: loads tf_keras's {self.name}>"

    def from_config(self, config: Dict[str, Any], custom_objects: Optional[Dict[str, Any]] = None) -> Any:
        from horovod._keras.keras2.loading import plain_optimizer_class

        config = dict(config)
        cls = plain_optimizer_class(self.name, config)
        return cls.from_config(config, custom_objects=custom_objects)
