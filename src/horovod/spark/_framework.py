"""PySpark must be installed (it is imported only when a job runs): a missing one is named with its extra."""
from horovod.common.frameworks import require_installed

require_installed("pyspark", "horovod.spark")
