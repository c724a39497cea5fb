"""Zab atomic broadcast: pure protocol core, durable transaction log, trio driver."""
