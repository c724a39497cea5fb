"""The transaction: the unit Zab broadcasts, logs and delivers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Txn:
    """One idempotent transaction (paper section 1), as the leader produced it.

    `session_id` and `cxid` identify the client request the transaction answers
    (0 for transactions no client waits on); the node holding that client's
    connection uses them to answer it once the transaction is delivered.
    `data` is opaque to Zab: the state machine's own encoding.
    """

    zxid: int
    session_id: int
    cxid: int
    data: bytes
