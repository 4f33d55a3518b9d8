"""Compatibility names for upstream's ``horovod.runner.http`` (its KV store was plain HTTP; ours is authenticated)."""
