#!/usr/bin/env bash
# The benchmark table (bench/table.py): the read engine against fio, the
# Python path against the official safetensors, fastsafetensors and the
# Run:ai model streamer, concurrent fast-path clients, warm loads and a
# restarted worker, HTTP metadata; one table, every figure a median of
# ratios within alternating rounds. Run as root on a quiet machine (cold
# figures drop the page cache). Takes about 25 minutes (--quick: a few).
# Usage: bench/table.sh [--quick] [--rounds N] [--sizes small,1g,4g]
#                       [--only engine,python,clients,warm,larger,http] [--json FILE]
# Environment: TV_BENCH_DIR (default /tmp/tv-bench-table): checkpoints
# (cached) and stores; TV_BUILD_DIR: a build to use instead of build/.
# The Python package measured is this tree's (python/ on PYTHONPATH over
# this build's libtensorvault), whatever .venv has installed; the Run:ai
# streamer lives in build/bench-venv, made here (never in .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Debian packages; .venv only when it is missing: the package measured
# comes from this tree (below), so a shared .venv is left as it is.
scripts/deps --system >/dev/null
[ -x .venv/bin/python ] || scripts/deps --python >/dev/null
dir=${TV_BUILD_DIR:-$(scripts/build plain)}
dir=$(cd "$dir" && pwd)
for t in fio wrk; do
    command -v $t >/dev/null || { echo "bench/table.sh: $t is not installed (apt-get install $t)" >&2; exit 1; }
done
venv=build/bench-venv
if [ ! -x $venv/bin/python ] || ! $venv/bin/python -c 'import runai_model_streamer' 2>/dev/null; then
    # torch, numpy and safetensors come from .venv through a .pth file; only
    # the streamer is installed here
    .venv/bin/python -m venv $venv
    .venv/bin/python -c 'import site; print(site.getsitepackages()[0])' \
        >"$venv/lib/$(ls $venv/lib)/site-packages/tv-dotvenv.pth"
    $venv/bin/python -m pip install -q runai-model-streamer==0.17.0 ||
        echo "bench/table.sh: runai-model-streamer not installed: its rows are left out" >&2
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export TENSORVAULT_LIBRARY=$dir/core/libtensorvault.so
exec .venv/bin/python bench/table.py --build-dir "$dir" --bench-venv "$PWD/$venv" "$@"
