#!/usr/bin/env bash
# Run the benchmark suite, installing what it needs first:
#   Debian's zookeeper package (the reference server: jars only, started by bench/zk.py),
#   kazoo (ZooKeeper client) and py-spy (sampling profiler) from PyPI.
# Usage: bash bench/run.sh [--quick] [other options of `python -m bench.run`]
# PYTHON selects the interpreter (default: the one on PATH); it must have this project installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"

if ! ls /usr/share/java/zookeeper.jar >/dev/null 2>&1; then
    echo "bench: installing Debian's zookeeper package" >&2
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q zookeeper
fi
"$PYTHON" -c 'import kazoo' 2>/dev/null || "$PYTHON" -m pip install -q kazoo
"$PYTHON" -c 'import shutil, sys, pathlib; sys.exit(not (shutil.which("py-spy") or (pathlib.Path(sys.executable).parent / "py-spy").exists()))' \
    || "$PYTHON" -m pip install -q py-spy

exec "$PYTHON" -m bench.run "$@"
