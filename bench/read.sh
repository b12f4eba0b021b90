#!/usr/bin/env bash
# Read benchmark driver: tensorvault's whole-model load (bench) from a store
# image vs fio sequential O_DIRECT reads of the same extent, the official
# safetensors numpy loader and a naive pread loader on the original shards;
# then 4 KiB-tensor latency vs fio 4 KiB random reads.
# Usage: bench/read.sh [--dir DIR] [--shards N] [--repeat N] [--loader-repeat N] [--json] [--keep-store]
# Environment: TV_BENCH_DIR (default /tmp/tv-bench): where the checkpoint
# (cached) and the store image live; TV_BUILD_DIR: use this build instead of
# building build/. Run as root for cold-cache figures (drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps >/dev/null
dir=${TV_BUILD_DIR:-$(scripts/build plain)}
command -v fio >/dev/null || { echo "bench/read.sh: fio is not installed (apt-get install fio)" >&2; exit 1; }
exec .venv/bin/python bench/read_bench.py --build-dir "$dir" "$@"
