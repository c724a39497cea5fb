"""The ensemble: which servers are voters and observers, in ZooKeeper's dynamic config format.

ZooKeeper 3.5+ describes an ensemble as lines `server.<id>=<host>:<quorum port>:<election
port>[:participant|observer][;[<client host>:]<client port>]`, and that text is what
`reconfig` takes, what `getConfig` and /zookeeper/config show (followed by `version=<hex>`),
and what every node persists. Quire's peers use one port for both of ZooKeeper's, so a
line Quire writes repeats its peer port; a line it reads may name any election port
(ignored). The version of a configuration is the zxid of the transaction that made it
(0: the bootstrap configuration from cluster.toml), as in ZooKeeper.

Pure data and parsing: the Zab core keeps the committed ensemble and the one a pending
reconfig proposes (zab/core/config.py), the edge takes addresses from it
(zab/edge/transport.py), and the metastore computes a reconfig's new ensemble with
`reconfigured`.
"""

from __future__ import annotations

from dataclasses import dataclass

PARTICIPANT = "participant"
OBSERVER = "observer"
MAX_SERVER_ID = (1 << 63) - 1
MAX_SPEC_BYTES = 1 << 20  # far beyond any real ensemble: bounds what a reconfig may make every node hold


class EnsembleError(ValueError):
    """An ensemble description that cannot be used; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Server:
    """One member: its peer address, role and client address."""

    host: str
    peer_port: int
    role: str = PARTICIPANT
    client_host: str = "0.0.0.0"
    client_port: int = 0

    def line(self, server_id: int) -> str:
        client = f";{self.client_host}:{self.client_port}" if self.client_port else ""
        return f"server.{server_id}={self.host}:{self.peer_port}:{self.peer_port}:{self.role}{client}"


@dataclass(frozen=True, slots=True)
class Ensemble:
    """A configuration: members by id, and the zxid that made it (its version)."""

    version: int
    servers: tuple[tuple[int, Server], ...]  # sorted by id

    @classmethod
    def of(cls, version: int, servers: dict[int, Server]) -> Ensemble:
        return cls(version, tuple(sorted(servers.items())))

    @property
    def by_id(self) -> dict[int, Server]:
        return dict(self.servers)

    @property
    def voters(self) -> frozenset[int]:
        return frozenset(i for i, s in self.servers if s.role == PARTICIPANT)

    @property
    def observers(self) -> frozenset[int]:
        return frozenset(i for i, s in self.servers if s.role == OBSERVER)

    def spec(self) -> str:
        """The server lines, without the version (what a reconfig carries)."""
        return "\n".join(s.line(i) for i, s in self.servers)

    def config_data(self) -> bytes:
        """What /zookeeper/config holds: the server lines and `version=<hex zxid>`."""
        return (self.spec() + f"\nversion={self.version:x}").encode()


def parse_server(line: str) -> tuple[int, Server]:
    """One `server.<id>=...` line; EnsembleError says what is wrong with it."""
    key, sep, value = line.strip().partition("=")
    if not sep or not key.startswith("server."):
        raise EnsembleError(f"{line!r}: expected server.<id>=<host>:<port>:<port>[:role][;[host:]port]")
    try:
        server_id = int(key[len("server."):])
    except ValueError:
        raise EnsembleError(f"{line!r}: the server id is not a number") from None
    if not 0 < server_id <= MAX_SERVER_ID:
        raise EnsembleError(f"{line!r}: server ids are positive 63-bit numbers")
    quorum, _, client = value.partition(";")
    parts = quorum.split(":")
    if len(parts) not in (3, 4) or not parts[0]:
        raise EnsembleError(f"{line!r}: expected <host>:<quorum port>:<election port>[:participant|observer]")
    role = parts[3] if len(parts) == 4 else PARTICIPANT
    if role not in (PARTICIPANT, OBSERVER):
        raise EnsembleError(f"{line!r}: the role is {role!r}, not participant or observer")
    peer_port = _port(parts[1], line)
    _port(parts[2], line)
    client_host, client_port = "0.0.0.0", 0
    if client:
        host, _, port = client.rpartition(":")
        client_host, client_port = host or "0.0.0.0", _port(port, line)
    return server_id, Server(parts[0], peer_port, role, client_host, client_port)


def _port(text: str, line: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise EnsembleError(f"{line!r}: {text!r} is not a port") from None
    if not 0 < port < 65536:
        raise EnsembleError(f"{line!r}: port {port} is out of range")
    return port


def parse_spec(text: str | bytes, version: int = 0) -> Ensemble:
    """An ensemble from server lines (commas or newlines between them; a `version=` line is
    skipped: `version` says which it is). EnsembleError if a line is bad or an id repeats."""
    if isinstance(text, bytes):
        if len(text) > MAX_SPEC_BYTES:
            raise EnsembleError(f"an ensemble description of {len(text)} bytes is beyond {MAX_SPEC_BYTES}")
        try:
            text = text.decode()
        except UnicodeDecodeError:
            raise EnsembleError("the ensemble description is not UTF-8") from None
    servers: dict[int, Server] = {}
    for line in text.replace(",", "\n").splitlines():
        if not line.strip() or line.strip().startswith("version="):
            continue
        server_id, server = parse_server(line)
        if server_id in servers:
            raise EnsembleError(f"server.{server_id} appears twice")
        servers[server_id] = server
    return Ensemble.of(version, servers)


def reconfigured(current: Ensemble, joining: str | None, leaving: str | None,
                 new_members: str | None) -> dict[int, Server]:
    """The members after a reconfig request, as ZooKeeper computes them: `new_members` (a
    whole new list) when given, else `current` with `leaving` ids removed and `joining`
    lines added or replacing members of the same id. EnsembleError for bad input or a
    result without a voter; the caller checks quorum and versions."""
    if new_members:
        if joining or leaving:
            raise EnsembleError("a reconfig gives either new members or joining/leaving servers, not both")
        servers = parse_spec(new_members).by_id
    else:
        servers = current.by_id
        for part in (leaving or "").split(","):
            if part.strip():
                try:
                    servers.pop(int(part.strip()), None)
                except ValueError:
                    raise EnsembleError(f"leaving server {part.strip()!r} is not a server id") from None
        servers.update(parse_spec(joining or "").by_id)
    if not any(s.role == PARTICIPANT for s in servers.values()):
        raise EnsembleError("the new configuration has no participant: it could never commit anything")
    return servers


def bootstrap(voters: frozenset[int], observers: frozenset[int] = frozenset()) -> Ensemble:
    """An ensemble of version 0 with no addresses known (the simulator's, and tests')."""
    servers = {i: Server(f"node{i}", 1) for i in voters}
    servers.update({i: Server(f"node{i}", 1, OBSERVER) for i in observers})
    return Ensemble.of(0, servers)


def peer_addresses(ensemble: Ensemble) -> dict[int, tuple[str, int]]:
    """Where each member's peer port is (what the transport dials)."""
    return {i: (s.host, s.peer_port) for i, s in ensemble.servers}
