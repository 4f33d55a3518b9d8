"""``horovod.jax``: Horovod for JAX (issue 17; being built)."""
