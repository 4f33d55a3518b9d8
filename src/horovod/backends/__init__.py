"""Data planes: how bytes move between ranks once the coordinator has said what to run."""
