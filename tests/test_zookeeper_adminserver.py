"""Quire's four-letter words and AdminServer commands held against a live Apache ZooKeeper 3.8.0
(Debian's package, with its AdminServer on Jetty 9: tests/zookeeper_fixtures.py), both answering
a session that holds an ephemeral and a watch (issue 20). What a ZooKeeper tool parses must parse
the same on both: Metricbeat's srvr, cons and mntr readers, each word's keys and value types, the
AdminServer's command names, keys and JSON types. What Quire does not answer is listed below,
each with its reason (docs/operations.md says so too). tests/test_metrics.py checks the figures
themselves on a real cluster."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from cluster_fixtures import Cluster, ensemble, kazoo_session, leader_of, wait_for  # noqa: F401 (ensemble is a fixture)
from zookeeper_fixtures import four_letter, http_get, live_zookeeper

pytestmark = pytest.mark.multiprocess

# Metricbeat's ZooKeeper module (metricbeat/module/zookeeper): cons lines (connection metricset),
# and srvr's first line (server metricset: the version up to the comma, the build after "built on").
METRICBEAT_CONS = re.compile(r"/(?P<ip>.*):(?P<port>\d+)\[(?P<interest_ops>\d*)]\(queued=(?P<queued>\d*),"
                             r"recved=(?P<received>\d*),sent=(?P<sent>\d*)\)")
METRICBEAT_VERSION = re.compile(r":\s(.*),")
METRICBEAT_BUILT = re.compile(r"built on (.*)")
# What the live ZooKeeper prints that Quire does not, each for a reason.
NOT_PRINTED = {
    # No JVM: Quire says python.version instead.
    "envi": {"java.version", "java.vendor", "java.home", "java.class.path", "java.library.path", "java.io.tmpdir",
             "java.compiler", "os.memory.free", "os.memory.max", "os.memory.total"},
    # Expiry buckets, of sessions (a standalone ZooKeeper's or its leader's) and of NIO connections:
    # Quire expires sessions by ticks and has no connection expiry queue. Its dump lists the
    # sessions with their timeouts as a ZooKeeper follower does (Global Sessions(N)).
    "dump": {"Session Sets (N)/(N):", "Connections dump:", "Connections Sets (N)/(N):"},
}
# mntr keys of the live ZooKeeper Quire answers too, whose value must have the same type (an
# integer where ZooKeeper prints one: older Metricbeats parse latencies as integers).
MNTR_SHARED = ["zk_version", "zk_server_state", "zk_avg_latency", "zk_max_latency", "zk_min_latency",
               "zk_packets_received", "zk_packets_sent", "zk_num_alive_connections", "zk_outstanding_requests",
               "zk_znode_count", "zk_watch_count", "zk_ephemerals_count", "zk_approximate_data_size",
               "zk_open_file_descriptor_count", "zk_max_file_descriptor_count", "zk_global_sessions", "zk_uptime"]


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory) -> Iterator[tuple[int, int]]:
    with live_zookeeper(tmp_path_factory.mktemp("zookeeper-reference")) as ports:
        yield ports


@pytest.fixture(scope="module")
def both(ensemble: Cluster, zookeeper: tuple[int, int]) -> Iterator[dict]:  # noqa: F811
    """The leader's and the live ZooKeeper's ports, each with a session holding /cmp-eph (an
    ephemeral) and a data watch on it, open for the module's tests."""
    assert wait_for(lambda: any(r["role"] == "leader" for r in ensemble.status()), 30)
    leader = ensemble.config.node(leader_of(ensemble))
    reference = KazooClient(f"127.0.0.1:{zookeeper[0]}")
    reference.start(timeout=30)
    try:
        with kazoo_session(ensemble, only=leader.id) as ours:
            for client in (reference, ours):
                client.create("/cmp-eph", b"x", ephemeral=True)
                client.get("/cmp-eph", watch=lambda event: None)
            yield {"zk": zookeeper[0], "zk_admin": zookeeper[1], "quire": leader.client_port,
                   "quire_admin": leader.admin_port, "sessions": {"zk": reference.client_id[0],
                                                                  "quire": ours.client_id[0]}}
    finally:
        reference.stop()
        reference.close()


def words(both: dict, word: str) -> tuple[str, str]:
    """(ZooKeeper's, Quire's) answer to `word`."""
    return four_letter(both["zk"], word), four_letter(both["quire"], word)


def kind(value: str) -> str:
    """A printed value's type as a parser sees it: int, float or str."""
    return "int" if re.fullmatch(r"-?\d+", value) else "float" if re.fullmatch(r"-?\d+\.\d+", value) else "str"


