"""localize."""
