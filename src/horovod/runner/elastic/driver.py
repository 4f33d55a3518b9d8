"""Constants of upstream's elastic driver that tooling imports; the driver itself is not available yet."""

DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
ELASTIC_TIMEOUT_SECS = 600
