"""cluster.toml loading: defaults, path resolution, and every refusal with a useful message."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterd import config as cfg
from clusterd.config import ConfigError

REPO = Path(__file__).resolve().parent.parent


def node(node_id: int, roles: str = '["voter"]', **overrides: str) -> str:
    """One [[node]] table; ports derived from the id so that nodes never clash by accident."""
    keys = {"id": str(node_id), "host": '"127.0.0.1"', "peer_port": str(30000 + node_id),
            "client_port": str(31000 + node_id), "admin_port": str(32000 + node_id),
            "roles": roles, "data_dir": f'"data/node{node_id}"'}
    if roles is not None and "bookie" in roles:
        keys["bookie_port"] = str(33000 + node_id)
    keys.update(overrides)
    return "[[node]]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items() if v is not None) + "\n"


def three_voters() -> str:
    return node(1) + node(2) + node(3)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def refuse(tmp_path: Path, text: str, *fragments: str) -> str:
    """Load must fail with a message naming the file and every fragment."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        cfg.load(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    return message


# -- what loads -------------------------------------------------------------

def test_the_shipped_cluster_toml_is_three_local_voters_and_bookies() -> None:
    config = cfg.load(REPO / "cluster.toml")
    assert [n.id for n in config.nodes] == [1, 2, 3]
    assert all(n.host == "127.0.0.1" and n.roles == {"voter", "bookie"} for n in config.nodes)
    assert config.node(2).data_dir == REPO / "data" / "node2"
    assert config.voters == {1, 2, 3}


def test_cluster_settings_default_when_absent(tmp_path: Path) -> None:
    config = cfg.load(write(tmp_path, three_voters()))
    assert config.name == "quire"
    assert (config.tick_ms, config.election_finalize_ticks, config.init_limit_ticks) == (50, 3, 100)
    assert (config.sync_limit_ticks, config.ping_interval_ticks) == (10, 2)
    assert (config.sync_window_txns, config.snapshot_every_txns, config.snapshots_retained) == (100_000, 50_000, 3)
    assert (config.max_frame_bytes, config.send_queue_max) == (64 << 20, 10_000)


def test_cluster_settings_are_read(tmp_path: Path) -> None:
    text = '[cluster]\nname = "blue"\ntick_ms = 20\nsync_limit_ticks = 7\nsnapshots_retained = 5\n\n'
    config = cfg.load(write(tmp_path, text + three_voters()))
    assert (config.name, config.tick_ms, config.sync_limit_ticks, config.snapshots_retained) == ("blue", 20, 7, 5)


def test_relative_data_dirs_resolve_against_the_config_folder_not_the_cwd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    path = write(folder, node(1, data_dir='"d/../n1"') + node(2, data_dir=f'"{tmp_path}/abs"') + node(3))
    monkeypatch.chdir(tmp_path)
    config = cfg.load(path.relative_to(tmp_path))
    assert config.path == path
    assert config.node(1).data_dir == folder / "n1"
    assert config.node(2).data_dir == tmp_path / "abs"
    assert config.node(3).data_dir == folder / "data" / "node3"


def test_zab_config_carries_the_ensemble_and_the_timing(tmp_path: Path) -> None:
    text = "[cluster]\ntick_ms = 20\ninit_limit_ticks = 50\n\n"
    text += node(1) + node(2) + node(3) + node(4, '["observer"]') + node(5, '["bookie"]')
    config = cfg.load(write(tmp_path, text))
    zab = config.zab_config(4)
    assert (zab.my_id, zab.voters, zab.observers) == (4, {1, 2, 3}, {4})
    assert (zab.tick_ms, zab.init_limit_ticks) == (20, 50)
    assert config.peer_addresses() == {i: ("127.0.0.1", 30000 + i) for i in (1, 2, 3, 4)}


def test_a_bookie_only_node_is_allowed_but_has_no_zab_peer(tmp_path: Path) -> None:
    config = cfg.load(write(tmp_path, three_voters() + node(4, '["bookie"]')))
    assert not config.node(4).in_ensemble
    with pytest.raises(ConfigError, match="neither a voter nor an observer"):
        config.zab_config(4)


def test_to_toml_round_trips(tmp_path: Path) -> None:
    text = '[cluster]\nname = "q\\"x"\n\n' + node(1, '["voter", "bookie"]') + node(2, '["observer"]')
    config = cfg.load(write(tmp_path, text + node(3) + node(4)))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "cluster.toml").write_text(cfg.to_toml(config, tmp_path))
    again = cfg.load(copy / "cluster.toml")
    assert again.nodes != config.nodes  # relative dirs now resolve against the copy's folder...
    assert cfg.parse(cfg.to_toml(config, tmp_path), config.path) == config  # ...but not here


def test_unknown_node_id_is_a_config_error(tmp_path: Path) -> None:
    config = cfg.load(write(tmp_path, three_voters()))
    with pytest.raises(ConfigError, match="no \\[\\[node\\]\\] with id 9"):
        config.node(9)


# -- what is refused --------------------------------------------------------

def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        cfg.load(tmp_path / "nope.toml")


