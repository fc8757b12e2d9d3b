#!/usr/bin/env bash
# The GPU check of issue 21: tests and benchmarks on a real NVIDIA GPU, in about 8 minutes.
#
# For a machine with an NVIDIA GPU and no network: Python 3.12 with CuPy, PyTorch and JAX
# (the device tool's nvidia-h100-x1 / nvidia-h200 image), maybe without this project's other
# dependencies. Steps, each with its own timeout:
#
#   1. deps             the project's dependencies that do not import are installed offline
#                       from $WHEELS_DIR (default benchmarks/wheels, filled here beforehand by
#                       benchmarks/gpu_wheels.sh) into /tmp/hybrid-site; llvmlite is not
#                       carried (its wheel is 57 MiB, over the tool's limit with the tree):
#                       that image has it through numba;
#   2. tests    (100 s) pytest -m gpu over tests/ (the tests that need a real GPU);
#               (150 s) tests/test_gpu_emulated.py with HYBRID_GPU_EMULATE unset, so it runs
#                       on the real GPU (the registry sweep in float32 only: CuPy compiles
#                       each new kernel with NVRTC, and a fresh machine has no kernel cache);
#      fuzz     (150 s) GPU_CHECK_FUZZ_N (40) fresh differential-fuzzer programs, eager CuPy
#                       ops vs the CUDA backend on the GPU (~0.5-1 s each; a failure prints
#                       the program and its reproduction blob);
#   3. bench    (270 s) benchmarks/bench_gpu.py (hybrid eager and hybridized backend="cuda"
#                       beside torch eager, torch.compile reduce-overhead and JAX jit);
#   4. report           benchmarks/gpu_report.py writes gpu_check.json (device, date, tests
#                       passed/failed, every figure, targets_met) and prints the table.
#
# Results: benchmarks/results/gpu/ (gpu_check.json, gpu_check.log, the JUnit files, bench.json);
# where the device tool sets $OUT, they are copied there too (they come back with the reply).
#
# Through the device tool (from the repo root here):
#     bash benchmarks/gpu_wheels.sh           # once: the wheels that machine lacks
#     run(command="bash benchmarks/gpu_check.sh", carry=["benchmarks/wheels"], timeout_s=560)
#
# GPU_CHECK_T_MARKED / _T_FILE / _T_FUZZ / _T_BENCH (seconds) and GPU_CHECK_BENCH_BUDGET
# shorten the steps where less device time is left (a rerun after a fix); GPU_CHECK_STEPS
# ("tests fuzz bench" by default) runs some of them only.
#
# GPU_CHECK_SMOKE=1 runs the same plumbing on two EMULATED GPUs with tiny sizes (seconds to a
# minute; results under /tmp/gpu_check_smoke, labelled emulated): how CI-less machines check
# this script. Its figures are never GPU figures.
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
WHEELS_DIR=${WHEELS_DIR:-$ROOT/benchmarks/wheels}
SMOKE=${GPU_CHECK_SMOKE:-0}
T0=$SECONDS

if [ "$SMOKE" = 1 ]; then
    RES=${RESULTS_DIR:-/tmp/gpu_check_smoke}
    export HYBRID_GPU_EMULATE=2
    BENCH_ARGS=(--smoke --budget 60)
    REGISTRY_FILTER=""
else
    RES=${RESULTS_DIR:-$ROOT/benchmarks/results/gpu}
    unset HYBRID_GPU_EMULATE  # the real GPU
    BENCH_ARGS=(--budget "${GPU_CHECK_BENCH_BUDGET:-230}")
    REGISTRY_FILTER="not every_registry_op or float32"
fi
ONLY=${GPU_CHECK_STEPS:-tests fuzz bench}  # a rerun may take some steps only
mkdir -p "$RES"
rm -f "$RES"/junit_gpu_*.xml  # a step not run this time reports nothing, not an old file
LOG=$RES/gpu_check.log
: >"$LOG"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export HYBRID_CACHE_DIR=${HYBRID_CACHE_DIR:-/tmp/hybrid-cache}
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX shares the GPU with CuPy and torch
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
STEPS=()

say() { echo "[gpu_check $((SECONDS - T0))s] $*" | tee -a "$LOG"; }

