#!/usr/bin/env bash
# GPU check of the CUDA destination, as one script for a machine with an
# NVIDIA GPU (no network needed). From the repository root:
#
#   tests/gpu/run.sh
#
# Steps: configure and build with -DTV_CUDA=ON (Release) into build-gpu;
# probe the GPU (no device: exit 77); run test_model (its CUDA checks take
# the GPU branch there); write checkpoints (tests/harness/checkpoints.py
# when numpy + safetensors + ml_dtypes import, else C-written ones) and a
# >= 2 GiB C-written one; import them into a store on a file image under
# $TMPDIR (default /tmp); run tests/gpu/gpu_read, which compares every
# tv_read_into_cuda / tv_read_batch_cuda result (copied back) with the host
# reads and times whole-model batches; then the fast path: start
# tensorvaultd on that store (HTTP on a free loopback port, its fast-path
# socket in the work directory) and run tests/gpu/gpu_client: the CUDA
# calls refuse a host pointer cleanly, and every tensor of the model opened
# through the daemon (tv_model_open_daemon) read with tv_read_into_cuda and
# tv_read_batch_cuda (cuda_register false and true), copied back, equals its
# host bytes and those of the model opened in-process; whole-model fast-path batches are timed next to the
# in-process row; the Python package (tests/gpu/py_cuda_cmp.py, from this
# checkout via PYTHONPATH) on cuda:0 through store= and the fast path
# against safetensors on cuda:0 when a Python with torch is found; the
# daemon must stop cleanly on SIGTERM (exit 0). Next,
# optionally, when a Python with torch
# (CUDA) and safetensors is found, tests/gpu/torch_cmp.py compares on the
# GPU with safe_open(framework="pt", device="cuda"), and when pytest is
# there too, tests/integration/test_read.py ties host reads to the official
# loader. Prints a table; exits 1 on any mismatch or failure.
#
# Environment: TV_GPU_BUILD_DIR (build-gpu), TV_GPU_BIG (2304M: size of the
# timed checkpoint), TV_PYTHON (a python to prefer), TV_WHEELS (a local wheel
# directory: only then is a venv created, with --no-index), TV_GPU_KEEP=1
# (keep the work directory), TMPDIR, TV_GPU_DRY_RUN=1 (without a GPU, run
# every step anyway, the CUDA ones reporting "skipped": checks the script
# itself; the fast-path host reads and the refusal checks still run).
# Budget: well under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BUILD=${TV_GPU_BUILD_DIR:-build-gpu}
BIG=${TV_GPU_BIG:-2304M}
JOBS=$(nproc 2>/dev/null || echo 4)
START=$SECONDS
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tv-gpu-XXXXXX") || exit 1
DPID="" # the tensorvaultd this script started, while it runs
cleanup() {
    if [ -n "$DPID" ]; then
        kill -KILL "$DPID" 2>/dev/null
        wait "$DPID" 2>/dev/null
    fi
    if [ "${TV_GPU_KEEP:-0}" = 1 ]; then
        echo "run.sh: work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

log() { printf '\n== %s  [%ds]\n' "$*" $((SECONDS - START)); }
die() { echo "run.sh: FAILED: $*" >&2; exit 1; }
FAIL=0
ROWS=()
row() { ROWS+=("$(printf '%-34s %8s %10s %10s %10s  %s' "$@")"); }

# Runs "$@" with a time limit, output to $WORK/$name.log (shown on failure).
step() {
    local name=$1 limit=$2
    shift 2
    timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
        echo "run.sh: $name failed (exit $rc):" >&2
        tail -40 "$WORK/$name.log" >&2
    fi
    return $rc
}

# ---- build -------------------------------------------------------------------
log "GPU"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
else
    echo "nvidia-smi not found (the CUDA runtime probe below decides)"
fi
log "configure + build ($BUILD, Release, TV_CUDA=ON)"
command -v cmake >/dev/null || die "cmake not found"
CUDA_HINT=()
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    CUDA_HINT=(-DCUDAToolkit_ROOT=/usr/local/cuda)
fi
# -O2: GCC 12 at -O3 reports maybe-uninitialized false positives, fatal
# under the project's -Werror. Should this machine's compiler still stop on
# a warning, the build is retried once with warnings not fatal (listed).
configure() {
    step configure 120 cmake -S . -B "$BUILD" -DTV_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        "-DCMAKE_C_FLAGS_RELEASE=-O2 -DNDEBUG" "-DCMAKE_C_COMPILER_LAUNCHER=$1" \
        ${CUDA_HINT[@]+"${CUDA_HINT[@]}"} ||
        die "configure (CUDA toolkit and the libraries of scripts/deps are needed)"
}
build() {
    step build 300 cmake --build "$BUILD" -j"$JOBS" --target tensorvault_cli tensorvault gpu_read \
        test_model tv_dump tensorvaultd gpu_client
}
configure ""
if ! build; then
    if grep -q 'Werror' "$WORK/build.log"; then
        echo "run.sh: retrying the build with warnings not fatal" >&2
        printf '#!/bin/sh\nexec "$@" -Wno-error\n' >"$WORK/nowerror.sh"
        chmod +x "$WORK/nowerror.sh"
        configure "$WORK/nowerror.sh"
        build || die "build"
        grep 'warning:' "$WORK/build.log" | sort -u | head -20
    else
        die "build"
    fi
fi
TV=$ROOT/$BUILD/tensorvault
GPU_READ=$ROOT/$BUILD/tests/gpu/gpu_read
GPU_CLIENT=$ROOT/$BUILD/tests/gpu/gpu_client
TVD=$ROOT/$BUILD/tensorvaultd
LIB=$ROOT/$BUILD/core/libtensorvault.so

"$GPU_READ" probe
rc=$?
NO_GPU=0
if [ $rc -eq 77 ]; then
    if [ "${TV_GPU_DRY_RUN:-0}" != 1 ]; then
        echo "run.sh: no CUDA device: skipped"
        exit 77
    fi
    echo "run.sh: no CUDA device; TV_GPU_DRY_RUN=1: running the steps anyway (CUDA ones skip)"
    NO_GPU=1
fi
[ $rc -eq 0 ] || [ $NO_GPU -eq 1 ] || die "gpu_read probe (exit $rc)"
echo "work directory: $WORK ($(stat -f -c %T "$WORK" 2>/dev/null || echo '?'))"

log "unit test: test_model (CUDA-present branch)"
if (cd tests && step test_model 120 "$ROOT/$BUILD/tests/test_model"); then
    n=$(grep -c '^\[       OK \]' "$WORK/test_model.log")
    row "test_model (cmocka)" "$n" "-" "-" "-" "passed"
else
    row "test_model (cmocka)" "-" "-" "-" "-" "FAILED"
    FAIL=1
fi

# ---- Python: system packages first, a venv only from local wheels -------------
has_mods() { "$1" -c "import $2" >/dev/null 2>&1; }
PY=""
TORCH_PY=""
for cand in ${TV_PYTHON:-} "$ROOT/.venv/bin/python" python3; do
    command -v "$cand" >/dev/null 2>&1 || [ -x "$cand" ] || continue
    if [ -z "$PY" ] && has_mods "$cand" "numpy, safetensors, ml_dtypes"; then
        PY=$cand
    fi
    if [ -z "$TORCH_PY" ] && has_mods "$cand" "torch, safetensors"; then
        TORCH_PY=$cand
    fi
done
if [ -z "$PY" ] && [ -n "${TV_WHEELS:-}" ] && command -v python3 >/dev/null; then
    log "venv from local wheels in $TV_WHEELS (no network)"
    if step venv 180 python3 -m venv --system-site-packages "$BUILD/venv" &&
        step pip 180 "$BUILD/venv/bin/python" -m pip install -q --no-index \
            --find-links "$TV_WHEELS" -r requirements/run.txt; then
        PY=$BUILD/venv/bin/python
        [ -n "$TORCH_PY" ] || ! has_mods "$PY" "torch, safetensors" || TORCH_PY=$PY
    fi
fi
[ -n "$PY" ] && echo "python with numpy/safetensors/ml_dtypes: $PY" ||
    echo "python: numpy/safetensors/ml_dtypes not importable: C-written checkpoints, no" \
        "official-loader comparison of host bytes"
[ -n "$TORCH_PY" ] && echo "python with torch: $TORCH_PY" ||
    echo "python: torch not importable: the safe_open(device=\"cuda\") comparison is skipped"

# ---- checkpoints and store -------------------------------------------------------
log "checkpoints"
if [ -n "$PY" ]; then
    step gen 120 "$PY" tests/harness/checkpoints.py random "$WORK/ck-small" --seed 11 \
        --tensors 80 --shards 3 --big-bytes $(((5 << 20) + 12)) || die "checkpoints.py"
    SMALL=$(tail -1 "$WORK/gen.log")
else
    mkdir -p "$WORK/ck-small"
    SMALL=$WORK/ck-small/model.safetensors
    step gen 60 "$GPU_READ" write-ckpt "$SMALL" 40M || die "write-ckpt (small)"
fi
mkdir -p "$WORK/ck-big"
step gen-big 120 "$GPU_READ" write-ckpt "$WORK/ck-big/model.safetensors" "$BIG" ||
    die "write-ckpt ($BIG)"
cat "$WORK/gen-big.log"
big_bytes=$(stat -c %s "$WORK/ck-big/model.safetensors")
image_mib=$((big_bytes / 1048576 + 1024))

log "store on a ${image_mib} MiB file image; imports"
step init 60 "$TV" store init --store "$WORK/store" --image "$WORK/image" --size "${image_mib}M" ||
    die "store init"
step import-small 120 "$TV" import --store "$WORK/store" small "$SMALL" --activate --strict ||
    die "import small"
step import-big 240 "$TV" import --store "$WORK/store" big "$WORK/ck-big/model.safetensors" \
    --activate || die "import big"
tail -1 "$WORK/import-big.log"

# ---- CUDA reads vs host reads ------------------------------------------------------
result_row() { # label logfile status
    local r
    r=$(grep '^RESULT' "$2" | tail -1)
    get() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$r"; }
    row "$1" "$(get tensors)" "$(get mismatches)" "$(get host_gbs)" "$(get gpu_gbs)" "$3"
}
gpu_row() { # rc label logfile
    case $1 in
    0) result_row "$2" "$3" passed ;;
    77) result_row "$2" "$3" "skipped (no CUDA device)" ;;
    *) result_row "$2" "$3" FAILED; FAIL=1 ;;
    esac
}
for engine in uring pread; do
    log "gpu_read: small checkpoint, every tensor + batch ($engine)"
    step "gpu-small-$engine" 120 "$GPU_READ" check "$WORK/store" small --engine "$engine"
    gpu_row $? "small ($engine): into + batch" "$WORK/gpu-small-$engine.log"
    grep '^gpu_read' "$WORK/gpu-small-$engine.log" || true
