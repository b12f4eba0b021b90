#!/usr/bin/env bash
# Import benchmark driver: tensorvault import of a >= 2 GiB checkpoint vs fio
# sequential O_DIRECT writes of the same bytes on the same filesystem.
# Usage: bench/import.sh [--dir DIR] [--gib N] [--shards N] [--repeat N] [--json]
# Environment: TV_BENCH_DIR (default /tmp): where the checkpoint (cached), the
# fio file and the store image live; TV_BUILD_DIR: use this build instead of
# building build/. Run as root for cold-cache figures (drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps >/dev/null
dir=${TV_BUILD_DIR:-$(scripts/build plain)}
command -v fio >/dev/null || { echo "bench/import.sh: fio is not installed (apt-get install fio)" >&2; exit 1; }
exec .venv/bin/python bench/import_bench.py --build-dir "$dir" "$@"