def test_not_toml(tmp_path: Path) -> None:
    refuse(tmp_path, "[[node]\nid = 1\n", "not valid TOML")


@pytest.mark.parametrize("where, text, key", [
    ("top level", "nodes = 3\n" + three_voters(), "'nodes'"),
    ("[cluster]", "[cluster]\ntick = 5\n\n" + three_voters(), "'tick'"),
    ("[[node]] #2 (id 2)", node(1) + node(2, journal_port="4000") + node(3), "'journal_port'"),
])
def test_unknown_keys_are_refused_at_every_level(tmp_path: Path, where: str, text: str, key: str) -> None:
    refuse(tmp_path, text, where, f"unknown key {key}")


def test_a_typo_gets_a_suggestion(tmp_path: Path) -> None:
    refuse(tmp_path, "[cluster]\ntick_msec = 5\n\n" + three_voters(), "did you mean 'tick_ms'?")


def test_no_nodes(tmp_path: Path) -> None:
    refuse(tmp_path, '[cluster]\nname = "x"\n', "missing required key 'node'")


@pytest.mark.parametrize("missing", cfg.NODE_KEYS)
def test_every_node_key_is_required(tmp_path: Path, missing: str) -> None:
    roles = None if missing == "roles" else '["voter", "bookie"]'
    text = node(1) + node(2, roles, **({} if missing == "roles" else {missing: None})) + node(3)
    refuse(tmp_path, text, "[[node]] #2", f"missing required key {missing!r}")


def test_a_bookie_journal_dir_is_optional_resolves_like_data_dir_and_round_trips(tmp_path: Path) -> None:
    text = node(1, '["voter", "bookie"]', bookie_journal_dir='"disk2/journal1"') + node(2, '["voter", "bookie"]')
    config = cfg.load(write(tmp_path, text + node(3)))
    assert config.node(1).bookie_journal_dir == tmp_path / "disk2" / "journal1"
    assert config.node(2).bookie_journal_dir is None
    assert cfg.parse(cfg.to_toml(config, tmp_path), config.path) == config


@pytest.mark.parametrize("text, problem", [
    (node(1, bookie_journal_dir='"j"') + node(2) + node(3), "only a node with the 'bookie' role has a bookie journal"),
    (node(1, '["voter", "bookie"]', bookie_journal_dir='"data/node1/bookie/j"') + node(2) + node(3),
     "inside the bookie's own directory"),
    (node(1, '["voter", "bookie"]', bookie_journal_dir='"j"')
     + node(2, '["voter", "bookie"]', bookie_journal_dir='"j"') + node(3), "duplicate bookie_journal_dir"),
    (node(1, '["voter", "bookie"]', bookie_journal_dir='" "') + node(2) + node(3), "must not be empty"),
    (node(1, '["voter", "bookie"]', bookie_journal_dir="3") + node(2) + node(3), "expected a string"),
])
def test_bad_bookie_journal_dirs(tmp_path: Path, text: str, problem: str) -> None:
    refuse(tmp_path, text, "bookie_journal_dir" if "duplicate" in problem else "[[node]] #", problem)


def test_only_bookies_have_a_bookie_port(tmp_path: Path) -> None:
    refuse(tmp_path, node(1) + node(2, bookie_port="4000") + node(3), "[[node]] #2", "only a node with the 'bookie' role")
    config = cfg.load(write(tmp_path, node(1, '["voter", "bookie"]') + node(2) + node(3)))
    assert config.bookie_addresses() == {1: ("127.0.0.1", 33001)}


@pytest.mark.parametrize("key, value, problem", [
    ("id", '"2"', "expected an integer, got string '2'"),
    ("id", "true", "expected an integer, got boolean True"),
    ("id", "0", "must be from 1 to 255, got 0"),
    ("id", "256", "must be from 1 to 255"),
    ("peer_port", "2.5", "expected an integer, got float 2.5"),
    ("client_port", "70000", "must be from 1 to 65535"),
    ("host", "1", "expected a string"),
    ("host", '""', "must not be empty"),
    ("roles", '"voter"', "expected an array, got string"),
    ("roles", "[]", "at least one role"),
    ("roles", '["voter", "voter"]', "listed twice"),
    ("roles", '["votr"]', "unknown role 'votr' (did you mean 'voter'?)"),
    ("roles", '["voter", "observer"]', "either a voter or an observer"),
    ("data_dir", "[]", "expected a string, got array"),
])
def test_bad_node_values(tmp_path: Path, key: str, value: str, problem: str) -> None:
    refuse(tmp_path, node(1) + node(2, **{key: value}) + node(3), "[[node]] #2", f"key {key!r}", problem)


