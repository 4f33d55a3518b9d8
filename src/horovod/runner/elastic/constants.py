"""Constants of upstream's elastic runner that programs and tests import (upstream's module path)."""

RESET_LIMIT_EXCEEDED_MESSAGE = "Horovod was shutdown because number of resets during elastic job exceeded limit: {}"
