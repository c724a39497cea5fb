"""The code layout rules of ARCHITECTURE.md and STYLE.md, enforced.

Pure modules (protocol cores, codecs, invariant checkers, the simulator) never
import I/O, clocks, threads or global randomness; modules and functions stay
small enough to read.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ["edge", "zab", "metastore", "bookie", "ledger", "stream", "tablespace", "clusterd", "replay", "sim"]

# Edge modules: the only ones allowed to touch sockets, files, clocks and threads.
EDGE = {
    "edge/files.py", "edge/long_lived.py", "edge/group_commit.py", "edge/outbox.py", "edge/segments.py", "edge/sockets.py", "edge/tls_stream.py",
    "edge/http11.py",
    "edge/trio_thread.py",
    "zab/edge/driver.py", "zab/edge/transport.py", "zab/edge/log_writer.py", "zab/edge/snapshotter.py",
    "zab/storage/txnlog.py", "zab/storage/snapshot.py", "zab/storage/epochfile.py", "zab/storage/recovery.py",
    "zab/storage/ensemble_file.py",
    "bookie/journal.py", "bookie/entrylog.py", "bookie/storage.py", "bookie/storage_commit.py",
    "bookie/storage_recovery.py",
    "bookie/service.py", "bookie/service_connection.py", "bookie/client.py", "bookie/registration.py",
    "ledger/manager.py", "ledger/client.py", "ledger/client_sync.py", "ledger/driver.py", "ledger/handles.py",
    "ledger/service_loop.py", "ledger/autorecovery/tasks.py", "ledger/autorecovery/auditor.py",
    "ledger/autorecovery/worker.py",
    # The Spark verifiers' readers and entry points (files, the JVM, clocks for progress).
    "replay/spark_session.py", "replay/spark_source.py", "replay/spark_replay.py", "replay/verify_zab.py",
    "replay/spark_ledger.py", "replay/verify_ledgers.py", "replay/spark_stream.py", "replay/verify_logs.py",
    "replay/verify_tables.py", "replay/spark_datasources.py",
    # Named logs: the namespace in the metastore, the writer and the readers (ledgers, clocks, trio).
    "stream/namespace.py", "stream/writer.py", "stream/reader.py",
    # The table service: a replica, its HTTP server and client (sockets, trio).
    "tablespace/replica.py", "tablespace/server.py", "tablespace/http.py", "tablespace/client.py",
}
IMPURE = {"trio", "socket", "time", "threading", "os", "subprocess", "asyncio", "select", "pathlib", "shutil"}
MAX_MODULE_LINES = 500
# Modules over MAX_MODULE_LINES when the cap came (issue 21), each at most its size then. The list
# may only shrink: a module split below the cap must leave it (test_long_module_exceptions_only_shrink).
LONG_MODULES = {
    "bookie/client.py": 559,
    "metastore/client/session.py": 582,
    "metastore/edge/service.py": 537,
    "zab/storage/txnlog.py": 528,
}
MAX_FUNCTION_LINES = 70


def modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


PURE = [p for pkg in ("edge", "zab", "replay", "sim", "ledger", "stream", "tablespace") for p in modules(pkg) if str(p.relative_to(REPO)) not in EDGE]
PURE += modules("metastore/core") + modules("metastore/wire")  # the znode tree's rules and the metastore's bytes
PURE += [REPO / "bookie/protocol.py"]  # the bookie wire codec: bytes in, messages out
PURE += [REPO / "bookie/ledger_rules.py"]  # the bookie's rules: state + request -> outcome + journal records


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(REPO)))
def test_pure_modules_do_no_io(path: Path):
    bad = imported_roots(path) & IMPURE
    assert not bad, f"{path.relative_to(REPO)} is a pure module but imports {sorted(bad)}"


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(REPO)))
def test_pure_modules_take_randomness_as_input(path: Path):
    rel = str(path.relative_to(REPO))
    if "random" in imported_roots(path):
        # Only the simulator may create the one seeded generator; nothing calls the global one.
        assert rel.startswith("sim/"), f"{rel} imports random: take a random.Random as a parameter"
        text = path.read_text()
        assert "random.random(" not in text and "random.randint(" not in text, f"{rel} uses global randomness"


def test_the_edge_layer_is_below_every_service():
    """edge/ is the I/O the services share: it imports none of Quire's other packages."""
    for path in modules("edge"):
        above = imported_roots(path) & (set(PACKAGES) - {"edge"})
        assert not above, f"{path.relative_to(REPO)} imports {sorted(above)}: edge/ sits below them"


def test_cores_never_import_the_daemon():
    for pkg in ("zab", "replay", "sim"):
        for path in modules(pkg):
            assert "clusterd" not in imported_roots(path), f"{path.relative_to(REPO)} imports clusterd"


