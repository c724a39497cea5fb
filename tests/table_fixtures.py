"""Child processes for the table service's multi-process tests: replicas (`clusterctl table
serve`) and a client that puts and compare-and-sets, printing what was acknowledged."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from cluster_fixtures import ENV, REPO, Cluster

# argv: hosts JSON, tablespace, client id, rounds. Each round: a blind put of "<id>-<round>"
# (prints "PUT key version"), then an increment of "counter-<id>" by compare-and-set (prints
# "INC value" once acknowledged; its value and version + 1 are the increments applied). An
# outcome unknown prints "UNKNOWN op"; a version mismatch (an unknown increment that landed)
# "MISMATCH". Ends with "DONE".
CLIENT = r"""
import json, sys, trio
from metastore.client import MetaClient
from tablespace.client import TableClient
from tablespace.errors import OutcomeUnknown, VersionMismatch

hosts, ts, cid, rounds = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])

async def main():
    async with MetaClient([tuple(h) for h in hosts], session_timeout_ms=10000) as meta, \
            TableClient(meta, ts, timeout_s=60) as t:
        counter = f"counter-{cid}"
        for i in range(rounds):
            key = f"{cid}-{i}"
            try:
                print("PUT", key, await t.put("kv", key, f"v{i}"), flush=True)
            except OutcomeUnknown:
                print("UNKNOWN put", key, flush=True)
            found = await t.get("kv", counter)
            value, version = (0, -1) if found is None else (int(found[0]), found[1])
            try:
                await t.put("kv", counter, str(value + 1), expect=version)
                print("INC", value + 1, flush=True)
            except OutcomeUnknown:
                print("UNKNOWN inc", value + 1, flush=True)
            except VersionMismatch:
                print("MISMATCH", flush=True)
        print("DONE", flush=True)

trio.run(main)
"""


def spawn_client(cluster: Cluster, tablespace: str, cid: str, rounds: int) -> subprocess.Popen[str]:
    hosts = json.dumps(cluster.config.client_addresses())
    return subprocess.Popen([sys.executable, "-c", CLIENT, hosts, tablespace, cid, str(rounds)], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class ReplicaProcess:
    """`clusterctl table serve` in a child process; its log in `log_path`."""

    def __init__(self, cluster: Cluster, tablespace: str, replica: str, folder: Path, *extra: str) -> None:
        self.replica, self.log_path = replica, folder / f"replica-{replica}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "clusterd.ctl.main", "--config", str(cluster.path), "table", "serve", tablespace,
             "--replica", replica, "--listen", "127.0.0.1:0", *extra],
            cwd=cluster.path.parent, env=ENV, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("SERVING "), f"replica {replica} did not start: {line!r}\n{self.log_text()}"
        self.address = line.split()[1]

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def request(self, method: str, target: str, body: dict | None = None, timeout: float = 10) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{self.address}{target}", data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def status(self) -> dict:
        return self.request("GET", "/status")[1]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)
        self.log.close()


def wait_leader(replicas: list[ReplicaProcess], timeout_s: float = 30, exclude: ReplicaProcess | None = None
                ) -> ReplicaProcess:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in replicas:
            if r is exclude or r.proc.poll() is not None:
                continue
            try:
                if r.status()["role"] == "leader":
                    return r
            except OSError:
                pass
        time.sleep(0.1)
    raise AssertionError("no replica leads: " + "\n".join(r.log_text()[-2000:] for r in replicas))
