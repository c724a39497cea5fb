"""Preparing a reconfig (ZooKeeper 3.5+'s dynamic reconfiguration) on the leader. Pure.

ZooKeeper's rules, checked in its order (PrepRequestProcessor's reconfig case):
- only the super user may change the ensemble (its /zookeeper/config is world-readable only,
  and Quire takes no ACL on it): NoAuth;
- one reconfig at a time: a reconfig prepared and not yet applied makes the next
  ReconfigInProgress;
- `curConfigId` (kazoo's `from_config`), unless -1, must be the committed ensemble's version:
  BadVersion;
- the new ensemble must parse and keep a participant: BadArguments;
- a quorum of the new voters must follow the leader's log right now (`synced`), or the change
  could stall every write until they catch up: NewConfigNoQuorum.

The transaction carries the whole new member list (absolute, as every metastore
transaction); Zab then commits it with a quorum of the old and of the new voters
(zab/core/config.py) and every node adopts it as it applies it.
"""

from __future__ import annotations

from collections.abc import Sequence

from metastore.core import acl as A
from metastore.core import paths
from metastore.errors import BadArguments, BadVersion, NewConfigNoQuorum, NoAuth, ReconfigInProgress
from metastore.core.txn import Reconfig
from metastore.wire import jute_records as J
from zab.core.ensemble import MAX_SPEC_BYTES, Ensemble, EnsembleError, reconfigured

ANY_CONFIG = -1


def prepare_reconfig(current: Ensemble, in_progress: bool, auth: Sequence[A.Id], request: J.ReconfigRequest,
                     synced: frozenset[int]) -> Reconfig:
    """The Reconfig transaction for `request` against the committed ensemble `current`;
    raises the ZooKeeper error the client gets otherwise (see the module doc)."""
    if not any(ident.scheme == A.SUPER_SCHEME for ident in auth):
        raise NoAuth(paths.CONFIG, "only the super user may reconfigure the ensemble (super_digest in cluster.toml)")
    if in_progress:
        raise ReconfigInProgress(None, "another reconfig is not committed yet; retry once it is")
    if request.cur_config_id != ANY_CONFIG and request.cur_config_id != current.version:
        raise BadVersion(paths.CONFIG, f"the ensemble is at version {current.version:x}, "
                                       f"not {request.cur_config_id:x}: read /zookeeper/config again")
    try:
        new = Ensemble.of(0, reconfigured(current, request.joining_servers, request.leaving_servers,
                                          request.new_members))
    except EnsembleError as e:
        raise BadArguments(None, str(e)) from None
    spec = new.spec().encode()
    if len(spec) > MAX_SPEC_BYTES:  # every node must be able to decode it (zab/core/ensemble.py)
        raise BadArguments(None, f"an ensemble of {len(spec)} bytes is beyond {MAX_SPEC_BYTES}")
    voters = new.voters
    if len(voters & synced) * 2 <= len(voters):
        raise NewConfigNoQuorum(None, f"of the new voters {sorted(voters)} only {sorted(voters & synced)} follow "
                                      "the leader now: start and sync the new servers first")
    return Reconfig(spec)
