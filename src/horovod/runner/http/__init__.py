"""Upstream's import path ``horovod.runner.http``: its names, on the authenticated KV store (upstream's store
was plain HTTP)."""
