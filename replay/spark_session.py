"""The SparkSession the verifiers run on: local mode by default, any master by URL.

Python workers must import this project (replay, zab, metastore) and run the
driver's interpreter: in local mode they use `sys.executable`, which has the
project installed; with another master the packages are zipped and shipped with
the job (`addPyFile`), and the executors' Python must have `crc32c` installed.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parent.parent
SHIPPED_PACKAGES = ("replay", "zab", "metastore", "ledger", "bookie")
DEFAULT_MASTER = "local[*]"


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def build_session(master: str = DEFAULT_MASTER, *, app_name: str = "quire-verify", shuffle_partitions: int | None = None,
                  driver_memory: str | None = None) -> SparkSession:
    """A SparkSession for the verifiers (getOrCreate: an existing session is reused as is).

    The UI is off and logs are quiet; `shuffle_partitions` defaults to twice the
    local cores (small inputs do not need Spark's 200).
    """
    cores = os.cpu_count() or 2
    # PySpark starts local workers with $PYSPARK_PYTHON (default: python3 on the PATH,
    # which may lack this project's dependencies); the driver's own interpreter has them.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 2 * cores))
               # One Python worker per core is reused across tasks: startup is paid once.
               .config("spark.python.worker.reuse", "true"))
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not is_local(master):
        spark.sparkContext.addPyFile(str(_zip_packages()))
    return spark


def _zip_packages() -> Path:
    """The project's Python packages in one zip, for executors on other machines."""
    target = Path(tempfile.mkdtemp(prefix="quire-verify-")) / "quire.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in SHIPPED_PACKAGES:
            for path in sorted((REPO / package).rglob("*.py")):
                archive.write(path, path.relative_to(REPO))
    return target
