"""The verifiers' progress display: Spark's own console progress bar (`[Stage 0:=====>  (1 + 1) / 2]`
on stderr), on when stderr is a terminal or with `--progress`, off otherwise.

Each case starts a driver process of its own (the bar is made with the SparkContext, from its
conf) whose stderr is a pseudo-terminal or a pipe, and runs one job whose two tasks sleep 2 s
each on one core: the stage outlasts the half second after which Spark first draws the bar, on
any machine, so whether the bar shows depends only on the setting. (Under spark-submit the
driver's stderr is a pipe to spark-submit whatever spark-submit's own is, so there the default
leaves it to spark-submit's --conf: test_spark_standalone.py's run shows no bar.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from replay.spark_session import console_progress
from replay.verify_zab import add_arguments
from cluster_fixtures import ENV, REPO

BAR = b"[Stage 0:"
DRIVER = """
import argparse, sys, time
from replay.spark_session import build_session
from replay.verify_zab import add_arguments
parser = argparse.ArgumentParser()
add_arguments(parser)
args = parser.parse_args(["DIR", *sys.argv[1:]])
spark = build_session("local[1]", app_name="quire-progress-test", progress=args.progress)
spark.sparkContext.parallelize(range(2), 2).foreach(lambda _: time.sleep(2))
spark.stop()
"""
TIMEOUT_S = 300


def _env() -> dict[str, str]:
    env = {**ENV, "PYSPARK_PYTHON": sys.executable}
    env.pop("PYSPARK_GATEWAY_PORT", None)  # not under spark-submit
    env.pop("COLUMNS", None)
    return env


def stderr_on_a_pipe(*options: str) -> bytes:
    done = subprocess.run([sys.executable, "-c", DRIVER, *options], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, env=_env(), timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def stderr_on_a_terminal(*options: str) -> bytes:
    main, terminal = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, *options], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=terminal, cwd=REPO, env=_env())
    finally:
        os.close(terminal)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: every process holding the terminal (driver, JVM, workers) is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(main)
    assert proc.wait(timeout=TIMEOUT_S) == 0, b"".join(chunks)[-3000:]
    return b"".join(chunks)


def test_the_option_decides_and_without_it_a_terminal_does():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    asked = [parser.parse_args(["DIR", *options]).progress for options in ((), ("--progress",), ("--no-progress",))]
    assert asked == [None, True, False]
    assert console_progress(True) is True and console_progress(False) is False
    # Under pytest stderr is a capture file or, with -s, maybe a terminal: whichever, it decides.
    assert console_progress(None) == sys.stderr.isatty()


@pytest.mark.multiprocess  # a driver and its JVM per case: about 30 s each here, not for the quick tier
@pytest.mark.parametrize("terminal, options, drawn", [
    (True, (), True),  # the default, at a terminal
    (False, (), False),  # the default, into a pipe (CI logs, tests)
    (False, ("--progress",), True),  # asked for, into a pipe
])
def test_spark_draws_its_progress_bar_as_the_setting_says(terminal: bool, options: tuple[str, ...], drawn: bool):
    stderr = (stderr_on_a_terminal if terminal else stderr_on_a_pipe)(*options)
    assert (BAR in stderr) == drawn, stderr[-3000:]
