"""Framework-independent core: basics, op layer, engine, negotiation."""
