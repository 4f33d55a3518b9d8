"""Small helpers of the launcher: flags to env vars, hosts and slots, env filtering, networking, processes."""
