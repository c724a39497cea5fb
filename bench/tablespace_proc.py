"""A load process of bench/tablespace.py: `put` through the table service or `setdata` on the
metastore, `--window` requests in flight, for `--seconds` after a second of warm-up; prints the
count acknowledged in the timed window as JSON.

    python -m bench.tablespace_proc put HOSTS_JSON TABLESPACE CLIENT_ID --window 32 --seconds 5
    python -m bench.tablespace_proc setdata HOSTS_JSON PATH_PREFIX CLIENT_ID --window 32 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import sys

import trio

from metastore.client import MetaClient
from tablespace.client import TableClient

VALUE = "x" * 100


async def _load(args: argparse.Namespace) -> dict:
    hosts = [tuple(h) for h in json.loads(args.hosts)]
    counting = {"on": False, "done": 0}
    async with MetaClient(hosts) as meta, TableClient(meta, args.target) as table:
        if args.mode == "put":

            async def one(i: int, n: int) -> None:
                await table.put("bench", f"{args.client}-{i}-{n % 1000}", VALUE)
        else:
            for i in range(args.window):
                await meta.ensure_path(f"{args.target}/{args.client}-{i}")

            async def one(i: int, n: int) -> None:
                await meta.set(f"{args.target}/{args.client}-{i}", VALUE.encode())

        async def worker(i: int) -> None:
            n = 0
            while True:
                await one(i, n)
                n += 1
                if counting["on"]:
                    counting["done"] += 1

        async with trio.open_nursery() as nursery:
            for i in range(args.window):
                nursery.start_soon(worker, i)
            await trio.sleep(1.0)
            counting["on"] = True
            start = trio.current_time()
            await trio.sleep(args.seconds)
            counting["on"] = False
            elapsed = trio.current_time() - start
            nursery.cancel_scope.cancel()
    return {"done": counting["done"], "seconds": elapsed}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tablespace_proc")
    p.add_argument("mode", choices=("put", "setdata"))
    p.add_argument("hosts")
    p.add_argument("target", help="the tablespace (put) or a znode path prefix (setdata)")
    p.add_argument("client")
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args(argv)
    print(json.dumps(trio.run(_load, args)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