done

# ---- the fast path: tensorvaultd on the same store, gpu_client over its socket ----------
SOCK=$WORK/fp.sock
# Starts the daemon; 0 once it listens on HTTP and the fast-path socket.
start_daemon() {
    "$TVD" --store "$WORK/store" --listen 127.0.0.1:0 --log-level info \
        --set "fastpath.socket=$SOCK" >"$WORK/daemon.log" 2>&1 &
    DPID=$!
    for _ in $(seq 300); do
        if grep -q '^tensorvaultd: listening on' "$WORK/daemon.log" && [ -S "$SOCK" ]; then
            return 0
        fi
        if ! kill -0 "$DPID" 2>/dev/null; then
            wait "$DPID"
            echo "run.sh: tensorvaultd exited $? before listening:" >&2
            DPID=""
            tail -40 "$WORK/daemon.log" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "run.sh: tensorvaultd did not listen on $SOCK in 30 s:" >&2
    tail -40 "$WORK/daemon.log" >&2
    return 1
}
# SIGTERM, then the exit status (kill -9 and 124 after 30 s).
stop_daemon() {
    local rc
    kill -TERM "$DPID" 2>/dev/null
    for _ in $(seq 300); do
        kill -0 "$DPID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$DPID" 2>/dev/null; then
        kill -KILL "$DPID"
        wait "$DPID"
        rc=124
    else
        wait "$DPID"
        rc=$?
    fi
    DPID=""
    return $rc
}
fp_row() { # rc label logfile (77: the CUDA part skipped, the host part passed)
    case $1 in
    0) result_row "$2" "$3" "passed$(pin_note "$3")" ;;
    77) result_row "$2" "$3" "skipped (no CUDA device; host reads passed)" ;;
    *) result_row "$2" "$3" FAILED; FAIL=1 ;;
    esac
}
pin_note() { # a registered arena the GPU would not pin is said in the row
    if grep -q 'arena not pinned' "$1"; then
        echo " (arena not pinned: $(sed -n 's/.*arena not pinned (\(.*\)).*/\1/p' "$1" | head -1))"
    fi
}
log "fast path: tensorvaultd on the store, socket $SOCK"
DAEMON_UP=0
if start_daemon; then
    DAEMON_UP=1
    grep 'fast path on' "$WORK/daemon.log" || true
    log "gpu_client: the CUDA calls refuse cleanly (cuda_register false and true)"
    step fp-refuse 120 "$GPU_CLIENT" refuse "$SOCK" small --store "$WORK/store"
    case $? in
    0) result_row "fastpath: CUDA refusals" "$WORK/fp-refuse.log" \
        "passed ($(grep -q 'TV_E_NOT_SUPPORTED' "$WORK/fp-refuse.log" &&
            echo 'no GPU: TV_E_NOT_SUPPORTED' || echo 'host pointer: TV_E_INVALID_ARG'))" ;;
    *) result_row "fastpath: CUDA refusals" "$WORK/fp-refuse.log" FAILED; FAIL=1 ;;
    esac
    for reg in 0 1; do
        log "gpu_client: small checkpoint over the fast path, into + batch (cuda_register $reg)"
        step "fp-small-$reg" 120 "$GPU_CLIENT" check "$SOCK" small --store "$WORK/store" \
            --register $reg
        fp_row $? "fastpath small (reg $reg): into+batch" "$WORK/fp-small-$reg.log"
        grep '^gpu_client: small' "$WORK/fp-small-$reg.log" || true
    done
    # The Python package on cuda:0 (store= and the fast path) against
    # safetensors on cuda:0; the package comes from this checkout and the
    # library from this build (no pip on a machine without network).
    if [ -n "$TORCH_PY" ] && has_mods "$TORCH_PY" "numpy, ml_dtypes"; then
        log "python: tensorvault.safe_open(framework=pt, device=cuda:0) vs safetensors on cuda:0"
        PYTHONPATH=$ROOT/python TENSORVAULT_LIBRARY=$LIB \
            step py-cuda 180 "$TORCH_PY" tests/gpu/py_cuda_cmp.py "$WORK/store" "$SOCK" small "$SMALL"
        rc=$?
        n=$(grep -c '^py_cuda_cmp: .*checked' "$WORK/py-cuda.log" 2>/dev/null || echo 0)
        bad=$(grep '^py_cuda_cmp: .*checked' "$WORK/py-cuda.log" 2>/dev/null |
            sed -n 's/.*, \([0-9]*\) mismatches.*/\1/p' | awk '{s+=$1} END {print s+0}')
        case $rc in
        0) row "python safe_open cuda:0 vs official" "$n checks" "$bad" "-" "-" "passed" ;;
        77) row "python safe_open cuda:0 vs official" "-" "-" "-" "-" "skipped (torch sees no GPU)" ;;
        *) row "python safe_open cuda:0 vs official" "$n checks" "$bad" "-" "-" "FAILED"; FAIL=1 ;;
        esac
        grep '^py_cuda_cmp' "$WORK/py-cuda.log" | tail -12 || true
    else
        row "python safe_open cuda:0 vs official" "-" "-" "-" "-" "skipped (no torch + numpy + ml_dtypes)"
    fi