# Which of Quire's packages each package may import (ARCHITECTURE.md, "Import directions"): each
# only the ones below it. clusterd, the daemon, wires them all.
MAY_IMPORT = {
    "edge": set(),
    "zab": {"edge"},
    "metastore": {"zab", "edge"},
    "bookie": {"metastore", "edge"},  # its registration in the metastore, through the client
    "ledger": {"bookie", "metastore", "edge"},
    "stream": {"ledger", "metastore", "edge"},  # seed 004: named logs stand on ledgers and the metastore
    "tablespace": {"stream", "ledger", "metastore", "edge"},  # seed 003: a table service on named logs
    "replay": {"zab", "metastore", "bookie", "ledger", "stream", "tablespace", "edge"},
    "sim": {"zab", "metastore", "bookie", "ledger", "stream", "tablespace", "replay", "edge"},
    "clusterd": set(PACKAGES) - {"clusterd", "sim"},
}
# Imports against MAY_IMPORT when the rule came (issue 21). The list may only shrink.
UPWARD_IMPORTS = {("bookie/registration.py", "ledger")}  # the background services' retry loop
# What `ledger` and `bookie` may use of the metastore: its client interface (the client, its
# errors, and the jute records and constants that client calls take).
METASTORE_CLIENT_INTERFACE = ("metastore.client", "metastore.errors", "metastore.wire.jute_records",
                              "metastore.wire.jute_defs")


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_the_ones_below_them(package: str):
    for path in modules(package):
        rel = str(path.relative_to(REPO))
        above = (imported_roots(path) & set(PACKAGES)) - MAY_IMPORT[package] - {package}
        above -= {pkg for name, pkg in UPWARD_IMPORTS if name == rel}
        assert not above, f"{rel} imports {sorted(above)}, which {package}/ sits below"


def test_upward_import_exceptions_only_shrink():
    for name, package in UPWARD_IMPORTS:
        assert package in imported_roots(REPO / name), f"{name} no longer imports {package}: remove it from UPWARD_IMPORTS"


@pytest.mark.parametrize("package", ["ledger", "bookie", "stream", "tablespace"])
def test_the_metastore_is_reached_through_its_client_interface(package: str):
    for path in modules(package):
        for name in imported_modules(path):
            if name.startswith("metastore."):
                assert name.startswith(METASTORE_CLIENT_INTERFACE), (
                    f"{path.relative_to(REPO)} imports {name}: use the metastore's client interface")


@pytest.mark.parametrize("package", ["zab", "metastore"])
def test_cores_and_codecs_never_import_their_edge(package: str):
    """Inside zab/ and metastore/: core/ and wire/ are pure and below storage/ and edge/."""
    below = {f"{package}.edge", f"{package}.storage", f"{package}.client"}
    for sub in ("core", "wire"):
        for path in modules(f"{package}/{sub}"):
            bad = {n for n in imported_modules(path) if n.startswith(tuple(below))}
            assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}: {sub}/ sits below them"


def test_the_simulator_and_the_verifiers_use_cores_not_edges():
    edges = ("zab.edge", "metastore.edge", "metastore.client", "bookie.service", "bookie.client", "ledger.client",
             "ledger.driver")
    for pkg in ("sim", "replay"):
        for path in modules(pkg):
            bad = {n for n in imported_modules(path) if n.startswith(edges)}
            assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}: {pkg}/ runs the pure cores"


@pytest.mark.parametrize("path", [p for pkg in PACKAGES for p in modules(pkg)], ids=lambda p: str(p.relative_to(REPO)))
def test_small_units(path: Path):
    lines = path.read_text().splitlines()
    cap = LONG_MODULES.get(str(path.relative_to(REPO)), MAX_MODULE_LINES)
    assert len(lines) <= cap, f"{path.relative_to(REPO)} has {len(lines)} lines (max {cap}): split it"
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, (
                f"{path.relative_to(REPO)}:{node.lineno} {node.name} has {length} lines (max {MAX_FUNCTION_LINES})")


@pytest.mark.parametrize("name", sorted(LONG_MODULES))
def test_long_module_exceptions_only_shrink(name: str):
    lines = len((REPO / name).read_text().splitlines())
    assert lines > MAX_MODULE_LINES, (
        f"{name} has {lines} lines, within the cap of {MAX_MODULE_LINES}: remove it from LONG_MODULES")


def test_test_modules_share_helpers_through_fixtures_modules_only():
    """docs/testing.md: a helper two test modules need lives in a *_fixtures.py module; importing
    another test module would also drag in (and couple to) its module-scoped fixtures and tests."""
    tests = REPO / "tests"
    for path in sorted(tests.glob("test_*.py")):
        bad = {name for name in imported_modules(path) if name.split(".")[0].startswith("test_")}
        assert not bad, f"tests/{path.name} imports {sorted(bad)}: move what it needs to a *_fixtures.py module"
