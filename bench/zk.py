"""A throw-away 3-node Apache ZooKeeper ensemble from Debian's `zookeeper` package, on 127.0.0.1.

Debian ships jars, not a ready server. Each node runs

    java -cp <jars> org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg

The class path names the netty codec and resolver jars explicitly: the
zookeeper.jar manifest does not, and without them clients hang. Every port
binds to 127.0.0.1 (clientPortAddress, server.N=127.0.0.1:quorum:election),
the data dir lives in the benchmark's temp folder, forceSync=yes, and the
four-letter words the benchmark uses are whitelisted.

With `ZkTls` (bench/tls_systems.py makes one) the ensemble serves TLS the way a
production ZooKeeper does: Netty's connection factory, `secureClientPort` in
place of `clientPort` (clients must present a certificate of the CA), and
`sslQuorum=true` with `zookeeper.ssl.quorum.*` on the quorum and election ports,
PEM key stores throughout. `netty=True` without TLS runs the same factory in
plain text, so that a plain/TLS ratio measures TLS alone.

`reconfig=True` starts the ensemble the way ZooKeeper 3.5+ needs it for dynamic reconfiguration
(zookeeperReconfig.md): `reconfigEnabled=true`, `standaloneEnabled=false`, and server lines in
the 3.5 form `server.N=127.0.0.1:<quorum>:<election>:participant|observer;127.0.0.1:<client>`
with the client address in the line, so zoo.cfg has no `clientPort`/`clientPortAddress` (the
documented form; on first boot ZooKeeper itself moves the server lines into
`zoo.cfg.dynamic.<version>`, backs zoo.cfg up as zoo.cfg.bak and points it at the dynamic file).
`observers=K` makes the last K servers observers (`:observer` in every server line, and
`peerType=observer` in their own zoo.cfg). `super_digest` (user:base64(sha1(user:password)))
passes `-Dzookeeper.DigestAuthenticationProvider.superDigest`, so that a client that
`add_auth("digest", "super:<password>")` may write /zookeeper/config, that is call reconfig.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench import processes
from clusterd import localcluster

JAVA_DIR = Path("/usr/share/java")
# Order matters only for readability; every jar must exist.
JARS = ("zookeeper.jar", "zookeeper-jute.jar",
        "netty-buffer.jar", "netty-codec.jar", "netty-common.jar", "netty-handler.jar", "netty-resolver.jar",
        "netty-transport.jar", "netty-transport-native-epoll.jar", "netty-transport-native-unix-common.jar",
        "slf4j-api.jar", "slf4j-log4j12.jar", "log4j-1.2.jar",
        "metrics-core.jar", "commons-cli.jar", "commons-io.jar", "snappy-java.jar")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
FOUR_LETTER_WORDS = "srvr,mntr,stat,ruok,conf"
# ZooKeeper's shipped defaults (conf/zoo_sample.cfg), so the reference is a stock server.
TICK_TIME_MS = 2000
INIT_LIMIT = 10
SYNC_LIMIT = 5
JVM_OPTIONS = ("-Xms256m", "-Xmx1g", "-Dzookeeper.admin.enableServer=false", "-Djava.net.preferIPv4Stack=true")
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"
SUPER_DIGEST = "super:D/InIHSb7yEEbrWz8b9l71RjZJU="  # user "super", password "test"


@dataclass(frozen=True)
class ZkTls:
    """TLS material of an ensemble: per server a PEM key store (key and certificate in one file), and the CA."""

    keystores: dict[int, Path]
    ca: Path

    def jvm_options(self, i: int) -> list[str]:
        """ZooKeeper's `zookeeper.ssl.*` (client port) and `zookeeper.ssl.quorum.*` (quorum and election
        ports) system properties of server `i`; hostname verification stays on (the certificates name
        127.0.0.1), client certificates are required (`ssl.clientAuth=need`, the default, made explicit)."""
        options = []
        for prefix in ("zookeeper.ssl", "zookeeper.ssl.quorum"):
            options += [f"-D{prefix}.keyStore.location={self.keystores[i]}", f"-D{prefix}.keyStore.type=PEM",
                        f"-D{prefix}.trustStore.location={self.ca}", f"-D{prefix}.trustStore.type=PEM"]
        return options + ["-Dzookeeper.ssl.clientAuth=need"]

LOG4J = """\
log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File=${zookeeper.log.dir}/zookeeper.log
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
"""


class ZkUnavailable(Exception):
    """ZooKeeper cannot be run here; the message says exactly why."""


def classpath() -> str:
    """The class path of a server; ZkUnavailable naming what is missing."""
    if not (JAVA_DIR / "zookeeper.jar").exists():
        raise ZkUnavailable(f"{JAVA_DIR / 'zookeeper.jar'} not found: install Debian's package "
                            "with `apt-get install -y zookeeper`")
    missing = [jar for jar in JARS if not (JAVA_DIR / jar).exists()]
    if missing:
        raise ZkUnavailable(f"jars missing from {JAVA_DIR}: {', '.join(missing)}")
    if subprocess.run(["which", "java"], capture_output=True).returncode != 0:
        raise ZkUnavailable("no `java` on PATH (Debian's zookeeper package depends on a JRE)")
    return ":".join(str(JAVA_DIR / jar) for jar in JARS)


def version() -> str:
    """The installed Debian package version of zookeeper, e.g. '3.8.0-11+deb12u2'."""
    done = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "zookeeper"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def four_letter_word(port: int, word: str, *, timeout_s: float = 1.0,
                     context: ssl.SSLContext | None = None) -> str | None:
    """The answer of a 4lw command on 127.0.0.1:port (over TLS with `context`), or None if the server
    does not answer."""
    chunks: list[bytes] = []
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as raw:
            s = context.wrap_socket(raw, server_hostname="127.0.0.1") if context is not None else raw
            with s:
                s.sendall(word.encode())
                while data := s.recv(65536):
                    chunks.append(data)
    except ssl.SSLEOFError:  # the server closed after its answer without close_notify: the answer stands
        pass
    except OSError:
        return None
    return b"".join(chunks).decode(errors="replace") if chunks else None


def mode(port: int, *, timeout_s: float = 1.0, context: ssl.SSLContext | None = None) -> str | None:
    """'leader', 'follower', ... per `srvr`; None while not serving (looking) or down."""
    answer = four_letter_word(port, "srvr", timeout_s=timeout_s, context=context)
    for line in (answer or "").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def mntr(port: int) -> dict[str, str]:
    """`mntr` as a dict of its key/value lines (empty if the server does not answer)."""
    answer = four_letter_word(port, "mntr") or ""
    return dict(line.split("\t", 1) for line in answer.splitlines() if "\t" in line)


class ZkEnsemble:
    """`size` ZooKeeper servers (three by default); `stop()` (or the context manager) ends them all."""

    def __init__(self, folder: Path, size: int = 3, *, tls: ZkTls | None = None, netty: bool = False,
                 context: ssl.SSLContext | None = None, jvm_options: tuple[str, ...] = JVM_OPTIONS,
                 reconfig: bool = False, observers: int = 0, super_digest: str | None = None) -> None:
        """`jvm_options`: in place of JVM_OPTIONS (bench/large_tree.py gives the servers a larger heap).
        `reconfig`: a dynamic-config ensemble (see the module docstring); `observers`: the last that
        many servers are observers; `super_digest`: ZooKeeper's super user, "user:digest"."""
        if not 0 <= observers < size:
            raise ValueError(f"observers must leave at least one participant: {observers} of {size}")
        if reconfig and tls is not None:
            raise ValueError("reconfig with TLS is not set up: the 3.5 server lines carry the plain client port")
        self.folder = folder
        self.reconfig = reconfig
        self.super_digest = super_digest
        self.jvm_options = jvm_options
        self.tls = tls
        self.netty = netty or tls is not None  # TLS on the client port needs Netty's connection factory
        self.context = context  # for the four-letter words on a TLS client port
        self.cp = classpath()
        self.ids = list(range(1, size + 1))
        self.observers = set(self.ids[size - observers:]) if observers else set()
        ports = iter(localcluster.free_ports(3 * size))
        self.client_ports = {i: next(ports) for i in self.ids}
        self.quorum_ports = {i: next(ports) for i in self.ids}
        self.election_ports = {i: next(ports) for i in self.ids}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        for i in self.ids:
            self._write_config(i)

    def __enter__(self) -> ZkEnsemble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def node_dir(self, i: int) -> Path:
        return self.folder / f"zk{i}"

    def data_dir(self, i: int) -> Path:
        return self.node_dir(i) / "data"

    def log_path(self, i: int) -> Path:
        return self.node_dir(i) / "zookeeper.log"

    def _write_config(self, i: int) -> None:
        self.data_dir(i).mkdir(parents=True, exist_ok=True)
        (self.data_dir(i) / "myid").write_text(f"{i}\n")
        lines = [f"tickTime={TICK_TIME_MS}", f"initLimit={INIT_LIMIT}", f"syncLimit={SYNC_LIMIT}",
                 f"dataDir={self.data_dir(i)}", "forceSync=yes", f"4lw.commands.whitelist={FOUR_LETTER_WORDS}", "admin.enableServer=false",
                 "maxClientCnxns=0", "autopurge.purgeInterval=0"]
        if self.reconfig:
            lines += ["reconfigEnabled=true", "standaloneEnabled=false"]
        if i in self.observers:
            lines.append("peerType=observer")
        if self.tls is not None:
            lines += [f"secureClientPort={self.client_ports[i]}", "secureClientPortAddress=127.0.0.1", "sslQuorum=true"]
        elif not self.reconfig:
            lines += [f"clientPort={self.client_ports[i]}", "clientPortAddress=127.0.0.1"]
        lines += [self.server_line(j) for j in self.ids]
        (self.node_dir(i) / "zoo.cfg").write_text("\n".join(lines) + "\n")
        (self.node_dir(i) / "log4j.properties").write_text(LOG4J)

    def server_line(self, j: int, role: str | None = None) -> str:
        """Server j's `server.N=` line: 3.4 form (quorum and election ports; `:observer` for an
        observer), or with `reconfig` the 3.5 form with role and client address, `role` in place of
        its own (bench/reconfig.py promotes an observer with it)."""
        line = f"server.{j}=127.0.0.1:{self.quorum_ports[j]}:{self.election_ports[j]}"
        if self.reconfig:
            role = role or ("observer" if j in self.observers else "participant")
            return f"{line}:{role};127.0.0.1:{self.client_ports[j]}"
        return f"{line}:observer" if j in self.observers else line

    # -- processes -------------------------------------------------------------------
    def start(self, i: int | None = None) -> None:
        for j in [i] if i is not None else self.ids:
            proc = self.procs.get(j)
            if proc is None or proc.poll() is not None:
                self.procs[j] = self._spawn(j)

    def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        node = self.node_dir(i)
        options = [*self.jvm_options]
        if self.netty:
            options.append(f"-Dzookeeper.serverCnxnFactory={NETTY_FACTORY}")
        if self.tls is not None:
            options += self.tls.jvm_options(i)
        if self.super_digest is not None:
            options.append(f"-Dzookeeper.DigestAuthenticationProvider.superDigest={self.super_digest}")
        command = ["java", *options, f"-Dzookeeper.log.dir={node}",
                   f"-Dlog4j.configuration=file:{node / 'log4j.properties'}",
                   "-cp", self.cp, MAIN_CLASS, str(node / "zoo.cfg")]
        with open(node / "zookeeper.out", "ab") as out:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=node, start_new_session=True)

    def pids(self) -> dict[str, int]:
        return {f"zk{i}": p.pid for i, p in self.procs.items() if p.poll() is None}

    def kill(self, i: int) -> None:
        processes.kill(self.procs[i])

    def stop(self, timeout_s: float = 10.0) -> None:
        processes.stop_all(self.procs.values(), timeout_s)

    # -- observation -------------------------------------------------------------------
    def hosts(self, i: int | None = None) -> str:
        """A kazoo `hosts` string: one server, or all."""
        return ",".join(f"127.0.0.1:{self.client_ports[j]}" for j in ([i] if i is not None else self.ids))

    def modes(self) -> dict[int, str | None]:
        return {i: mode(self.client_ports[i], context=self.context) for i in self.ids}

    def wait_serving(self, *, timeout_s: float = 60.0) -> int:
        """Until one server leads, the others follow and the observers observe; returns the leader's id."""
        deadline = time.monotonic() + timeout_s
        while True:
            for i, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ZkUnavailable(f"ZooKeeper server {i} exited with status {proc.returncode}; "
                                        f"see {self.log_path(i)} and {self.node_dir(i) / 'zookeeper.out'}")
            modes = self.modes()
            values = list(modes.values())
            if (values.count("leader") == 1 and values.count("follower") == len(values) - 1 - len(self.observers)
                    and all(modes[j] == "observer" for j in self.observers)):
                return next(i for i, m in modes.items() if m == "leader")
            if time.monotonic() > deadline:
                raise ZkUnavailable(f"ensemble not serving after {timeout_s:g} s: modes {modes}; "
                                    f"see {self.folder}/zk*/zookeeper.log")
            time.sleep(0.05)