step() {  # step NAME TIMEOUT CMD...: run with a timeout, log it, remember rc and seconds
    local name=$1 limit=$2 t=$SECONDS rc
    shift 2
    say "$name: $* (timeout ${limit}s)"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    STEPS+=(--step "$name=$rc:$((SECONDS - t))")
    say "$name: rc $rc in $((SECONDS - t))s"
}

# ------------------------------------------------------------------ 1. dependencies
install_missing() {
    local missing=() wheels=() mod whl
    # module:wheel-name pairs of the project's dependencies (pyproject.toml) and test tools
    for pair in numpy:numpy networkx:networkx scipy_openblas32:scipy_openblas32 \
        threadpoolctl:threadpoolctl safetensors:safetensors tqdm:tqdm llvmlite:llvmlite \
        pytest:pytest pytest_timeout:pytest_timeout hypothesis:hypothesis; do
        mod=${pair%%:*}
        "$PY" -c "import $mod" 2>/dev/null && continue
        missing+=("$mod")
        whl=$(ls "$WHEELS_DIR"/"${pair#*:}"-*.whl 2>/dev/null | head -n 1)
        if [ -n "$whl" ]; then wheels+=("$whl"); else say "deps: $mod is missing and no wheel for it is in $WHEELS_DIR"; fi
    done
    say "deps: missing: ${missing[*]:-none}"
    if [ ${#wheels[@]} -gt 0 ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/hybrid-site "${wheels[@]}" || return 1
    fi
}
t=$SECONDS
install_missing
STEPS+=(--step "deps=$?:$((SECONDS - t))")
export PYTHONPATH=/tmp/hybrid-site:$PYTHONPATH

SMI=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
say "GPU: ${SMI:-none seen by nvidia-smi}"
"$PY" -c "import sys, cupy; print('python', sys.version.split()[0], 'cupy', cupy.__version__)" 2>&1 | tee -a "$LOG"

# ------------------------------------------------------------------ 2. tests
wants() { [[ " $ONLY " == *" $1 "* ]]; }
if wants tests; then
    step tests_gpu_marked "${GPU_CHECK_T_MARKED:-100}" "$PY" -m pytest -q -p no:cacheprovider -o timeout=60 -m gpu tests/ \
        -k "not fresh_programs_on_a_real_gpu" --junitxml="$RES/junit_gpu_marked.xml"
    step tests_gpu_file "${GPU_CHECK_T_FILE:-150}" "$PY" -m pytest -q -p no:cacheprovider -o timeout=60 tests/test_gpu_emulated.py \
        ${REGISTRY_FILTER:+-k "$REGISTRY_FILTER"} --junitxml="$RES/junit_gpu_file.xml"
fi
if wants fuzz; then  # fresh random programs: eager CuPy ops vs the CUDA backend on the GPU
    FUZZ_GPU_N=${GPU_CHECK_FUZZ_N:-40} step tests_gpu_fuzz "${GPU_CHECK_T_FUZZ:-150}" "$PY" -m pytest -q -p no:cacheprovider \
        -o timeout=0 tests/test_program_fuzz.py -k fresh_programs_on_a_real_gpu --junitxml="$RES/junit_gpu_fuzz.xml"
fi

# ------------------------------------------------------------------ 3. benchmarks
rm -f "$RES/bench.json"
if wants bench; then
    step bench "${GPU_CHECK_T_BENCH:-270}" "$PY" benchmarks/bench_gpu.py "${BENCH_ARGS[@]}" --json "$RES/bench.json"
fi

# ------------------------------------------------------------------ 4. report
"$PY" benchmarks/gpu_report.py --out "$RES/gpu_check.json" --bench "$RES/bench.json" \
    --junit gpu_marked="$RES/junit_gpu_marked.xml" --junit gpu_file="$RES/junit_gpu_file.xml" \
    --junit gpu_fuzz="$RES/junit_gpu_fuzz.xml" "${STEPS[@]}" --nvidia-smi "$SMI" --note total_seconds=$((SECONDS - T0)) \
    2>&1 | tee -a "$LOG"

if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then  # the device tool brings $OUT's files back
    cp "$RES"/gpu_check.json "$RES"/gpu_check.log "$RES"/bench.json \
        "$RES"/junit_gpu_marked.xml "$RES"/junit_gpu_file.xml "$RES"/junit_gpu_fuzz.xml "$OUT"/ 2>/dev/null
    say "copied the results to \$OUT"
fi
say "done"
