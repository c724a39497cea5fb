#!/usr/bin/env bash
# Quickstart, tests: install Quire and its test tools into ./.venv, then run the whole suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not multiprocess"`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
exec .venv/bin/python -m pytest "$@"
