"""Invariant checkers over replicated histories, shared by the simulator, tests and verifiers."""
