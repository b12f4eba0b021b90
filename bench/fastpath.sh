#!/usr/bin/env bash
# Fast-path benchmark driver (bench/fastpath_bench.py): a >= 2 GiB generated
# checkpoint in a tensorvaultd store on the real disk; (a) fio sequential
# O_DIRECT 1 MiB QD32 on the store image, (b) the in-process reader, (c) one
# fast-path client, (d) 8 fast-path clients at once (aggregate GB/s, device
# bytes per model byte from /metrics, slowest / single), (e) 4 KiB tensor
# latency fast path vs in-process; the ratios against the issue's targets.
# Usage: bench/fastpath.sh [--small] [--clients N] [--repeat N] [--count N] [--cold-rounds N] [--json] [--keep-store]
# Environment: TV_BENCH_DIR (default /tmp/tv-bench): where the checkpoint
# (cached, shared with bench/read.sh) and the store live; TV_BUILD_DIR: use
# this build instead of building build/; TV_BENCH_SMALL=1: --small (a smoke
# run); TV_BENCH_LOCK: the lock every measurement holds. Run as root for
# cold-cache figures (drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps >/dev/null
dir=${TV_BUILD_DIR:-$(scripts/build plain)}
command -v fio >/dev/null || { echo "bench/fastpath.sh: fio is not installed (apt-get install fio)" >&2; exit 1; }
exec .venv/bin/python bench/fastpath_bench.py --build-dir "$dir" "$@"
