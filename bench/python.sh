#!/usr/bin/env bash
# Python loading benchmark driver (bench/python_bench.py): every tensor of a
# >= 2 GiB checkpoint into host memory through tensorvault.safe_open (fast
# path; numpy and torch) against the C in-process reader and the official
# safetensors.safe_open (mmap and pread backends), then a ~100 MB model's
# start-up time against the official loader; ratios against the issue's
# targets. Usage: bench/python.sh [--small] [--repeat N] [--small-repeat N] [--json] [--keep-store]
# Environment: TV_BENCH_DIR (default /tmp/tv-bench: the cached checkpoints and
# the store), TV_BUILD_DIR (use this build), TV_BENCH_SMALL=1 (--small),
# TV_BENCH_LOCK. Run as root for cold-cache figures (drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps >/dev/null
dir=${TV_BUILD_DIR:-$(scripts/build plain)}
exec .venv/bin/python bench/python_bench.py --build-dir "$dir" "$@"
