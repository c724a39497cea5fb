#!/usr/bin/env bash
# Quickstart, main job: install Quire into ./.venv, then run `clusterctl demo`:
# a fresh local 3-node cluster writes through a SIGKILL of its leader and checks every write.
# Extra arguments go to the demo, e.g. `bash scripts/demo.sh --kill follower`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
exec .venv/bin/clusterctl demo "$@"
