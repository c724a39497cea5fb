"""The Zab protocol as a pure state machine: events in, actions out (no I/O, clocks or threads)."""
