#!/usr/bin/env bash
# torch 2.11 (the lent GPU machine's version) proven on this CPU: a second venv with torch==2.11.* and the dev
# requirements, then the quick suite and the GPU check's dry run in it. Run by hand, before any change to a CUDA
# path; not part of every CI run (PyPI's Linux wheel pulls the CUDA libraries: about 3 GB, once).
#
#   bash scripts/torch211_check.sh              # build the venv if missing, then the suite and the dry run
#   BUILD_ONLY=1 bash scripts/torch211_check.sh # only the venv
#   VENV=/tmp/venv-torch211 PYTHON=python3 JOBS=1 bash scripts/torch211_check.sh   (the defaults)
#
# Output: the suite's summary line and the dry run's wall time, also in $VENV/last_check.log.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-/tmp/venv-torch211}"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-1}"
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
{
    echo "== quick suite under torch 2.11 ($(date -u +%FT%TZ), -n $JOBS)"
    "$VENV/bin/python" -m pytest -q -n "$JOBS" -p no:cacheprovider 2>&1 | tail -n 40 || true
    echo "== gpu_check dry run under torch 2.11"
    out="$(mktemp -d)"
    start=$(date +%s)
    rc=0
    "$VENV/bin/python" scripts/gpu_check.py --dry_run=True --report_dir="$out/report" > "$out/dry_run.log" 2>&1 || rc=$?
    echo "exit $rc after $(( $(date +%s) - start )) s; the report's sections:"
    grep -e '^## ' -e '^done' -e '^cut' -e '^exited' -e '^skipped' "$out/report/report.md" || tail -n 20 "$out/dry_run.log"
} 2>&1 | tee "$log"
