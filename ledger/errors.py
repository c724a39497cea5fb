"""The ledger SDK's typed errors: what an application can get back, and what to do about it.

Two families matter to a caller:

- OutcomeUnknown: an append was sent but not acknowledged, and the ledger is no
  longer writable by us (fenced by a recoverer, closed, out of bookies). The
  entry may or may not be in the ledger once it is recovered and closed (seed
  001: "LedgerFenced should be treated like a timeout"). Open the ledger with
  recovery and read its end to find out.
- everything else: the request was refused and did nothing (a closed ledger, a
  wrong password, a metadata conflict, an entry that no replica could serve).

The ledger package never raises bookie.errors classes at the application: the
edge turns a bookie's per-request outcome into events for the pure operations,
and the operations answer with these.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base of every error the ledger SDK reports."""


class OutcomeUnknown(LedgerError):
    """The append may or may not be in the ledger: recover the ledger (open with recover=True) and read
    its last entries to find out. Never retry the same payload blindly: it could end up twice."""


class LedgerFenced(OutcomeUnknown):
    """Another client fenced the ledger to recover it (seed 001): this handle can no longer write.
    Appends in flight have an unknown outcome; open the ledger with recovery to learn its last entry."""

    def __init__(self, ledger_id: int, detail: str = "") -> None:
        super().__init__(f"ledger {ledger_id} was fenced by a recoverer{': ' + detail if detail else ''}; "
                         "appends in flight may or may not be in it: open it with recover=True and read its end")
        self.ledger_id = ledger_id


class NotEnoughBookies(OutcomeUnknown):
    """No bookie could replace a failed one (or too few are registered to create the ledger).
    Start more bookies, or create the ledger with a smaller ensemble."""


class LedgerClosed(LedgerError):
    """The ledger is CLOSED: it takes no more appends. Create a new ledger to go on writing."""

    def __init__(self, ledger_id: int, detail: str = "") -> None:
        super().__init__(f"ledger {ledger_id} is closed{': ' + detail if detail else ''}; "
                         "create a new ledger to go on writing")
        self.ledger_id = ledger_id


class LedgerClosedUnderWriter(LedgerClosed, OutcomeUnknown):
    """The ledger was closed by someone else (a recoverer) while our appends were in flight: their
    outcome is unknown; read the closed ledger's last entry to find out."""


class LedgerInRecovery(LedgerError):
    """A recoverer has the ledger IN_RECOVERY: a writer's close fails (seed 001). Wait for the recovery
    to close the ledger, or run one yourself (open with recover=True)."""


class CloseConflict(LedgerError):
    """Someone else closed the ledger at a different last entry than the one this writer acknowledged
    (seed 001, closing as a writer). Trust the ledger's metadata: reopen it and read its last entry."""


class MetadataConflict(LedgerError):
    """The ledger's metadata changed since it was read (a compare-and-set lost, BadVersion).
    The operations handle this themselves by re-reading; the manager raises it."""


class NoSuchLedger(LedgerError):
    """No ledger with this id exists in the metadata store (never created, or deleted)."""


class NotLedgerOwner(LedgerError):
    """The ledger belongs to another identity (the one whose session created it, ledger/manager.py):
    only it and the cluster's daemons may write, recover or delete it. Authenticate the ledger client's
    MetaClient as that identity (auth=..., or its TLS client certificate)."""


class WrongPassword(LedgerError):
    """The password does not match the ledger's: use the password the ledger was created with."""


class EntryNotAvailable(LedgerError):
    """No replica of the entry could serve it (down, missing it, or corrupt): retry later, when the
    bookies of its write quorum are back."""

    def __init__(self, ledger_id: int, entry_id: int, detail: str = "") -> None:
        super().__init__(f"ledger {ledger_id} entry {entry_id}: no replica could serve it"
                         f"{' (' + detail + ')' if detail else ''}; retry when its bookies are back")
        self.ledger_id = ledger_id
        self.entry_id = entry_id


class ReadBeyondLastConfirmed(LedgerError):
    """The requested entries are past what is known to be confirmed (the LAC of an open ledger, or the
    last entry of a closed one). Read the LAC again, or tail the ledger."""


class EntryTooLarge(LedgerError):
    """A bookie refused the entry as too large: split the payload."""


class LedgerStateError(LedgerError):
    """The handle cannot do this in its state (appending to a handle that failed or is closing)."""
