"""Large state (issue 19, "Measure", first bullet): a big znode tree on Quire and on ZooKeeper, in one run.

    python -m bench.large_tree [--znodes N] [--znode-bytes B] [--big-znodes N] [--big-bytes B] [--no-big]
    python -m bench.run --only large_tree      # the same, from the suite's entry point

For each tree (by default 1,000,000 znodes of 100 B under 1000 parents, then
1000 znodes of 1,000,000 B under 10 parents, 1 GB of data) and each system (a
3-node Quire cluster of voters from a copy of cluster.toml, bench/quire.py; a
3-server ZooKeeper 3.8 ensemble from Debian's jars, bench/zk.py, with a larger
heap), on fresh data directories, one after the other on the same machine:

1. load: the parents from this process, then the children by P kazoo processes
   (bench/tree_loader.py), each `create_async` under a bounded window, spread
   over the three servers; the load rate is znodes (and bytes) per second from
   "go" to the last acknowledgement; then until every server reports the same
   zxid and node count (`srvr`).
2. snapshot write time of the full tree on the leader, at the first periodic
   snapshot after the load (both systems at their shipped snapshot settings):
   - Quire snapshots after more than half and at most `snapshot_every_txns`
     delivered transactions (50,000), a count that differs per node and per
     snapshot, as ZooKeeper's does. The leader's /status says how many more it
     needs (`snapshot_in_txns`); the benchmark sends all but one as setData of one small znode, then the last one; timed:
     from just before that last write is sent to the timestamp of the leader's
     `event=snapshot` line (freeze on the event loop, encoding in 1 MiB pieces,
     writing, fsync, rename, purge of old files).
   - ZooKeeper snapshots after snapCount/2 + a random roll (of snapCount/2)
     transactions (snapCount 100,000), in a background thread. The benchmark
     sends setData in bursts until the leader logs `Snapshotting: 0x<zxid>` for a
     zxid past the load; timed: ZooKeeper's own `Snapshot taken in N ms` for it
     (serialization and writes, no fsync: ZooKeeper's periodic snapshots are
     not synced).
3. wiped follower (before the restart, so that its figure does not depend on the
   restart succeeding): SIGTERM one follower, delete its data directory
   (ZooKeeper: all but `myid`; Quire: all but its log file), start it, time until
   its `srvr` zxid and node count equal the leader's (Quire: and /status says it
   follows in phase broadcast): a SNAP of the whole tree, Quire's streamed in chunks.
4. restart to serving: SIGTERM every server (the stop time is reported), start
   them all, and time from the start until a kazoo client connected to each
   server alone reads the last znode of the tree (a read of the whole tree's
   last write proves the server loaded it); "first" is the first server to
   answer, "all" the last; a server that has not served after SERVING_TIMEOUT_S
   fails the step (the report then lists every server's elections). From the
   logs: Quire's `event=recovered` (snapshot and log loaded), ZooKeeper's
   `Snapshot loaded in`, `txns loaded in` and the leader's `Snapshot taken in`
   (ZooKeeper's leader snapshots its whole tree before it serves, in loadData).
5. memory: every server process's peak RSS in each step, read from
   /proc/<pid>/status VmHWM, reset at the start of each step (`clear_refs` 5,
   root) and sampled every 0.2 s so that a process that stops in a step counts.
   The tree's size in memory is the smallest RSS growth over the load among the
   servers (VmRSS after the load minus VmRSS just before it: one copy of the
   tree, as a follower holds it), shown beside the raw bytes (data + paths) and
   the snapshot file.

Every server listens on 127.0.0.1 only; every process this module starts is
stopped in a `finally`, and its temp folder is removed unless `--keep`.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.large_tree_bench import REPO, Bench
from bench.large_tree_results import ZK_HEAP, Results, Tree


def trees(znodes: int, znode_bytes: int, parents: int, big_znodes: int, big_bytes: int, big_parents: int,
          *, big: bool) -> list[Tree]:
    small = Tree("small", parents, max(1, znodes // parents), znode_bytes, processes=4, window=128)
    out = [small]
    if big and big_znodes:
        out.append(Tree("big", big_parents, max(1, big_znodes // big_parents), big_bytes, processes=2, window=4))
    return out


def run(folder: Path, tree_list: list[Tree], *, with_zk: bool = True, zk_heap: str = ZK_HEAP,
        command: str | None = None, progress: Callable[[str], None] = print) -> Results:
    command = command or shlex.join([Path(sys.executable).name, "-m", "bench.large_tree", *sys.argv[1:]])
    return Bench(folder, tree_list, with_zk=with_zk, zk_heap=zk_heap, command=command, progress=progress).run()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--znodes", type=int, default=1_000_000, help="znodes of the first tree (default 1,000,000)")
    p.add_argument("--znode-bytes", type=int, default=100, help="their data (default 100 B)")
    p.add_argument("--parents", type=int, default=1000, help="parents of the first tree (default 1000)")
    p.add_argument("--big-znodes", type=int, default=1000, help="znodes of the second tree (default 1000)")
    p.add_argument("--big-bytes", type=int, default=1_000_000,
                   help="their data (default 1,000,000 B: under jute.maxbuffer, 0xfffff, of both systems)")
    p.add_argument("--big-parents", type=int, default=10, help="parents of the second tree (default 10)")
    p.add_argument("--no-big", action="store_true", help="the first tree only")
    p.add_argument("--zk-heap", default=ZK_HEAP, help=f"ZooKeeper's -Xmx (default {ZK_HEAP})")


def main(argv: list[str] | None = None) -> int:
    from bench import large_tree_report

    p = argparse.ArgumentParser(prog="python -m bench.large_tree", description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--no-zk", action="store_true", help="Quire only")
    p.add_argument("--workdir", default=None, help="parent of the temp dir (default: the system's temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (loader logs; data dirs are removed "
                                                       "after each system to free the disk)")
    p.add_argument("--output", default=str(REPO / "docs" / "benchmarks.md"),
                   help="the report whose large-tree section is rewritten (default docs/benchmarks.md); "
                        "'-' prints the section instead")
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="quire-large-tree-", dir=args.workdir))
    print(f"bench.large_tree: working in {folder}")
    try:
        results = run(folder, trees_of(args), with_zk=not args.no_zk, zk_heap=args.zk_heap)
        section = large_tree_report.render(results)
        if args.output == "-":
            print(section)
        else:
            large_tree_report.splice(Path(args.output), section)
            print(f"bench.large_tree: wrote its section of {args.output}")
    finally:
        if args.keep:
            print(f"bench.large_tree: kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    failed = results.failures or any(f.failures for f in results.figures)
    return 1 if failed else 0


def trees_of(args: argparse.Namespace) -> list[Tree]:
    return trees(args.znodes, args.znode_bytes, args.parents, args.big_znodes, args.big_bytes, args.big_parents,
                 big=not args.no_big)


if __name__ == "__main__":
    sys.exit(main())
