"""The admin port's status page in a real headless browser (Debian's chromium), against a real
cluster: what it shows of the nodes, bookies and plots, and after the leader is SIGKILLed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser

import pytest

from cluster_fixtures import Cluster, copy_config, kazoo_session, leader_of, start_cluster, wait_for
from clusterd import localcluster

pytestmark = pytest.mark.multiprocess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    if CHROMIUM is None:
        pytest.skip("no chromium (Debian's chromium package; .ci/run installs it)")
    c = Cluster(copy_config(tmp_path_factory.mktemp("page")))
    start_cluster(c)
    yield c
    c.down()


class Rows(HTMLParser):
    """The data-* attributes of every table row and plot in the rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []
        self.plots: dict[str, int] = {}
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "tr" and any(k.startswith("data-") for k in a):
            self.rows.append(a)
        if tag == "svg" and "data-points" in a:
            self.plots[a["id"]] = int(a["data-points"])

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def render(cluster: Cluster, node_id: int, budget_ms: int = 9000) -> Rows:
    """The page as chromium has it after `budget_ms` of virtual time (a few polls)."""
    node = next(n for n in cluster.config.nodes if n.id == node_id)
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", f"--virtual-time-budget={budget_ms}", "--dump-dom",
                           f"http://{node.host}:{node.admin_port}/"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = Rows()
    rows.feed(done.stdout)
    return rows


def nodes(rows: Rows) -> dict[str, dict[str, str]]:
    return {r["data-node"]: r for r in rows.rows if "data-health" in r}


def test_the_page_shows_roles_bookies_and_plots_and_a_killed_leader(cluster: Cluster) -> None:
    leader = leader_of(cluster)
    follower = next(n.id for n in cluster.config.nodes if n.id != leader)
    with kazoo_session(cluster) as zk:
        for i in range(50):
            zk.create(f"/page-{i}", b"x")
    page = render(cluster, follower)
    shown = nodes(page)
    assert sorted(shown) == sorted(str(n.id) for n in cluster.config.nodes)
    assert all(r["data-health"] == "up" for r in shown.values())
    assert sorted(r["data-role"] for r in shown.values()) == ["follower", "follower", "leader"]
    assert shown[str(leader)]["data-role"] == "leader"
    bookies = {r["data-bookie"]: r["data-state"] for r in page.rows if "data-bookie" in r}
    assert bookies == {str(n.id): "writable" for n in cluster.config.nodes if n.is_bookie}
    assert set(page.plots) == {"plot-commits", "plot-requests", "plot-latency", "plot-adds"}
    assert page.plots["plot-requests"] >= 1  # two polls at least: a rate
    assert f"from node {follower}" in "".join(page.text)

    pid = localcluster.read_pid_file(next(n for n in cluster.config.nodes if n.id == leader))
    os.kill(pid, signal.SIGKILL)
    try:
        def new_leader_shown() -> bool:
            shown = nodes(render(cluster, follower, budget_ms=3000))
            return (shown[str(leader)]["data-health"] == "down"
                    and [r.get("data-role") for r in shown.values()].count("leader") == 1)
        assert wait_for(new_leader_shown, 60)
        page = render(cluster, follower, budget_ms=3000)
        bookies = {r["data-bookie"]: r["data-state"] for r in page.rows if "data-bookie" in r}
        assert bookies[str(leader)] == "down"
    finally:
        start_cluster(cluster)
