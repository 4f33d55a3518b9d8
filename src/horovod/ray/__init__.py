"""Horovod on Ray (issue 16): ``RayExecutor`` and its elastic mode."""
