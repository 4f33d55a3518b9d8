"""The framework this binding runs on, imported first: a missing one is named with the extra that installs it."""
from horovod.common.frameworks import require

FRAMEWORK = require("mxnet", "horovod.mxnet")
