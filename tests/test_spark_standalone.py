"""`spark-submit --master spark://...` runs `verify zab` on that cluster: a Spark standalone
master and one worker (1 core, 1 GiB), started here from the venv's pyspark on loopback, take
the job; its tasks run in the worker's executor, not in the driver.

The logs verified are verify_fixtures.py's real run (a 3-node metastore that lived through a
leader SIGKILL). Master and worker are stopped, with their process groups (the executor and
its Python workers are the worker's children), whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest

from clusterd import localcluster
from cluster_fixtures import ENV, REPO
from verify_fixtures import NODES, real_run  # noqa: F401 - real_run is the fixture this module uses

pytestmark = pytest.mark.multiprocess

SPARK_HOME = Path(pyspark.__file__).parent
HOST = "127.0.0.1"
SPARK_ENV = {**ENV, "SPARK_LOCAL_IP": HOST, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
START_TIMEOUT_S = 180.0  # two JVMs starting on a busy 2-core machine; the usual is seconds
STOP_TIMEOUT_S = 30.0


@dataclass
class Standalone:
    url: str  # spark://127.0.0.1:PORT
    web: str  # the master's web UI, whose /json/ describes workers and applications
    work_dir: Path  # the worker's: one directory per application, one per executor in it
    logs: Path

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.web}/json/", timeout=10) as answer:
            return json.load(answer)


def _start(name: str, args: list[str], logs: Path, env: dict[str, str]) -> subprocess.Popen:
    out = (logs / f"{name}.log").open("wb")
    try:
        return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=logs,
                                start_new_session=True)  # its own process group: stopped as one
    finally:
        out.close()


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
            if sig == signal.SIGTERM:
                os.killpg(proc.pid, signal.SIGKILL)  # anything of the group left behind
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def _wait_for_worker(cluster: Standalone, procs: dict[str, subprocess.Popen]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    state: dict | str = "no answer yet"
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            assert proc.poll() is None, f"the {name} exited:\n" + localcluster.tail(cluster.logs / f"{name}.log", 40)
        try:
            state = cluster.state()
        except OSError as e:  # the web UI is not up yet
            state = repr(e)
        else:
            if any(w["state"] == "ALIVE" for w in state["workers"]):
                return
        time.sleep(0.5)
    raise AssertionError(f"no worker registered with the master: {state}\n"
                         + localcluster.tail(cluster.logs / "worker.log", 40))


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    logs, work_dir, scratch = tmp_path / "logs", tmp_path / "work", tmp_path / "scratch"
    for folder in (logs, work_dir, scratch):
        folder.mkdir()
    port, web_port, worker_web_port = localcluster.free_ports(3)
    env = {**SPARK_ENV, "SPARK_LOCAL_DIRS": str(scratch), "SPARK_WORKER_DIR": str(work_dir)}
    cluster = Standalone(f"spark://{HOST}:{port}", f"http://{HOST}:{web_port}", work_dir, logs)
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["master"] = _start("master", ["org.apache.spark.deploy.master.Master", "--host", HOST,
                                            "--port", str(port), "--webui-port", str(web_port)], logs, env)
        procs["worker"] = _start("worker", ["org.apache.spark.deploy.worker.Worker", cluster.url, "--host", HOST,
                                            "--cores", "1", "--memory", "1g", "--work-dir", str(work_dir),
                                            "--webui-port", str(worker_web_port)], logs, env)
        _wait_for_worker(cluster, procs)
        yield cluster
    finally:
        for proc in reversed(procs.values()):
            _stop(proc)


@pytest.mark.timeout(900)
def test_spark_submit_runs_verify_zab_on_a_standalone_cluster(standalone: Standalone, real_run: Path):
    submit = SPARK_HOME / "bin" / "spark-submit"
    done = subprocess.run([str(submit), "--master", standalone.url, "--conf", "spark.executor.memory=512m",
                           "--conf", "spark.cores.max=1", "--conf", "spark.driver.memory=512m",
                           str(REPO / "replay" / "verify_zab.py"), *(str(real_run / f"node{n}") for n in NODES),
                           "--json"], capture_output=True, text=True, env=SPARK_ENV, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = json.loads(done.stdout[done.stdout.index("{\n"):])  # after the driver's progress lines
    assert verdict["passed"], done.stdout[-3000:]
    assert verdict["facts"]["spark master"] == standalone.url
    assert "[Stage" not in done.stdout + done.stderr  # no progress bar unless spark-submit's --conf asks
    app = verdict["facts"]["spark application"]
    # The master ran the application to its end, with the worker's core...
    finished = {a["id"]: a for a in standalone.state()["completedapps"]}
    assert app in finished and finished[app]["state"] == "FINISHED", standalone.state()
    # ...and the tasks ran in the worker's executor: its log, in the worker's work dir, tells.
    executor_logs = sorted((standalone.work_dir / app).glob("*/stderr"))
    assert executor_logs, sorted(p.name for p in standalone.work_dir.iterdir())
    executor_log = "\n".join(p.read_text(errors="replace") for p in executor_logs)
    assert "Running task" in executor_log and "Finished task" in executor_log, executor_log[-3000:]
    # The project's packages reached it with the job (build_session's addPyFile), as on other hosts.
    assert all((log.parent / "quire.zip").is_file() for log in executor_logs)
