"""The two systems bench/large_tree.py compares, behind one interface (`System`): a 3-node Quire cluster
of voters (`QuireSystem`, bench/quire.py) and a 3-server ZooKeeper ensemble (`ZkSystem`, bench/zk.py),
with `srvr` read over the four-letter-word port."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from bench import processes, zk
from bench.quire import QuireCluster

SERVING_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0


def srvr(port: int) -> dict[str, str]:
    """`srvr` as key -> value ("Zxid", "Mode", "Node count", ...); empty while the server does not serve."""
    answer = zk.four_letter_word(port, "srvr", timeout_s=2.0) or ""
    return dict((k.strip(), v.strip()) for k, v in (line.split(":", 1) for line in answer.splitlines() if ":" in line))


def srvr_state(port: int) -> tuple[int, int, str] | None:
    """(zxid, node count, mode) per `srvr`, or None while not serving."""
    s = srvr(port)
    try:
        return int(s["Zxid"], 16), int(s["Node count"]), s.get("Mode", "")
    except (KeyError, ValueError):
        return None


class System:
    name = ""
    ids: list[int]

    def port(self, i: int) -> int: ...
    def start(self, i: int | None = None) -> None: ...
    def pids(self) -> dict[str, int]: ...

    def proc(self, i: int) -> subprocess.Popen[bytes]:
        return self._procs()[i]

    def label(self, i: int) -> str: ...
    def log_path(self, i: int) -> Path: ...
    def wipe(self, i: int) -> None: ...
    def wait_serving(self) -> int: ...

    def hosts(self, i: int | None = None) -> str:
        return ",".join(f"127.0.0.1:{self.port(j)}" for j in ([i] if i is not None else self.ids))

    def crashed(self) -> dict[int, int]:
        return {i: p.returncode for i in self.ids if (p := self._procs().get(i)) is not None
                and p.returncode is not None and p.returncode not in (0, -15, 143)}

    def _procs(self) -> dict[int, subprocess.Popen[bytes]]: ...

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> tuple[dict[str, float], list[str]]:
        """SIGTERM every server, wait; returns how long each took to exit and those that needed SIGKILL."""
        procs = {self.label(i): p for i, p in self._procs().items() if p.poll() is None}
        t0 = time.monotonic()
        for p in procs.values():
            p.terminate()
        took, killed = {}, []
        for name, p in procs.items():
            try:
                p.wait(timeout=max(0.1, t0 + timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                killed.append(name)
            took[name] = time.monotonic() - t0
        return took, killed

    def stop_one(self, i: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
        p = self._procs()[i]
        p.terminate()
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            processes.kill(p)

    def close(self) -> None:
        processes.stop_all(self._procs().values(), 15.0)


class QuireSystem(System):
    name = "Quire"

    def __init__(self, folder: Path) -> None:
        self.cluster = QuireCluster(folder, bookies=False)  # voters only: the metastore and Zab, no bookie
        self.ids = sorted(self.cluster.nodes)

    def port(self, i: int) -> int:
        return self.cluster.nodes[i].client_port

    def start(self, i: int | None = None) -> None:
        self.cluster.start(i)

    def _procs(self) -> dict[int, subprocess.Popen[bytes]]:
        return self.cluster.procs

    def pids(self) -> dict[str, int]:
        return self.cluster.pids()

    def label(self, i: int) -> str:
        return f"node{i}"

    def log_path(self, i: int) -> Path:
        return self.cluster.log_path(i)

    def wait_serving(self) -> int:
        return trio.run(lambda: _quire_leader(self.cluster))

    def wipe(self, i: int) -> None:
        data = self.cluster.nodes[i].data_dir
        for entry in data.iterdir():
            if entry == self.log_path(i):
                continue
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    @property
    def snapshot_every(self) -> int:
        return self.cluster.config.snapshot_every_txns

    def status(self, i: int) -> dict[str, Any] | None:
        return trio.run(lambda: self.cluster.status(i, timeout_s=5.0))

    def snapshot_dir(self, i: int) -> Path:
        return self.cluster.nodes[i].data_dir / "snapshots"


async def _quire_leader(cluster: QuireCluster) -> int:
    statuses = await cluster.wait_all_broadcast(timeout_s=SERVING_TIMEOUT_S)
    return next(nid for nid, s in statuses.items() if s and s["role"] == "leader")


class ZkSystem(System):
    name = "ZooKeeper"

    def __init__(self, folder: Path, heap: str) -> None:
        options = tuple(o for o in zk.JVM_OPTIONS if not o.startswith("-Xmx")) + (f"-Xmx{heap}",)
        self.ensemble = zk.ZkEnsemble(folder, jvm_options=options)
        self.ids = list(self.ensemble.ids)

    def port(self, i: int) -> int:
        return self.ensemble.client_ports[i]

    def start(self, i: int | None = None) -> None:
        self.ensemble.start(i)

    def _procs(self) -> dict[int, subprocess.Popen[bytes]]:
        return self.ensemble.procs

    def pids(self) -> dict[str, int]:
        return self.ensemble.pids()

    def label(self, i: int) -> str:
        return f"zk{i}"

    def log_path(self, i: int) -> Path:
        return self.ensemble.log_path(i)

    def wait_serving(self) -> int:
        return self.ensemble.wait_serving(timeout_s=SERVING_TIMEOUT_S)

    def wipe(self, i: int) -> None:
        data = self.ensemble.data_dir(i)
        for entry in data.iterdir():
            if entry.name == "myid":
                continue
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

