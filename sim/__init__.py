"""Deterministic whole-cluster simulator: seeded network, disk and clock driving the pure cores."""
