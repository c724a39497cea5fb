"""Errors of the zab package: what a caller of the driver may see."""

from __future__ import annotations


class ZabError(Exception):
    """Base of every error raised by the zab package to its callers."""


class NoLeader(ZabError):
    """No established leader is reachable now: retry after a short wait."""


class OutcomeUnknown(ZabError):
    """The leader changed while the request was in flight: it may or may not have
    committed. Read back the state before retrying a non-idempotent request."""


class ProtocolError(ZabError):
    """A peer sent bytes or a message that the protocol does not allow here."""


class FrameError(ProtocolError):
    """A peer frame could not be decoded (truncated, oversized, corrupt, unknown type)."""
