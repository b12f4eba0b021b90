#!/usr/bin/env bash
# HTTP benchmark driver (bench/http_bench.py): wrk -t2 -c64 -d10s --latency
# against GET /v1/models and one tensor's metadata (req/s, p99), and the
# tensor-bytes route over loopback for a whole model against the in-process
# reader (tensorvault bench) in the same run, with the ratio.
# Usage: bench/http.sh [--duration S] [--clients N] [--model-mib N] [--repeat N] [--json]
# Environment: TV_BENCH_DIR (default /tmp/tv-bench): where the checkpoint
# (cached) and the temp store live; TV_BUILD_DIR: use this build instead of
# building build/; TV_BENCH_LOCK: the lock every measurement holds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps >/dev/null
dir=${TV_BUILD_DIR:-$(scripts/build plain)}
command -v wrk >/dev/null || { echo "bench/http.sh: wrk is not installed (apt-get install wrk)" >&2; exit 1; }
exec .venv/bin/python bench/http_bench.py --build-dir "$dir" "$@"