else
    row "fastpath: tensorvaultd" "-" "-" "-" "-" "FAILED (did not start)"
    FAIL=1
fi

log "gpu_read: $BIG checkpoint, whole-model batches (timed)"
step gpu-big 240 "$GPU_READ" check "$WORK/store" big --bench --repeat 3
gpu_row $? "big $BIG: batch (best of 3)" "$WORK/gpu-big.log"
grep '^gpu_read' "$WORK/gpu-big.log" || true
if [ $DAEMON_UP -eq 1 ]; then
    for reg in 0 1; do
        log "gpu_client: $BIG checkpoint over the fast path, batches (cuda_register $reg, timed)"
        step "fp-big-$reg" 240 "$GPU_CLIENT" check "$SOCK" big --store "$WORK/store" --bench \
            --repeat 3 --register $reg
        fp_row $? "fastpath big (reg $reg): batch" "$WORK/fp-big-$reg.log"
        grep '^gpu_client: big' "$WORK/fp-big-$reg.log" || true
    done
    log "fast path: tensorvaultd stops on SIGTERM"
    if stop_daemon; then
        row "fastpath: tensorvaultd SIGTERM" "-" "-" "-" "-" "passed (exit 0)"
    else
        rc=$?
        echo "run.sh: tensorvaultd exit $rc after SIGTERM:" >&2
        tail -40 "$WORK/daemon.log" >&2
        row "fastpath: tensorvaultd SIGTERM" "-" "-" "-" "-" "FAILED (exit $rc)"
        FAIL=1
    fi
