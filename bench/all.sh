#!/usr/bin/env bash
# Every benchmark in one run, each figure beside its reference measured in the
# same run: the small real model (all-MiniLM-L6-v2) vs the official loader and
# fio, time to first tensor vs fio 4 KiB latency, the 120k-tensor open
# (bench/all_bench.py); the large-model read figures (bench/read.sh: bench vs
# fio, --fresh vs pre-faulted, CPU-s/GB); the cold import (bench/import.sh);
# the daemon over HTTP (bench/http.sh: wrk req/s and p99 on /v1/models and a
# tensor-metadata route, the tensor-bytes route vs the in-process reader); the
# fast path (bench/fastpath.sh), the Python package (bench/python.sh) and the
# fleet (bench/fleet.sh: S3 and peer pulls vs curl, a three-node rollout).
# Each measurement holds flock /tmp/tv-bench.lock (TV_BENCH_LOCK), shared with
# the other benchmark drivers. Run as root for cold-cache figures.
# Usage: bench/all.sh [--repeat N]   (default 5 for the small figures, 3 for read.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps >/dev/null
dir=${TV_BUILD_DIR:-$(scripts/build plain)}
export TV_BUILD_DIR=$dir
command -v fio >/dev/null || { echo "bench/all.sh: fio is not installed (apt-get install fio)" >&2; exit 1; }
repeat=5
[ "${1:-}" = "--repeat" ] && repeat=$2
lock=${TV_BENCH_LOCK:-/tmp/tv-bench.lock}
echo "== small model, first tensor, 120k open (bench/all_bench.py)"
.venv/bin/python bench/all_bench.py --build-dir "$dir" --repeat "$repeat" --lock "$lock"
echo "== large-model reads (bench/read.sh)"
flock "$lock" bench/read.sh --repeat 3
echo "== cold import (bench/import.sh)"
if grep -q flock bench/import.sh bench/import_bench.py; then
    bench/import.sh
else
    flock "$lock" bench/import.sh
fi
echo "== HTTP: wrk and the tensor-bytes route (bench/http.sh; takes the lock per measurement)"
command -v wrk >/dev/null || { echo "bench/all.sh: wrk is not installed (apt-get install wrk)" >&2; exit 1; }
bench/http.sh
echo "== fast path (bench/fastpath.sh; takes the lock per measurement)"
bench/fastpath.sh --repeat "$repeat"
echo "== Python package (bench/python.sh; takes the lock per measurement)"
bench/python.sh --repeat 3
echo "== fleet: S3 and peer pulls vs curl, three-node rollout (bench/fleet.sh; takes the lock per measurement)"
bench/fleet.sh --repeat 3
