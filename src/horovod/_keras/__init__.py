"""The implementation shared by ``horovod.tensorflow.keras`` and ``horovod.keras``: Keras 3 on any backend, and
Keras 2 through tf_keras (``horovod._keras.keras2``): the distributed optimizer, collectives on values, callbacks
and ``load_model``.

A tf_keras ``DistributedOptimizer``'s class lives in this module, as upstream's did (``type(opt).__module__ ==
'horovod._keras'``), so a ``.keras`` file saved with one names ``horovod._keras.<Class>``. The names below let
plain tf_keras (without Horovod) load such a file: each gives back the wrapped optimizer class itself (legacy or
v2, as the saved config says), not a distributed one; ``hvd.load_model`` wraps it again.
"""
from horovod._keras import _framework  # noqa: F401  (first: a missing Keras is named with its extra)
from horovod._keras.keras2.saved_names import SavedOptimizerName as _SavedName

Adadelta = _SavedName("Adadelta")
Adafactor = _SavedName("Adafactor")
Adagrad = _SavedName("Adagrad")
Adam = _SavedName("Adam")
AdamW = _SavedName("AdamW")
Adamax = _SavedName("Adamax")
Ftrl = _SavedName("Ftrl")
Lion = _SavedName("Lion")
Nadam = _SavedName("Nadam")
RMSprop = _SavedName("RMSprop")
SGD = _SavedName("SGD")
