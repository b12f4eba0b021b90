#!/usr/bin/env bash
# Fleet benchmark driver (bench/fleet_bench.py): pull throughput from a moto
# S3 endpoint and from a peer's blob route against curl downloading the same
# bytes, and a three-node rollout (origin or object-store bytes per model
# byte, time to switch every node against one node's import), all servers on
# loopback (PostgreSQL, moto and the HTTP origin started by the fleet tests'
# helpers).
# Usage: bench/fleet.sh [--mb N] [--repeat N] [--json]
# Environment: TV_BENCH_FLEET_MB (default 256): the model's size in MiB;
# TV_BENCH_DIR (default /tmp/tv-bench): where the models and stores live
# (deleted afterwards); TV_BUILD_DIR: use this build instead of building
# build/; TV_BENCH_LOCK: the lock every measurement holds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps >/dev/null
dir=${TV_BUILD_DIR:-$(scripts/build plain)}
command -v curl >/dev/null || { echo "bench/fleet.sh: curl is not installed (apt-get install curl)" >&2; exit 1; }
exec .venv/bin/python bench/fleet_bench.py --build-dir "$dir" "$@"
