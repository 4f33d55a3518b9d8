"""Spark ML persistence of the estimators and models (upstream's ``horovod.spark.common.serialization``).

``save(path)`` writes Spark ML's usual ``path/metadata`` (JSON: class, uid, Spark version, paramMap,
defaultParamMap), so a ``Pipeline`` or ``PipelineModel`` holding these stages saves and loads too. Param
values that JSON can hold (numbers, strings, lists of them) are in paramMap as they are; the others (networks,
optimizers, functions, stores) go together into one cloudpickle, base64 in the metadata's ``horovodObjects``,
so that objects which share state (a torch optimizer and its model's parameters) still share it when loaded. A
class may give a param its own codec (Keras models travel in the ``.keras`` format). Loading unpickles: load
only what you (or your pipelines) saved, as with any pickle.
"""
from __future__ import annotations

import base64
from typing import Any, Callable, Dict, Tuple

from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

OBJECTS_KEY = "horovodObjects"

# param name -> (encode to bytes, decode from bytes given the other params' loaded values by name)
Codecs = Dict[str, Tuple[Callable[[Any], bytes], Callable[[bytes, Dict[str, Any]], Any]]]


def dumps(value: Any) -> str:
    """``value`` as base64 text of its cloudpickle."""
    import cloudpickle

    return base64.b64encode(cloudpickle.dumps(value)).decode("ascii")


def loads(text: str) -> Any:
    """The value ``dumps`` encoded."""
    import cloudpickle

    return cloudpickle.loads(base64.b64decode(text.encode("ascii")))


def _codecs(instance: Any) -> Codecs:
    return getattr(instance, "_param_codecs", lambda: {})()


class HorovodParamsWriter(MLWriter):
    """Writes an estimator or model: Spark ML metadata whose paramMap holds the encoded param values."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        codecs = _codecs(self.instance)
        plain, objects = {}, {}
        for param, value in self.instance._paramMap.items():
            if value is not None and param.name in codecs:
                objects[param.name] = codecs[param.name][0](value)
            elif _is_plain(value):
                plain[param.name] = value
            else:
                objects[param.name] = value
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession,
                                         extraMetadata={OBJECTS_KEY: dumps(objects)}, paramMap=plain)


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _is_plain(item) for key, item in value.items())
    return False


class HorovodParamsReader(MLReader):
    """Reads what ``HorovodParamsWriter`` wrote back into an instance of ``cls``."""

    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        codecs = _codecs(instance)
        decoded = dict(metadata["paramMap"])
        decoded.update(loads(metadata[OBJECTS_KEY]))
        for name in codecs:
            if decoded.get(name) is not None:
                decoded[name] = codecs[name][1](decoded[name], decoded)
        instance._set(**decoded)
        return instance


class HorovodParamsWritable(MLWritable):
    """Mixin: ``save(path)`` / ``write()`` through HorovodParamsWriter."""

    def write(self) -> MLWriter:
        return HorovodParamsWriter(self)


class HorovodParamsReadable(MLReadable):
    """Mixin: ``cls.load(path)`` / ``cls.read()`` through HorovodParamsReader."""

    @classmethod
    def read(cls) -> MLReader:
        return HorovodParamsReader(cls)