def rows(text: str, sep: str) -> dict[str, str]:
    return dict(line.split(sep, 1) for line in text.splitlines() if sep in line)


def test_mntr_keys_and_value_types_are_zookeepers(both: dict) -> None:
    zk, quire = (rows(text, "\t") for text in words(both, "mntr"))
    for key in MNTR_SHARED:
        assert key in zk and key in quire, key
        assert kind(quire[key]) == kind(zk[key]) or {kind(quire[key]), kind(zk[key])} == {"int", "float"} \
            and key == "zk_avg_latency", (key, zk[key], quire[key])  # avg is "0" or "22.3333" on ZooKeeper
    assert kind(quire["zk_min_latency"]) == kind(quire["zk_max_latency"]) == "int"


def test_srvr_and_stat_parse_as_zookeepers(both: dict) -> None:
    for word in ("srvr", "stat"):
        zk, quire = words(both, word)
        for text in (zk, quire):  # Metricbeat's server metricset fails the event without these
            first = text.splitlines()[0]
            assert METRICBEAT_VERSION.search(first) and METRICBEAT_BUILT.search(first), first
        zk_rows, quire_rows = rows(zk, ": "), rows(quire, ": ")
        assert set(zk_rows) == set(quire_rows), (word, zk_rows, quire_rows)
        for key, value in zk_rows.items():
            assert kind(quire_rows[key]) == kind(value) or key == "Mode", (word, key, value, quire_rows[key])
        assert [kind(v) for v in quire_rows["Latency min/avg/max"].split("/")][::2] == ["int", "int"]
        if word == "stat":  # the client list, brief: every line is one Metricbeat's cons reader takes
            for text in (zk, quire):
                clients = text.split("Clients:\n", 1)[1].split("\n\n", 1)[0].splitlines()
                assert clients and all(METRICBEAT_CONS.search(line) for line in clients), text


def test_cons_lines_are_zookeepers(both: dict) -> None:
    zk, quire = words(both, "cons")
    for text, session in ((zk, both["sessions"]["zk"]), (quire, both["sessions"]["quire"])):
        lines = [line for line in text.splitlines() if line.strip()]
        assert all(line.startswith(" /") for line in lines), text  # Java's InetSocketAddress
        assert any(METRICBEAT_CONS.search(line) for line in lines), text  # the asking connection: no session
        assert f"sid=0x{session:x}," in text, text
    fields = [[kv.split("=")[0] for kv in re.search(r"\((.*)\)", line)[1].split(",")]
              for text in (zk, quire) for line in text.splitlines() if "sid=" in line]
    assert all(f == fields[0] for f in fields), fields
    quire_line = next(line for line in quire.splitlines() if f"sid=0x{both['sessions']['quire']:x}," in line)
    assert re.search(r",to=(\d+),", quire_line)[1] != "0", quire_line  # the session's timeout


def test_conf_and_envi_have_zookeepers_keys(both: dict) -> None:
    for word in ("conf", "envi"):
        zk, quire = (rows(text, "=") for text in words(both, word))
        missing = set(zk) - set(quire) - NOT_PRINTED.get(word, set())
        assert not missing, (word, sorted(missing))
        for key in set(zk) & set(quire):
            if word == "conf":
                assert kind(quire[key]) == kind(zk[key]), (key, zk[key], quire[key])
        assert words(both, word)[1].startswith("Environment:\n") or word == "conf"


def test_small_words_answer_as_zookeepers(both: dict) -> None:
    for word in ("ruok", "isro"):
        zk, quire = words(both, word)
        assert zk == quire, (word, zk, quire)
    zk, quire = words(both, "wchs")
    shape = r"\d+ connections watching \d+ paths\nTotal watches:\d+\n"
    assert re.fullmatch(shape, zk) and re.fullmatch(shape, quire), (zk, quire)
    zk, quire = words(both, "dump")
    headers = {line for line in zk.splitlines() if line.endswith(":") and not line.startswith(("0x", "\t"))
               and " expire at " not in line}
    headers = {re.sub(r"\(\d+\)", "(N)", h) for h in headers} - NOT_PRINTED["dump"]
    quire_headers = {re.sub(r"\(\d+\)", "(N)", line) for line in quire.splitlines()}
    assert headers <= quire_headers and "Global Sessions(N):" in quire_headers, (sorted(headers), quire)
    for text, session in ((zk, both["sessions"]["zk"]), (quire, both["sessions"]["quire"])):
        assert f"0x{session:x}:\n\t/cmp-eph\n" in text, text


