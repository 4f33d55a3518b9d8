"""Upstream's import path ``horovod.runner.elastic.constants``: constants that programs and tests import."""

RESET_LIMIT_EXCEEDED_MESSAGE = "Horovod was shutdown because number of resets during elastic job exceeded limit: {}"
