"""Upstream's ``horovod.runner.util`` helpers (threads, network) that test utilities and users' code import."""
