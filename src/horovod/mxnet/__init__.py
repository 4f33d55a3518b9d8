"""``horovod.mxnet``: Horovod for MXNet 1.9 (issue 17; being built)."""
