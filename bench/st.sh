#!/usr/bin/env bash
# Safetensors metadata benchmark: validate + index 1k/10k/120k-tensor headers
# and time name lookups. Usage: bench/st.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(scripts/build plain)
"$dir/bench/bench_st" "$@"
