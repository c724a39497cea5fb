from __future__ import annotations

import pytest

from replay.invariants import InvariantViolation
from replay.logs import check_logs_agree, check_logs_converged
from zab.core import zxid as Z
from zab.core.txn import Txn


def t(e: int, c: int, data: bytes = b"x") -> Txn:
    return Txn(Z.make(e, c), 0, 0, data)


def test_agreeing_logs_pass_even_with_different_starts():
    check_logs_converged({1: [t(1, 1), t(1, 2), t(2, 1)], 2: [t(1, 2), t(2, 1)], 3: [t(2, 1)]})


def test_different_bytes_for_one_zxid_are_caught():
    with pytest.raises(InvariantViolation, match="Agreement"):
        check_logs_agree({1: [t(1, 1, b"a")], 2: [t(1, 1, b"b")]})


def test_a_gap_is_caught():
    with pytest.raises(InvariantViolation, match="cannot follow"):
        check_logs_agree({1: [t(1, 1), t(1, 3)]})


def test_a_node_behind_is_caught():
    with pytest.raises(InvariantViolation, match="different zxids"):
        check_logs_converged({1: [t(1, 1), t(1, 2)], 2: [t(1, 1)]})


def test_a_skipped_proposal_left_in_a_log_is_caught():
    # Node 2 kept (1, 3), which the new epoch skipped: it cannot precede (2, 1) where others have (1, 2).
    with pytest.raises(InvariantViolation):
        check_logs_converged({1: [t(1, 2), t(2, 1)], 2: [t(1, 2), t(1, 3), t(2, 1)]})
