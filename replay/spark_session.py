"""The SparkSession the verifiers run on: local mode by default, any master by URL.

Python workers must import this project (replay, zab, metastore) and run the
driver's interpreter: in local mode they use `sys.executable`, which has the
project installed; with another master the packages are zipped and shipped with
the job (`addPyFile`), and the executors' Python must have `crc32c` installed.
The driver's JVM needs Java 17 or newer: `require_java` checks it before Spark starts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from replay.verify_decode import VerifyInputError

REPO = Path(__file__).resolve().parent.parent
SHIPPED_PACKAGES = ("replay", "zab", "metastore", "ledger", "bookie", "stream", "tablespace", "edge")
DEFAULT_MASTER = "local[*]"
MIN_JAVA = 17  # the oldest Java that PySpark 4 runs on
JAVA_HINT = ("install Java 17+ (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) and put its `java` "
             "on PATH or set JAVA_HOME")
JAVA_VERSION_TIMEOUT_S = 60.0  # a JVM printing its version takes well under a second


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def submitted() -> bool:
    """Whether spark-submit started this driver: its JVM is up already, with the master it was
    given (PySpark connects to it through PYSPARK_GATEWAY_PORT instead of starting one)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(master: str | None = None, *, app_name: str = "quire-verify", shuffle_partitions: int | None = None,
                  driver_memory: str | None = None, progress: bool | None = None) -> SparkSession:
    """A SparkSession for the verifiers (getOrCreate: an existing session is reused as is).

    `master`: a master URL; None leaves it to spark-submit (its --master, as Spark users expect
    of a job), and without spark-submit it is local[*].

    The UI is off and logs are quiet; `shuffle_partitions` defaults to twice the
    local cores (small inputs do not need Spark's 200). `progress`: Spark's console progress
    bar (`[Stage 3:====>   (12 + 2) / 40]` on stderr, redrawn in place); None: see console_progress.
    """
    if SparkSession.getActiveSession() is None:
        require_java()
    cores = os.cpu_count() or 2
    # PySpark starts local workers with $PYSPARK_PYTHON (default: python3 on the PATH,
    # which may lack this project's dependencies); the driver's own interpreter has them.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is None and not submitted():
        master = DEFAULT_MASTER
    builder = SparkSession.builder if master is None else SparkSession.builder.master(master)
    builder = (builder.appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 2 * cores))
               # One Python worker per core is reused across tasks: startup is paid once.
               .config("spark.python.worker.reuse", "true"))
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    show = console_progress(progress)
    if show is not None:
        builder = builder.config("spark.ui.showConsoleProgress", str(show).lower())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from replay.spark_datasources import register  # imports this module's neighbours: here, not at the top
    register(spark)
    if not is_local(spark.sparkContext.master):
        spark.sparkContext.addPyFile(str(_zip_packages()))
    return spark


def console_progress(progress: bool | None) -> bool | None:
    """spark.ui.showConsoleProgress for `progress`: as asked when True or False. When None: on
    when stderr is a terminal (off into a file or a pipe, so logs stay clean), except under
    spark-submit, whose conf decides (`--conf spark.ui.showConsoleProgress=true`; Spark's default
    is off): there the driver's stderr is a pipe to spark-submit, whatever spark-submit's own is."""
    if progress is not None:
        return progress
    if submitted():
        return None
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # no stderr, or one without a descriptor
        return False


class JavaUnavailable(VerifyInputError):
    """No usable Java for Spark's JVM: the verifier stops before starting Spark, with a message
    saying what to install (exit status 2, as for any refused input)."""


def require_java(environ: Mapping[str, str] = os.environ) -> str:
    """The `java` Spark's launcher will start (JAVA_HOME/bin/java when JAVA_HOME is set, else
    `java` on PATH), once checked to be version MIN_JAVA or newer; raises JavaUnavailable
    otherwise, so that a missing or old Java is one line and not a PySpark traceback."""
    java = _java_command(environ)
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, errors="replace",
                              env=dict(environ), timeout=JAVA_VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise JavaUnavailable(f"cannot run `{java} -version` ({e}); {JAVA_HINT}") from None
    major = java_major_version(done.stderr + done.stdout)
    if major is None:
        raise JavaUnavailable(f"cannot tell which Java {java} is: `{java} -version` printed no version "
                              f"(exit status {done.returncode}); {JAVA_HINT}")
    if major < MIN_JAVA:
        raise JavaUnavailable(f"Spark needs Java {MIN_JAVA} or newer, but {java} is Java {major}; {JAVA_HINT}")
    return java


def _java_command(environ: Mapping[str, str]) -> str:
    home = environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if not os.access(java, os.X_OK):
            raise JavaUnavailable(f"Spark needs Java {MIN_JAVA} or newer, but JAVA_HOME={home} has no "
                                  f"bin/java; {JAVA_HINT}")
        return str(java)
    found = shutil.which("java", path=environ.get("PATH", os.defpath))
    if found is None:
        raise JavaUnavailable(f"Spark needs Java {MIN_JAVA} or newer, and there is no `java` on PATH "
                              f"(JAVA_HOME is not set); {JAVA_HINT}")
    return found


def java_major_version(version_output: str) -> int | None:
    """Java's major version in what `java -version` prints: `version "17.0.9"` is 17, `"21"`
    is 21, `"17-ea"` is 17, and the old scheme's `"1.8.0_392"` is 8; None without a version."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) is not None else major


def _zip_packages() -> Path:
    """The project's Python packages in one zip, for executors on other machines."""
    target = Path(tempfile.mkdtemp(prefix="quire-verify-")) / "quire.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in SHIPPED_PACKAGES:
            for path in sorted((REPO / package).rglob("*.py")):
                archive.write(path, path.relative_to(REPO))
    return target
