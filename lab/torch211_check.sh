#!/usr/bin/env bash
# torch 2.11 (a version many GPU images ship) proven on this CPU: a second venv with torch==2.11.* and the dev
# requirements, then the quick suite (or the slow compiled tests, or the TF32 test) and the GPU check's dry run in
# it. Run by hand, before any change to a CUDA path; not part of every CI run (PyPI's Linux wheel pulls the CUDA
# libraries: about 3 GB, once).
#
#   bash lab/torch211_check.sh              # build the venv if missing, then the quick suite and the dry run
#   SUITE=slow bash lab/torch211_check.sh   # the slow tests that compile (SLOW_COMPILED below), then the dry run
#   SUITE=all bash lab/torch211_check.sh    # both suites, then the dry run
#   SUITE=tf32 bash lab/torch211_check.sh   # TF32 as the project sets it, inductor compiling after it, then the dry run
#   BUILD_ONLY=1 bash lab/torch211_check.sh # only the venv
#   VENV=/tmp/venv-torch211 PYTHON=python3 JOBS=1 bash lab/torch211_check.sh   (the defaults)
#
# Output: each suite's summary line and wall time and the dry run's, also in $VENV/last_check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-/tmp/venv-torch211}"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-1}"
SUITE="${SUITE:-quick}"
# the slow set's tests that run torch.compile: training (compile vs eager, no recompiles, resume), the compiled
# decode step and its AOTInductor package, the benchmark's graph step, the GPU check's dry run and compile counts
SLOW_COMPILED="tests/test_compile.py tests/test_compiled_decode.py tests/test_bench.py tests/test_gpu_check.py"
case "$SUITE" in quick|slow|all|tf32) ;; *) echo "error: SUITE must be quick, slow, all or tf32, got '$SUITE'" >&2
    exit 2;; esac
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    reqs="$VENV/requirements-torch211.txt"
    # the dev requirements with torch's pin swapped for 2.11 (requirements.txt pins 2.13)
    { echo "torch==2.11.*"; grep -hv -e '^torch==' -e '^-r ' requirements.txt requirements-dev.txt; } > "$reqs"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$reqs"
fi
"$VENV/bin/python" -c "import torch; print('torch', torch.__version__, 'in', '$VENV')"
[ -n "${BUILD_ONLY:-}" ] && exit 0
export OMP_NUM_THREADS=1
log="$VENV/last_check.log"
suite() {  # name, then pytest's arguments
    local name="$1" start
    shift
    echo "== $name under torch 2.11 ($(date -u +%FT%TZ), -n $JOBS): $*"
    start=$(date +%s)
    "$VENV/bin/python" -m pytest -q -n "$JOBS" -p no:cacheprovider "$@" 2>&1 | tail -n 40 || true
    echo "$name: $(( $(date +%s) - start )) s wall"
}
{
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), family $(lscpu | sed -n 's/^CPU family: *//p'), model" \
         "$(lscpu | sed -n 's/^Model: *//p'), $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
    if [ "$SUITE" = quick ] || [ "$SUITE" = all ]; then suite "quick suite"; fi
    # shellcheck disable=SC2086 (the list is word-split on purpose)
    if [ "$SUITE" = slow ] || [ "$SUITE" = all ]; then suite "slow compiled tests" -m slow $SLOW_COMPILED; fi
    if [ "$SUITE" = tf32 ]; then suite "TF32 test" tests/test_train.py -k tf32; fi
    echo "== gpu_check dry run under torch 2.11"
    out="$(mktemp -d)"
    start=$(date +%s)
    rc=0
    "$VENV/bin/python" lab/gpu_check.py --dry_run --out="$out/report" --minutes=60 > "$out/dry_run.log" 2>&1 || rc=$?
    echo "exit $rc after $(( $(date +%s) - start )) s; the report's steps:"
    grep -e '^## ' "$out/report/report.md" || tail -n 20 "$out/dry_run.log"
} 2>&1 | tee "$log"
