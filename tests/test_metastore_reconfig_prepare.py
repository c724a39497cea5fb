"""metastore/core/reconfig.py on hostile and extreme input: any request text gives a Reconfig
whose spec parses, or the ZooKeeper error a client gets; nothing else escapes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from metastore.core import acl as A
from metastore.core.reconfig import prepare_reconfig
from metastore.errors import BadArguments, BadVersion, NewConfigNoQuorum, NoAuth, ReconfigInProgress, ZooKeeperError
from metastore.wire import jute_records as J
from zab.core.ensemble import MAX_SPEC_BYTES, bootstrap, parse_spec

SUPER = [A.SUPER_ID]
CURRENT = bootstrap(frozenset({1, 2, 3}))
LINES = st.sampled_from(["server.4=h:1:2:participant;h:3", "server.5=h:1:1:observer", "server.1=x:9:9",
                         "server.0=h:1:1", "server.4=h:0:1", "server.4=h:1:1:boss", "server.-1=h:1:1",
                         "server.99999999999999999999=h:1:1", "server.4=:1:1", "version=1", "", " , ,",
                         "server.4=h:1:1;h:70000", "server.4=h:1", "garbage"])
TEXT = st.one_of(st.none(), st.text(max_size=80), st.lists(LINES, max_size=5).map(",".join))


@given(TEXT, TEXT, TEXT, st.integers(min_value=-2, max_value=2**64),
       st.frozensets(st.integers(min_value=1, max_value=6)))
def test_any_reconfig_request_is_a_valid_ensemble_or_a_zookeeper_error(joining, leaving, new_members, from_config,
                                                                       synced):
    request = J.ReconfigRequest(joining, leaving, new_members, from_config)
    try:
        txn = prepare_reconfig(CURRENT, False, SUPER, request, synced)
    except ZooKeeperError:
        return
    new = parse_spec(txn.spec)
    assert new.voters and len(new.voters & synced) * 2 > len(new.voters)
    assert len(txn.spec) <= MAX_SPEC_BYTES


def test_the_refusals_in_zookeepers_order():
    add = J.ReconfigRequest("server.4=h:1:1:participant", None, None, -1)
    everyone = frozenset({1, 2, 3, 4})
    for auth, in_progress, request, synced, error in [
            ([], False, add, everyone, NoAuth),
            (SUPER, True, add, everyone, ReconfigInProgress),
            (SUPER, False, J.ReconfigRequest("server.4=h:1:1", None, None, 7), everyone, BadVersion),
            (SUPER, False, J.ReconfigRequest("server.4=h:1", None, None, -1), everyone, BadArguments),
            (SUPER, False, J.ReconfigRequest(None, "1,2,3", None, -1), everyone, BadArguments),  # no participant
            (SUPER, False, J.ReconfigRequest("server.4=h:1:1,server.5=h:2:2", None, None, -1),
             frozenset({1, 4}), NewConfigNoQuorum)]:
        try:
            prepare_reconfig(CURRENT, in_progress, auth, request, synced)
        except ZooKeeperError as e:
            assert isinstance(e, error), (request, e)
        else:
            raise AssertionError(f"{request} was not refused")
    assert parse_spec(prepare_reconfig(CURRENT, False, SUPER, add, everyone).spec).voters == {1, 2, 3, 4}


def test_an_ensemble_too_large_for_every_node_to_decode_is_refused():
    """Its transaction would fail to decode on every node (each would blame its leader and resync
    forever): refused before it is proposed."""
    host = "h" * 60_000
    many = ",".join(f"server.{i}={host}:1:1:observer" for i in range(4, 40))
    try:
        prepare_reconfig(CURRENT, False, SUPER, J.ReconfigRequest(many, None, None, -1), frozenset({1, 2, 3}))
    except BadArguments as e:
        assert "beyond" in str(e)
    else:
        raise AssertionError("a 2 MB ensemble was accepted")