fi
"$TV" bench --store "$WORK/store" big 2>&1 | tail -1 || true

# ---- optional: official loaders --------------------------------------------------------
if [ -n "$TORCH_PY" ] && [ $((SECONDS - START)) -lt 330 ]; then
    log "torch: safe_open(framework=pt, device=cuda) vs tv_read_into_cuda, on the GPU"
    step torch 120 "$TORCH_PY" tests/gpu/torch_cmp.py "$LIB" "$WORK/store" small "$SMALL"
    rc=$?
    r=$(grep '^RESULT' "$WORK/torch.log" | tail -1)
    get() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$r"; }
    if [ $rc -eq 0 ]; then
        row "torch safe_open (GPU) vs tv" "$(get tensors)" "$(get mismatches)" "-" "-" \
            "passed ($(get skipped) dtypes torch lacks skipped)"
    elif [ $rc -eq 77 ]; then
        row "torch safe_open (GPU) vs tv" "-" "-" "-" "-" "skipped (torch sees no GPU)"
    else
        row "torch safe_open (GPU) vs tv" "$(get tensors)" "$(get mismatches)" "-" "-" "FAILED"
        FAIL=1
    fi
else
    row "torch safe_open (GPU) vs tv" "-" "-" "-" "-" "skipped (no torch)"
