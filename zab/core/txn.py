"""The transaction: the unit Zab broadcasts, logs and delivers.

Records here are slots dataclasses with a field hash but not frozen: a frozen
dataclass's __init__ sets every field through object.__setattr__, about three
times the cost, and these are built for every write. Never change one once built.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, unsafe_hash=True)
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
