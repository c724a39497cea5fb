"""What bench/large_tree.py measures: the trees it loads (`Tree`), what one system did on one tree
(`Figures`) and the whole run (`Results`), with the size formats its report uses."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.tree_loader import child_path

ROOT = "/lt"
ZK_HEAP = "4g"
PHASES = ("load", "snapshot", "resync", "restart")


@dataclass(frozen=True)
class Tree:
    key: str
    parents: int
    children: int  # per parent
    value_bytes: int
    processes: int  # loader processes
    window: int  # create_async in flight per loader process

    @property
    def znodes(self) -> int:
        return self.parents * self.children

    @property
    def data_bytes(self) -> int:
        return self.znodes * self.value_bytes

    def parent(self, i: int) -> str:
        return f"{ROOT}/p{i:04d}"

    @property
    def last_path(self) -> str:
        return child_path(self.parent(self.parents - 1), self.children - 1)

    @property
    def raw_bytes(self) -> int:
        """Data and path bytes of the children: what the tree holds, before any per-znode overhead."""
        return self.znodes * (self.value_bytes + len(self.last_path))

    @property
    def title(self) -> str:
        return f"{self.znodes:,} znodes of {_size(self.value_bytes)} ({self.parents:,} x {self.children:,})"


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / (1 << 20):,.0f} MiB"


# -- what one system did on one tree -------------------------------------------------------------


@dataclass
class Figures:
    system: str
    tree: Tree
    leader: str = ""
    load_s: float | None = None
    load_errors: dict[str, int] = field(default_factory=dict)
    load_error_samples: list[str] = field(default_factory=list)
    settle_s: float | None = None
    node_count: int | None = None  # per srvr after the load (the whole tree, system znodes included)
    rss_before: dict[str, int] = field(default_factory=dict)  # VmRSS just before the load
    rss_loaded: dict[str, int] = field(default_factory=dict)  # VmRSS once the load settled
    snapshot_s: float | None = None
    snapshot_sync_s: float | None = None  # Quire: of snapshot_s, its fsync, header and rename (ZooKeeper has none)
    snapshot_note: str = ""
    snapshot_file_bytes: int | None = None
    trigger_writes: int = 0
    floor_write_s: float | None = None  # the snapshot file's bytes written to a new file, no fsync
    floor_fsync_s: float | None = None  # ... and fsynced
    stop_s: dict[str, float] = field(default_factory=dict)
    stop_killed: list[str] = field(default_factory=list)
    first_read_s: float | None = None
    all_read_s: float | None = None
    read_s: dict[str, float] = field(default_factory=dict)
    restart_log: list[str] = field(default_factory=list)  # what the logs say about loading
    resync_node: str = ""
    resync_s: float | None = None
    resync_log: list[str] = field(default_factory=list)
    peaks: dict[str, dict[str, int]] = field(default_factory=dict)  # phase -> server -> peak RSS (bytes)
    loadavg: dict[str, float] = field(default_factory=dict)  # phase -> 1-minute load average at its start
    failures: list[str] = field(default_factory=list)

    @property
    def snapshot_unsynced_s(self) -> float | None:
        """The snapshot write without its fsync: what ZooKeeper's periodic snapshot does."""
        if self.snapshot_s is None:
            return None
        return self.snapshot_s - (self.snapshot_sync_s or 0.0)

    @property
    def load_rate(self) -> float | None:
        return self.tree.znodes / self.load_s if self.load_s else None

    def growth(self, server: str) -> int | None:
        before, after = self.rss_before.get(server), self.rss_loaded.get(server)
        return after - before if before is not None and after is not None else None

    @property
    def tree_rss(self) -> int | None:
        """The tree's size in a server's memory: the smallest RSS growth over the load among the servers
        (a follower's: one copy of the tree; a Quire leader also holds its prepared view of the tree)."""
        values = [g for s in self.rss_before if (g := self.growth(s)) is not None]
        return min(values) if values else None

    def peak(self, server: str) -> int | None:
        values = [p[server] for p in self.peaks.values() if server in p]
        return max(values) if values else None

    @property
    def servers(self) -> list[str]:
        return sorted({s for p in self.peaks.values() for s in p} | set(self.rss_before))


@dataclass
class Results:
    trees: list[Tree]
    facts: dict[str, str]
    command: str
    zk_version: str = ""
    zk_heap: str = ZK_HEAP
    figures: list[Figures] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    clear_refs: bool = True  # VmHWM could be reset per step
    busy_at_start: float = 0.0  # share of all CPUs busy in the second before the part (a shared machine)
    duration_s: float = 0.0

    def get(self, system: str, tree: Tree) -> Figures | None:
        return next((f for f in self.figures if f.system == system and f.tree == tree), None)
