"""What a new user meets first on the command line (issue 20, item 5): a missing argument is a
usage error at once, each `ledger` action has its own options and examples, a closed pipe ends
quietly, `--version`, a clear line when Spark has no Java 17+, and the ZooKeeper client protocol
by default. Each check runs the real `clusterctl` (or `clusterd`) as a subprocess; none needs a
running cluster."""

from __future__ import annotations

import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from cluster_fixtures import ENV, REPO, copy_config, run
from clusterd import config as cfg
from clusterd.ctl.main import _parser
from replay.spark_session import JavaUnavailable, java_major_version, require_java


def ctl(config: Path, *args: str, env: dict[str, str] | None = None, stdout: int | None = subprocess.PIPE
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterd.ctl.main", "--config", str(config), *args],
                          cwd=config.parent, env=ENV if env is None else env, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return copy_config(tmp_path)


@pytest.fixture
def listeners(config: Path) -> Iterator[list[socket.socket]]:
    """Sockets listening on every client and bookie port of `config`, where nothing runs: a
    command that dials the cluster leaves a connection waiting in one of their backlogs."""
    sockets = []
    for node in cfg.load(config).nodes:
        for port in (node.client_port, node.bookie_port):
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.listen(8)
            s.setblocking(False)
            sockets.append(s)
    yield sockets
    for s in sockets:
        s.close()


def dialled(sockets: list[socket.socket]) -> list[int]:
    """The ports that a client connected to (each connection is accepted and closed)."""
    ports = []
    for s in sockets:
        try:
            conn, _ = s.accept()
        except BlockingIOError:
            continue
        conn.close()
        ports.append(s.getsockname()[1])
    return ports


# -- 1. a missing argument is argparse's usage error, before anything is dialled --------------

@pytest.mark.parametrize("args, complaint", [
    (["read"], "the following arguments are required: ID"),
    (["tail", "--follow"], "the following arguments are required: ID"),
    (["stat"], "the following arguments are required: ID"),
    (["recover", "--password", "pw"], "the following arguments are required: ID"),
    (["delete"], "the following arguments are required: ID"),
    (["read", "one"], "a ledger ID is a number"),
    (["read", "-1"], "a ledger ID is a number"),
    (["append"], "DATA arguments, or --stdin"),
    (["append", "a", "--stdin"], "not both"),
    ([], "the following arguments are required: ACTION"),
])
def test_a_ledger_action_without_its_arguments_is_refused_before_dialling_the_cluster(
        config: Path, listeners: list[socket.socket], args: list[str], complaint: str) -> None:
    done = ctl(config, "ledger", *args)
    assert done.returncode == 2, done.stderr
    assert "usage: clusterctl ledger" in done.stderr and complaint in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert dialled(listeners) == []


@pytest.mark.parametrize("args, usage, complaint", [
    (["log", "append", "orders"], "usage: clusterctl log append", "give the records: DATA arguments, or --stdin"),
    (["log", "append", "orders", "a", "--stdin"], "usage: clusterctl log append", "not both"),
    (["bookie", "decommission"], "usage: clusterctl bookie", "bookie decommission needs the bookie's ID"),
    (["bookie", "recommission"], "usage: clusterctl bookie", "bookie recommission needs the bookie's ID"),
])
def test_other_commands_without_their_arguments_are_refused_before_dialling_the_cluster(
        config: Path, listeners: list[socket.socket], args: list[str], usage: str, complaint: str) -> None:
    done = ctl(config, *args)
    assert done.returncode == 2, done.stderr
    assert usage in done.stderr and complaint in done.stderr, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert dialled(listeners) == []


def test_the_listeners_do_see_a_ledger_command_that_dials(config: Path, listeners: list[socket.socket]) -> None:
    """The check above can fail: a well-formed command dials the (silent) client ports."""
    proc = subprocess.Popen([sys.executable, "-m", "clusterd.ctl.main", "--config", str(config), "ledger", "ls"],
                            cwd=config.parent, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        readable, _, _ = select.select(listeners, [], [], 60)  # a guard: the dial comes at once
    finally:
        proc.kill()
        proc.wait()
    assert readable and dialled(listeners) != []


# -- 2. one sub-parser per ledger action, with its own options and examples --------------------

@pytest.mark.parametrize("action, has, lacks, example", [
    ("read", ["--first", "--last", "--password", "--json"], ["--keep-open", "--follow", "-E"],
     "clusterctl ledger read 1 --first 10 --last 19 --json"),
    ("append", ["--stdin", "--keep-open", "--ensemble", "--digest"], ["--first", "--follow", "--from"],
     "clusterctl ledger append a b c"),
    ("tail", ["--from", "--follow", "--password"], ["--stdin", "--last"], "clusterctl ledger tail 2 --follow"),
    ("stat", ["--json"], ["--password", "--keep-open"], "clusterctl ledger stat 1"),
])
def test_each_ledger_action_helps_with_only_its_own_options_and_examples(
        config: Path, action: str, has: list[str], lacks: list[str], example: str) -> None:
    done = ctl(config, "ledger", action, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: clusterctl ledger {action}")
    options = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", done.stdout))
    assert set(has) <= options and not set(lacks) & options, done.stdout
    assert "\nexamples:\n" in done.stdout and f"\n  {example}\n" in done.stdout, done.stdout


def test_an_option_of_another_action_is_refused(config: Path) -> None:
    done = ctl(config, "ledger", "stat", "1", "--keep-open")
    assert done.returncode == 2 and "unrecognized arguments: --keep-open" in done.stderr, done.stderr


@pytest.mark.parametrize("argv, expected", [
    # tests/test_ledger_processes.py, tests/test_tls_bookies.py, README.md and docs/ write these.
    (["append", "alpha", "beta", "gamma", "--password", "pw", "--json"],
     {"action": "append", "data": ["alpha", "beta", "gamma"], "password": "pw", "json": True, "keep_open": False}),
    (["append", "x", "y", "--keep-open", "-E", "3", "-Q", "3", "-A", "2", "--password", "pw", "--json"],
     {"data": ["x", "y"], "keep_open": True, "ensemble": 3, "write_quorum": 3, "ack_quorum": 2}),
    (["append", "x", "--keep-open"], {"data": ["x"], "keep_open": True, "ensemble": 3, "write_quorum": 2}),
    (["read", "7", "--password", "nope"], {"action": "read", "ledger_id": 7, "password": "nope", "first": 0}),
    (["read", "1", "--password", "pw", "--json"], {"ledger_id": 1, "json": True}),
    (["tail", "3", "--password", "pw", "--json"], {"action": "tail", "ledger_id": 3, "from_entry": 0}),
    (["stat", "4", "--json"], {"action": "stat", "ledger_id": 4}),
    (["recover", "2", "--password", "pw", "--json"], {"action": "recover", "ledger_id": 2, "password": "pw"}),
    (["ls", "--json"], {"action": "ls", "json": True}),
    (["delete", "5", "--json"], {"action": "delete", "ledger_id": 5}),
])
def test_the_ledger_invocations_in_scripts_docs_and_tests_still_parse(argv: list[str], expected: dict) -> None:
    args = _parser().parse_args(["ledger", *argv])
    assert {key: getattr(args, key) for key in expected} == expected


# -- 3. a reader that goes away early ends clusterctl quietly ----------------------------------

def test_output_into_a_closed_pipe_exits_141_without_a_traceback(config: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before clusterctl writes: `... | head -0`, deterministically
    try:
        done = ctl(config, "status", "--json", stdout=write_end)
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


# -- 4. --version ----------------------------------------------------------------------------

@pytest.mark.parametrize("module, prog", [("clusterd.ctl.main", "clusterctl"), ("clusterd.daemon.main", "clusterd")])
def test_version_prints_the_installed_package_version(tmp_path: Path, module: str, prog: str) -> None:
    done = run("-m", module, "--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{prog} {metadata.version('quire')}\n"


def test_without_an_installed_package_the_version_comes_from_pyproject(tmp_path: Path) -> None:
    (tmp_path / "clusterd").mkdir()
    shutil.copy(REPO / "clusterd" / "version.py", tmp_path / "clusterd" / "version.py")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "quire"\nversion = "9.8.7"\n')
    # -S leaves site-packages (where quire is installed) off sys.path.
    done = subprocess.run([sys.executable, "-S", "-c", "from clusterd.version import package_version; "
                           "print(package_version())"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(tmp_path)})
    assert (done.returncode, done.stdout) == (0, "9.8.7\n"), done.stderr


# -- 5. Spark needs Java 17+: checked first, one line ------------------------------------------

def fake_java(folder: Path, version_line: str) -> Path:
    """`folder`/bin/java, a script printing `version_line` to stderr as `java -version` does."""
    (folder / "bin").mkdir(parents=True)
    java = folder / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(0o755)
    return java


def env_with(**changes: str | None) -> dict[str, str]:
    env = dict(ENV)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def assert_one_line_about_java(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterctl: verify: Spark needs Java 17 or newer"), done.stderr
    assert "openjdk-17-jre-headless" in lines[0]


def test_verify_with_java_11_on_the_path_says_so_in_one_line(config: Path, tmp_path: Path) -> None:
    java = fake_java(tmp_path / "jdk11", 'openjdk version "11.0.2" 2019-01-15')
    done = ctl(config, "verify", "zab", env=env_with(PATH=str(java.parent), JAVA_HOME=None))
    assert_one_line_about_java(done)
    assert f"{java} is Java 11" in done.stderr


def test_verify_with_java_home_at_java_11_says_so_in_one_line(config: Path, tmp_path: Path) -> None:
    java = fake_java(tmp_path / "jdk11", 'openjdk version "11.0.2" 2019-01-15')
    empty = tmp_path / "empty"
    empty.mkdir()
    done = ctl(config, "verify", "zab", env=env_with(PATH=str(empty), JAVA_HOME=str(tmp_path / "jdk11")))
    assert_one_line_about_java(done)
    assert f"{java} is Java 11" in done.stderr


def test_verify_without_any_java_says_so_in_one_line(config: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = ctl(config, "verify", "zab", env=env_with(PATH=str(empty), JAVA_HOME=None))
    assert_one_line_about_java(done)
    assert "no `java` on PATH" in done.stderr


def test_java_home_is_preferred_to_the_path_as_spark_does(tmp_path: Path) -> None:
    old = fake_java(tmp_path / "old", 'java version "1.8.0_392"')
    new = fake_java(tmp_path / "new", 'openjdk version "21.0.1" 2023-10-17')
    assert require_java({"PATH": str(old.parent), "JAVA_HOME": str(tmp_path / "new")}) == str(new)
    with pytest.raises(JavaUnavailable, match="is Java 8;"):
        require_java({"PATH": str(new.parent), "JAVA_HOME": str(tmp_path / "old")})


@pytest.mark.parametrize("output, major", [
    ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
    ('Picked up JAVA_TOOL_OPTIONS: -Xmx1g\nopenjdk version "21" 2023-09-19', 21),
    ('openjdk version "17-ea" 2021-09-14', 17),
    ('java version "1.8.0_392"', 8),
    ('openjdk version "11.0.2" 2019-01-15', 11),
    ("bash: java: command not found", None),
])
def test_the_java_version_is_read_from_what_java_version_prints(output: str, major: int | None) -> None:
    assert java_major_version(output) == major


# -- 6. the client port speaks ZooKeeper's protocol unless told otherwise ----------------------

def test_a_config_written_from_the_docs_without_client_protocol_speaks_zookeeper(tmp_path: Path) -> None:
    docs = (REPO / "docs" / "operations.md").read_text()
    blocks = re.findall(r"```\n(\[\[node\]\]\n.*?)```", docs, re.S)
    node = next((b for b in blocks if 'host = "10.0.0.11"' in b), None)
    assert node is not None, "docs/operations.md, 'Running on real hosts', lost its [[node]] example"
    text = "".join(node.replace("id = 1", f"id = {i}").replace("10.0.0.11", f"127.0.0.{i}")
                   .replace("/var/lib/quire", f"data/node{i}") for i in (1, 2, 3))
    assert "client_protocol" not in text and "[cluster]" not in text
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    assert cfg.load(path).client_protocol == "zookeeper"
    # The shipped file says nothing either: every kazoo test against it runs on this default.
    shipped = tomllib.loads((REPO / "cluster.toml").read_text())
    assert "client_protocol" not in shipped.get("cluster", {})
    assert cfg.load(REPO / "cluster.toml").client_protocol == "zookeeper"