@pytest.mark.parametrize("text, problem", [
    ('[cluster]\nname = 3\n', "key 'name': expected a string, got integer 3"),
    ("[cluster]\ntick_ms = 0\n", "key 'tick_ms': must be at least 1, got 0"),
    ('[cluster]\nsnapshots_retained = "3"\n', "key 'snapshots_retained': expected an integer"),
    ("cluster = 5\n", "key 'cluster': expected a table, got integer 5"),
    ("[cluster]\nping_interval_ticks = 10\nsync_limit_ticks = 10\n",
     "ping_interval_ticks must be smaller than sync_limit_ticks"),
    ("[cluster]\nbookie_entry_log_bytes = 100\n", "key 'bookie_entry_log_bytes': must be at least 4096"),
    ("[cluster]\nbookie_disk_usage_percent = 101\n", "key 'bookie_disk_usage_percent': must be from 1 to 100"),
])
def test_bad_cluster_values(tmp_path: Path, text: str, problem: str) -> None:
    refuse(tmp_path, text + "\n" + three_voters(), problem)


def test_node_must_be_a_table_array(tmp_path: Path) -> None:
    refuse(tmp_path, "node = 1\n", "key 'node': expected an array")
    refuse(tmp_path, "node = [1]\n", "[[node]] #1: expected a table")


def test_duplicate_ids(tmp_path: Path) -> None:
    refuse(tmp_path, node(1) + node(2) + node(3, id="2"), "duplicate id 2", "node 2")


@pytest.mark.parametrize("overrides, clash", [
    ({"peer_port": "30001"}, "127.0.0.1:30001"),            # node 2's peer port is node 1's
    ({"admin_port": "31001"}, "127.0.0.1:31001"),           # across kinds of port
    ({"client_port": "30002"}, "127.0.0.1:30002"),          # within one node
])
def test_duplicate_addresses_across_all_ports_of_all_nodes(
        tmp_path: Path, overrides: dict[str, str], clash: str) -> None:
    refuse(tmp_path, node(1) + node(2, **overrides) + node(3), f"duplicate address {clash}")


def test_the_same_port_on_different_hosts_is_fine(tmp_path: Path) -> None:
    cfg.load(write(tmp_path, node(1) + node(2, host='"127.0.0.2"', peer_port="30001") + node(3)))


def test_duplicate_data_dirs(tmp_path: Path) -> None:
    refuse(tmp_path, node(1) + node(2, data_dir='"./data/node1"') + node(3), "duplicate data_dir")


@pytest.mark.parametrize("text, problem", [
    (node(1) + node(2), "2 voters (nodes [1, 2]): use an odd number"),
    (node(1) + node(2) + node(3) + node(4, '["voter", "bookie"]'), "4 voters"),
    (node(1, '["observer"]') + node(2, '["bookie"]'), "no node has the role 'voter'"),
])
def test_voter_count_must_be_odd_and_nonzero(tmp_path: Path, text: str, problem: str) -> None:
    refuse(tmp_path, text, problem)


def test_one_voter_is_a_valid_ensemble(tmp_path: Path) -> None:
    config = cfg.load(write(tmp_path, node(1) + node(2, '["observer"]')))
    assert config.zab_config(1).voters == {1}


def test_four_letter_words_are_an_allow_list_of_known_words(tmp_path):
    from clusterd.config import ConfigError, load
    shipped = (Path(__file__).resolve().parent.parent / "cluster.toml").read_text()
    path = tmp_path / "cluster.toml"
    path.write_text(shipped.replace("[cluster]\n", '[cluster]\nfour_letter_words = "ruok, srvr"\n', 1))
    assert load(path).four_letter_word_set == {"ruok", "srvr"}
    path.write_text(shipped.replace("[cluster]\n", '[cluster]\nfour_letter_words = "ruok,kill"\n', 1))
    with pytest.raises(ConfigError, match="four_letter_words.*kill"):
        load(path)


def test_bind_host_defaults_to_host_and_is_where_listeners_bind(tmp_path: Path) -> None:
    """bind_host (ZooKeeper's clientPortAddress / quorumListenOnAllIPs): listeners bind it while the
    others keep dialing host, as behind NAT or in a container."""
    config = cfg.load(write(tmp_path, node(1, host='"10.0.0.1"', bind_host='"0.0.0.0"')
                            + node(2, host='"10.0.0.2"', bind_host='"::"')
                            + node(3, host='"node3.example.net"')))
    assert [(n.host, n.bind_host) for n in config.nodes] == [
        ("10.0.0.1", "0.0.0.0"), ("10.0.0.2", "::"), ("node3.example.net", "node3.example.net")]
    assert config.peer_addresses()[1] == ("10.0.0.1", 30001)  # what peers dial: host, never the bind address
    text = cfg.to_toml(config, tmp_path)
    assert text.count("bind_host") == 2  # written only where it differs from host
    assert cfg.parse(text, config.path) == config


@pytest.mark.parametrize("value, problem", [
    ('""', "'' is neither an IP address nor a host name"),
    ('"10.0.0.1:2181"', "the ports are the *_port keys"),
    ('"[::1]"', "neither an IP address nor a host name"),
    ('"*"', '"0.0.0.0" or "::" binds every address'),
    ('"bad host"', "neither an IP address nor a host name"),
    ("0", "expected a string, got integer 0"),
])
def test_bad_bind_hosts_are_refused(tmp_path: Path, value: str, problem: str) -> None:
    refuse(tmp_path, node(1) + node(2, bind_host=value) + node(3), "[[node]] #2", "key 'bind_host'", problem)
