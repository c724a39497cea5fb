"""Real hosts on one machine: each clusterd node in a network namespace of its own, with its own address.

The rig (root only; iproute2's `ip netns`, veth pairs and a bridge):

    namespace <p>sw (the switch)     bridge <p>br, one port <p>sN per node and <p>sc for the client
    namespace <p>nN (node N)         <p>eN = 10.77.0.(10+N)/24, lo; `clusterd --id N` runs here
    namespace <p>cl (the client)     <p>ec = 10.77.0.2/24, lo; the test's kazoo and ledger clients

`<p>` is `q<pid>` (then `x<n>` for a process's n-th rig after its first), so interface names stay
within 15 characters, two test processes never meet, and every name the rig made is found again
at teardown. Nothing is created in the machine's own namespace: each veth is created with its
ends already in their namespaces, and addresses exist only inside them. `close()` stops the
nodes and deletes the namespaces (which takes every veth and the bridge with them), also when a
test failed; it also removes anything left in the root namespace under the prefix.

cluster.toml gives each node `host` = its namespace address, the shipped ports (every node has
an address of its own, so the ports need not differ) and data under the rig's folder; a node of
`bind_hosts` gets that `bind_host` (e.g. "0.0.0.0", as in a container).

Partitions: `isolate(n)` sets the switch's port of node n down: the cable is pulled at the switch,
so node n's link loses carrier and its packets (and everyone's packets to it) are dropped, with
no error anyone's socket sees at once: connections hang and time out, as on a real network.
`heal(n)` sets it up again. One-way loss: `lose_one_way(n, to)` gives node n's neighbour table
a MAC nobody has for each of `to`, so what n sends them is dropped and what they send n arrives.
This kernel has no netem qdisc, no tc classifiers or actions, no iptables or nftables, so delay,
reordering and duplication cannot be made here.

The test process reaches the nodes from the client namespace: `with rig.client():` enters it
in the calling thread (setns(2) through ctypes: Python 3.11 has no os.setns) and returns to the
original namespace at the end. Threads started inside the block (kazoo's, a SyncLedgerClient's
trio loop) are born in the client namespace and stay there; sockets keep the namespace they were
created in. `with rig.inside(n):` enters node n's namespace the same way: a client on the same
machine as node n, on its side of a partition.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from clusterd import config as cfg
from clusterd import localcluster
from edge.files import ensure_directory

REPO = Path(__file__).resolve().parent.parent
CLONE_NEWNET = 0x40000000
SUBNET = "10.77.0"
CLIENT_ADDRESS = f"{SUBNET}.2"
# The shipped ports: every node has an address of its own, so they may be the same on every node.
PORTS = {"peer_port": 2888, "client_port": 2181, "admin_port": 8080, "bookie_port": 3181}
_RIGS = itertools.count()
NOWHERE_MAC = "02:00:00:00:00:01"  # locally administered, on no interface of the rig


class RigError(Exception):
    """The rig could not build or change its network; the message has the failed command."""


def unavailable_reason() -> str | None:
    """Why the rig cannot run here (not root, no `ip`, `ip netns` refused), or None."""
    if os.geteuid() != 0:
        return "the netns rig needs root (ip netns, veth pairs, a bridge)"
    if shutil.which("ip") is None:
        return "the netns rig needs iproute2's `ip`"
    probe = f"q{os.getpid()}probe"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RigError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


class NetnsRig:
    """Namespaces, a bridge and veths for `node_roles` (id -> roles); nodes run inside them."""

    def __init__(self, folder: Path, node_roles: dict[int, list[str]], *, cluster_settings: str = "",
                 bind_hosts: dict[int, str] | None = None) -> None:
        self.prefix = f"q{os.getpid()}" + (f"x{n}" if (n := next(_RIGS)) else "")
        assert len(self.prefix) + 3 <= 15, self.prefix  # <p>br, <p>sN, <p>eN, ...: interface names
        self.folder = folder
        self.switch = f"{self.prefix}sw"
        self.client_ns = f"{self.prefix}cl"
        self.node_ids = sorted(node_roles)
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.path = self._write_config(node_roles, cluster_settings, bind_hosts or {})
        self.config = cfg.load(self.path)

    # -- building and tearing down --------------------------------------------------------------
    def node_ns(self, node_id: int) -> str:
        return f"{self.prefix}n{node_id}"

    def address(self, node_id: int) -> str:
        return f"{SUBNET}.{10 + node_id}"

    def build(self) -> NetnsRig:
        try:
            ip("netns", "add", self.switch)
            ip("-n", self.switch, "link", "add", f"{self.prefix}br", "type", "bridge", "forward_delay", "0")
            ip("-n", self.switch, "link", "set", f"{self.prefix}br", "up")
            for node_id in self.node_ids:
                self._plug(self.node_ns(node_id), f"s{node_id}", f"e{node_id}", self.address(node_id))
            self._plug(self.client_ns, "sc", "ec", CLIENT_ADDRESS)
        except BaseException:
            self.close()
            raise
        return self

    def _plug(self, namespace: str, switch_end: str, host_end: str, address: str) -> None:
        """A namespace with `address` on a veth whose other end is a port of the switch's bridge."""
        p = self.prefix
        ip("netns", "add", namespace)
        ip("-n", namespace, "link", "set", "lo", "up")
        ip("link", "add", f"{p}{host_end}", "netns", namespace, "type", "veth",
           "peer", "name", f"{p}{switch_end}", "netns", self.switch)
        ip("-n", self.switch, "link", "set", f"{p}{switch_end}", "master", f"{p}br")
        ip("-n", self.switch, "link", "set", f"{p}{switch_end}", "up")
        ip("-n", namespace, "addr", "add", f"{address}/24", "dev", f"{p}{host_end}")
        ip("-n", namespace, "link", "set", f"{p}{host_end}", "up")

    def close(self) -> None:
        """SIGKILL every node still running, then delete every namespace and link under the prefix."""
        for node_id in list(self.children):
            self.kill(node_id)
        for namespace in ip("netns", "list").split("\n"):
            name = namespace.split(" ")[0]
            if name.startswith(self.prefix) and name[len(self.prefix):len(self.prefix) + 1] in ("s", "n", "c"):
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
        for line in ip("-o", "link", "show").splitlines():  # nothing should be here; if it is, it goes
            name = line.split(":")[1].strip().split("@")[0]
            if name.startswith(self.prefix) and name[len(self.prefix):len(self.prefix) + 1] in ("s", "e", "b"):
                subprocess.run(["ip", "link", "del", name], capture_output=True)

    def leftovers(self) -> list[str]:
        """Namespaces and root-namespace links still named with the prefix (none after close)."""
        names = [line.split(" ")[0] for line in ip("netns", "list").splitlines()]
        names += [line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link", "show").splitlines()]
        return [n for n in names if n.startswith(self.prefix)]

    # -- the cluster ----------------------------------------------------------------------------
    def _write_config(self, node_roles: dict[int, list[str]], cluster_settings: str,
                      bind_hosts: dict[int, str]) -> Path:
        text = (REPO / "cluster.toml").read_text()
        head = text[:text.index("[[node]]")].replace('name = "quire-local"', 'name = "quire-netns"')
        head = head.replace("[cluster]\n", "[cluster]\n" + cluster_settings, 1)
        tables = []
        for node_id, roles in sorted(node_roles.items()):
            ports = {k: v for k, v in PORTS.items() if k != "bookie_port" or "bookie" in roles}
            bind = f'bind_host = "{bind_hosts[node_id]}"\n' if node_id in bind_hosts else ""
            tables.append(f'[[node]]\nid = {node_id}\nhost = "{self.address(node_id)}"\n{bind}'
                          + "".join(f"{k} = {v}\n" for k, v in ports.items())
                          + f'roles = {json.dumps(roles)}\ndata_dir = "data/node{node_id}"\n')
        path = self.folder / "cluster.toml"
        path.write_text(head + "\n".join(tables))
        return path

    def start(self, node_id: int) -> None:
        """`clusterd --id N` inside node N's namespace, output appended to <data_dir>/clusterd.log."""
        node = self.config.node(node_id)
        ensure_directory(node.data_dir)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        command = ["ip", "netns", "exec", self.node_ns(node_id), sys.executable, "-m", "clusterd.daemon.main",
                   "--id", str(node_id), "--config", str(self.path), "--log-level", "info"]
        with open(localcluster.log_path(node), "ab") as log:
            # `ip netns exec` execs the command: the child's pid is the daemon's.
            self.children[node_id] = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                                      stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def start_all(self) -> None:
        for node_id in self.node_ids:
            self.start(node_id)

    def kill(self, node_id: int) -> None:
        """SIGKILL node N (a crash) and reap it."""
        child = self.children.pop(node_id)
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        child.wait()

    def stop(self, node_id: int, timeout_s: float = 10) -> int:
        """SIGTERM node N, SIGKILL after the timeout; its exit status (0: a clean stop)."""
        return self.stop_all([node_id], timeout_s)[node_id]

    def stop_all(self, node_ids: list[int] | None = None, timeout_s: float = 10) -> dict[int, int]:
        """SIGTERM the running nodes (or `node_ids`) at once, then reap each (SIGKILL after the timeout)."""
        stopping = {i: self.children.pop(i) for i in (node_ids or list(self.children))}
        for child in stopping.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in stopping.values():
            try:
                child.wait(timeout_s)
            except subprocess.TimeoutExpired:
                child.send_signal(signal.SIGKILL)
                child.wait()
        return {i: child.returncode for i, child in stopping.items()}

    def assert_running(self) -> None:
        for node_id, child in self.children.items():
            assert child.poll() is None, (f"node {node_id} exited with {child.returncode}:\n"
                                          + localcluster.tail(localcluster.log_path(self.config.node(node_id)), 40))

    # -- partitions -----------------------------------------------------------------------------
    def isolate(self, node_id: int) -> None:
        """Pull node N's cable at the switch: nothing reaches it, nothing it sends arrives."""
        ip("-n", self.switch, "link", "set", f"{self.prefix}s{node_id}", "down")

    def heal(self, node_id: int) -> None:
        ip("-n", self.switch, "link", "set", f"{self.prefix}s{node_id}", "up")

    def lose_one_way(self, frm: int, to: list[int]) -> None:
        """Asymmetric loss: from now on everything node `frm` sends to `to` is lost, while what
        they send it arrives. Its neighbour entry for each of them names a MAC nobody has, so the
        bridge floods those frames and every port drops them (no netem or packet filter needed:
        this kernel has neither). TCP then loses its ACKs too, as on a real one-way fault."""
        for node_id in to:
            ip("-n", self.node_ns(frm), "neigh", "replace", self.address(node_id), "lladdr", NOWHERE_MAC,
               "nud", "permanent", "dev", f"{self.prefix}e{frm}")

    def restore_one_way(self, frm: int, to: list[int]) -> None:
        for node_id in to:
            ip("-n", self.node_ns(frm), "neigh", "del", self.address(node_id), "dev", f"{self.prefix}e{frm}")

    # -- being somewhere ------------------------------------------------------------------------
    @contextmanager
    def client(self) -> Iterator[None]:
        """The calling thread in the client namespace for the block (and threads it starts, for good)."""
        with self._entered(self.client_ns):
            yield

    @contextmanager
    def inside(self, node_id: int) -> Iterator[None]:
        """The calling thread in node N's namespace: a client beside node N, on its side of a partition."""
        with self._entered(self.node_ns(node_id)):
            yield

    @contextmanager
    def _entered(self, namespace: str) -> Iterator[None]:
        original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        try:
            self._setns(target, namespace)
            try:
                yield
            finally:
                self._setns(original, "the original namespace")
        finally:
            os.close(target)
            os.close(original)

    def _setns(self, fd: int, what: str) -> None:
        if self._libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise RigError(f"setns into {what}: {os.strerror(err)}")

    # -- observing (call inside client()) -------------------------------------------------------
    def statuses(self, node_ids: list[int] | None = None) -> dict[int, dict | None]:
        """Each node's admin /status (None: it does not answer), fetched from the calling thread's namespace."""
        wanted = set(node_ids or self.node_ids)
        got = trio.run(lambda: localcluster.fetch_statuses(self.config, timeout_s=1.0))
        return {i: s for i, s in got.items() if i in wanted}

    def wait_settled(self, node_ids: list[int] | None = None, timeout_s: float = 30) -> dict[int, dict]:
        """Until `node_ids` (default all) answer, one leads, the others follow it and bookies are registered."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.assert_running()
            statuses = self.statuses(node_ids)
            if localcluster.is_settled(statuses):
                return statuses  # type: ignore[return-value]
            if time.monotonic() > deadline:
                raise AssertionError(f"not settled after {timeout_s} s: "
                                     + "; ".join(f"{i}: {_brief(s)}" for i, s in statuses.items()))
            time.sleep(0.1)

    def leader(self, statuses: dict[int, dict | None]) -> int:
        leaders = [i for i, s in statuses.items() if s is not None and s["role"] == "leader"]
        assert len(leaders) == 1, {i: _brief(s) for i, s in statuses.items()}
        return leaders[0]

    def client_hosts(self, node_ids: list[int] | None = None) -> str:
        """kazoo's hosts string for the voters (or `node_ids`)."""
        return ",".join(f"{n.host}:{n.client_port}" for n in self.config.ensemble
                        if node_ids is None or n.id in node_ids)


def _brief(status: dict | None) -> str:
    if status is None:
        return "no answer"
    return f"{status['role']} epoch {status.get('epoch')} committed {status.get('last_committed_zxid')}"


@contextmanager
def netns_rig(folder: Path, node_roles: dict[int, list[str]], **options) -> Iterator[NetnsRig]:
    """A built rig, skipped (with the reason) where namespaces cannot be made; always torn down."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    rig = NetnsRig(folder, node_roles, **options).build()
    try:
        yield rig
    finally:
        rig.close()
