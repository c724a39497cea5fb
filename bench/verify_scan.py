"""`python -m bench.verify_scan DIR...`: the plain single-process baseline of the Spark verifier.

The same per-record work as `replay.verify_zab` (the same pure decoders of
replay.verify_decode: CRC, order, metastore type/path, body digest; the same
replay tasks of replay.spark_replay run one after another, each starting at the chunk
that holds its first zxid as the verifier's do), in one Python process
with dicts instead of Spark: Checksums, Agreement, TotalOrder (one predecessor
per zxid), EpochOrder, C (highest zxid on a majority) and Replay. It skips the
committed-history checks (cheap next to decoding and replay). Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from replay.spark_replay import plan_replays, run_task
from replay.spark_source import parse_dirs
from replay.verify_decode import ORDER_NAMES, ORDER_OK, ORDER_UNKNOWN, decode_chunk, walk_segment
from replay.verify_replay import check_snapshot
from zab.storage.recovery import SNAPSHOT_DIR, TXNLOG_DIR


def scan(dirs: list[str]) -> dict:
    started = time.monotonic()
    nodes = parse_dirs(dirs)
    seen: dict[int, tuple[bytes, int, int]] = {}  # zxid -> (body digest, predecessor, nodes)
    counts = {"records": 0, "bad": 0, "misordered": 0, "differing": 0, "forks": 0}
    segments: dict[int, list[tuple[int, str]]] = {}
    tops: dict[int, int] = {}
    chunk_starts: dict[str, tuple[int, ...]] = {}
    for n in nodes:
        for path in sorted((Path(n.path) / TXNLOG_DIR).glob("log.*")):
            buf = path.read_bytes()
            layout = walk_segment(buf)  # chunked as the verifier's, for the replays' starting points
            segments.setdefault(n.node, []).append((layout.first_zxid, str(path)))
            chunk_starts[str(path)] = tuple(c.start for c in layout.chunks)
            prev = layout.prev_zxid
            for chunk in layout.chunks:
                cols = decode_chunk(memoryview(buf)[chunk.start:chunk.end], chunk.start, chunk.end, prev,
                                    with_txn=False)  # as the verifier: its checks do not use type and path
                _tally(cols, seen, counts)
                last_ok = bool(cols.zxids) and (not cols.bad_offsets or cols.offsets[-1] > cols.bad_offsets[-1])
                prev = cols.zxids[-1] if last_ok else None
                if cols.zxids:
                    tops[n.node] = max(tops.get(n.node, 0), cols.zxids[-1])
    majority = len(nodes) // 2 + 1
    c = max((z for z, (_, _, k) in seen.items() if k >= majority), default=0)
    zxids = len(seen)
    # Freed before the replays, as a careful single-process scan would: millions of tracked tuples
    # left alive would make every garbage collection during the replays walk them all.
    del seen
    replay_started = time.monotonic()
    digests = _replay(nodes, segments, tops, c, chunk_starts)
    differing = sum(1 for d in digests.values() if len(set(d)) > 1)
    return {**counts, "zxids": zxids, "c": c, "replay_digest_mismatches": differing,
            "replayed_checkpoints": len(digests), "seconds": time.monotonic() - started,
            "replay_s": time.monotonic() - replay_started}


def _tally(cols, seen: dict, counts: dict) -> None:  # noqa: ANN001 - ChunkColumns
    counts["records"] += len(cols.zxids) + len(cols.bad_offsets)
    counts["bad"] += len(cols.bad_offsets)
    counts["misordered"] += sum(1 for o in cols.orders if ORDER_NAMES[o] not in (ORDER_OK, ORDER_UNKNOWN))
    for zxid, hi, lo, prev in zip(cols.zxids, cols.hash_hi, cols.hash_lo, cols.prevs):
        digest = (hi, lo)
        known = seen.get(zxid)
        if known is None:
            seen[zxid] = (digest, prev, 1)
            continue
        counts["differing"] += known[0] != digest
        counts["forks"] += known[1] != prev and prev >= 0 and known[1] >= 0
        seen[zxid] = (known[0], known[1], known[2] + 1)


def _replay(nodes, segments: dict, tops: dict, c: int,  # noqa: ANN001
            chunk_starts: dict[str, tuple[int, ...]]) -> dict[int, list[str]]:
    snaps: dict[int, list[int]] = {}
    paths: dict[tuple[int, int], str] = {}
    digests: dict[int, list[str]] = {}
    for n in nodes:
        for path in sorted((Path(n.path) / SNAPSHOT_DIR).glob("snapshot.*")):
            zxid = int(path.name.split(".")[1], 16)
            info = check_snapshot(path.read_bytes(), zxid, str(path))
            if info.status == "ok":
                snaps.setdefault(n.node, []).append(zxid)
                paths[(n.node, zxid)] = str(path)
                digests.setdefault(zxid, []).append(info.digest)
    checkpoints = {z for zs in snaps.values() for z in zs} | set(tops.values()) | {c}
    bases = {n.node: 0 for n in nodes}
    for task in plan_replays(segments, snaps, paths, bases, tops, checkpoints, chunk_starts):
        for row in run_task(task):
            if row.digest is not None:
                digests.setdefault(row.zxid, []).append(row.digest)
    return digests


if __name__ == "__main__":
    print(json.dumps(scan(sys.argv[1:])))