def test_admin_command_json_types_are_zookeepers(both: dict) -> None:
    """Every command Quire serves is one of ZooKeeper's; a value ZooKeeper answers as a JSON
    integer Quire answers as one too (a float where ZooKeeper has a float or an integer)."""
    listing = http_get(both["zk_admin"], "/commands") or ""
    zookeeper_names = set(re.findall(r"/commands/([a-z_]+)", listing))
    served = json.loads(http_get(both["quire_admin"], "/commands") or "{}")["commands"]
    assert "dirs" in served and set(served) <= zookeeper_names, sorted(set(served) - zookeeper_names)
    for name in served:
        theirs = json.loads(http_get(both["zk_admin"], f"/commands/{name}") or "{}")
        mine = json.loads(http_get(both["quire_admin"], f"/commands/{name}") or "{}")
        assert mine["command"] == name and mine["error"] is None, (name, mine)
        for outer in (theirs, theirs.get("server_stats", {})):
            inner = mine if outer is theirs else mine.get("server_stats", {})
            for key, value in outer.items():
                if isinstance(value, int) and not isinstance(value, bool) and key in inner and key != "avg_latency":
                    assert type(inner[key]) is int, (name, key, value, inner[key])
    assert json.loads(http_get(both["quire_admin"], "/commands/server_stats"))["version"] == \
        rows(four_letter(both["quire"], "mntr"), "\t")["zk_version"]


# What Quire does not answer of ZooKeeper's JSON, each for a reason (docs/operations.md says so).
NOT_ANSWERED = {
    "environment": {"java.class.path", "java.compiler", "java.home", "java.io.tmpdir", "java.library.path",
                    "java.vendor", "java.version", "os.memory.free", "os.memory.max", "os.memory.total"},  # no JVM
    # Not kept: response buffer sizes, slow fsyncs, mTLS connection counts, the stats provider.
    "server_stats": {"client_response", "client_response.last_buffer_size", "client_response.min_buffer_size",
                     "client_response.max_buffer_size", "server_stats.client_response_stats",
                     "server_stats.fsync_threshold_exceed_count", "server_stats.non_mtlslocal_conn_count",
                     "server_stats.non_mtlsremote_conn_count", "server_stats.provider_null"},
    # Per connection, Quire keeps counts, not its last operation, cxid, zxid or latencies.
    "connections": {"connections.interest_ops", "connections.last_operation", "connections.established",
                    "connections.last_cxid", "connections.last_zxid", "connections.last_response_time",
                    "connections.last_latency", "connections.min_latency", "connections.avg_latency",
                    "connections.max_latency"},
}
NOT_ANSWERED["stats"] = NOT_ANSWERED["server_stats"] | NOT_ANSWERED["connections"]


def json_keys(answer: dict) -> set[str]:
    """Top-level keys, and `outer.inner` for the keys of a nested object or of a list's first object."""
    keys = set(answer)
    for outer, value in answer.items():
        inner = value[0] if isinstance(value, list) and value and isinstance(value[0], dict) else value
        if isinstance(inner, dict) and outer not in ("session_id_to_ephemeral_paths", "expiry_time_to_session_ids",
                                                     "session_timeouts_ms"):
            keys |= {f"{outer}.{k}" for k in inner}
    return keys


def test_admin_commands_answer_at_least_zookeepers_keys(both: dict) -> None:
    """Each command Quire serves answers every key the live ZooKeeper's does (NOT_ANSWERED lists what
    it does not, and why), with the same JSON types; monitor: Metricbeat's keys, as numbers where
    ZooKeeper's are."""
    served = json.loads(http_get(both["quire_admin"], "/commands") or "{}")["commands"]
    for name in served:
        theirs = json.loads(http_get(both["zk_admin"], f"/commands/{name}") or "{}")
        mine = json.loads(http_get(both["quire_admin"], f"/commands/{name}") or "{}")
        if name == "monitor":  # ZooKeeper's has ~400 keys of its JVM's request processors
            for key in MNTR_SHARED:
                assert key[3:] in theirs and key[3:] in mine, key
                assert isinstance(mine[key[3:]], (int, float)) == isinstance(theirs[key[3:]], (int, float)), key
            continue
        missing = json_keys(theirs) - json_keys(mine) - NOT_ANSWERED.get(name, set())
        assert not missing, f"{name}: {sorted(missing)}"
        for key in json_keys(theirs) & json_keys(mine):
            if "." not in key and theirs[key] is not None and mine[key] is not None:
                assert type(mine[key]) is type(theirs[key]) or {type(mine[key]), type(theirs[key])} <= {int, float}, \
                    (name, key, mine[key], theirs[key])
    conns = json.loads(http_get(both["quire_admin"], "/commands/connections") or "{}")["connections"]
    assert any(c["session_id"] == both["sessions"]["quire"] for c in conns)  # a JSON number, as ZooKeeper's