fi
if [ -n "$PY" ] && has_mods "$PY" pytest && [ $((SECONDS - START)) -lt 300 ]; then
    log "pytest tests/integration/test_read.py (host bytes vs the official loader)"
    export TV_BUILD_DIR=$ROOT/$BUILD
    if step pytest 150 "$PY" -m pytest -q -p no:cacheprovider \
        tests/integration/test_read.py; then
        row "pytest test_read.py (host)" "-" "-" "-" "-" "$(tail -1 "$WORK/pytest.log")"
    else
        row "pytest test_read.py (host)" "-" "-" "-" "-" "FAILED"
        FAIL=1
    fi
else
    row "pytest test_read.py (host)" "-" "-" "-" "-" "skipped (no pytest/numpy or no time)"
fi

# ---- summary -------------------------------------------------------------------------------
log "summary"
printf '%-34s %8s %10s %10s %10s  %s\n' check tensors mismatches "host GB/s" "GPU GB/s" result
for r in "${ROWS[@]}"; do
    echo "$r"
done
echo "total time: $((SECONDS - START)) s"
if [ $FAIL -ne 0 ]; then
    echo "run.sh: FAILED (logs above; TV_GPU_KEEP=1 keeps $WORK)"
    exit 1
fi
if [ $NO_GPU -eq 1 ]; then
    echo "run.sh: dry run without a GPU: every step that needs none passed"
else
    echo "run.sh: all checks passed"
fi
