#!/usr/bin/env bash
# tg-cuda on a machine with an NVIDIA GPU: install, then run tg-cuda's tests, the full conformance suite on CUDA
# and the bench workloads, and print a short table. Every step has a time limit; together they stay under 8
# minutes (7m35s at most). No network needed.
#
#   bash plugins/tg-cuda/gpu_check.sh [WHEEL_DIR]
#
# WHEEL_DIR (default: .whl in the repository root, if it exists) holds wheels of tgcore, tg-cuda and
# tg-conformance, and of any dependency the machine lacks (pluggy, tqdm, hypothesis, nvidia-cuda-nvrtc, ...); each
# is installed only if its distribution is not installed already, with --no-deps --no-index, into a folder put
# on PYTHONPATH (the machine's Python is left as it is). Without wheels, tgcore, tg-cuda and tg-conformance are
# installed from this checkout (no build isolation: the machine's setuptools builds them, offline).
# PYTHON picks the interpreter (default python3). $OUT (default /tmp/tg-cuda-gpu-check) gets five files:
# gpu-check.log, gpu.txt and the JSON reports of the conformance suite and the benchmarks.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/tg-cuda-gpu-check}
WHEELS=${1:-$ROOT/.whl}
SITE=$(mktemp -d /tmp/tg-cuda-check.XXXXXX)
mkdir -p "$OUT"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1
export CACHEDB="$SITE/cache.db" TG_CONFORMANCE_JOBS=${TG_CONFORMANCE_JOBS:-8}
# the driver JIT-compiles every PTX on the GPU: checking it with ptxas too would only cost time here
export TG_CUDA_PTXAS=${TG_CUDA_PTXAS:-0}
START=$(date +%s)
declare -a ROWS

step() {  # step NAME TIMEOUT_SECONDS COMMAND...: run it, append its output to $OUT/gpu-check.log, keep a table row
  local name=$1 limit=$2 t0 rc summary
  shift 2
  t0=$(date +%s)
  echo "=== $name: $*" | tee -a "$OUT/gpu-check.log"
  if declare -F "$1" >/dev/null; then "$@"; else timeout "$limit" "$@"; fi 2>&1 | tee "$SITE/$name.log"
  rc=${PIPESTATUS[0]}
  cat "$SITE/$name.log" >> "$OUT/gpu-check.log"
  summary=$(grep -E "passed|failed|error" "$SITE/$name.log" | tail -1 | cut -c1-70)
  [ "$rc" = 124 ] && summary="timed out after ${limit}s"
  ROWS+=("$(printf '%-13s %-5s %5ss  %s' "$name" "$([ "$rc" = 0 ] && echo ok || echo FAIL)" "$(($(date +%s) - t0))" \
    "$summary")")
  return "$rc"
}

installed() {  # installed DIST: is the distribution importable from $PYTHON already?
  "$PYTHON" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$1" 2>/dev/null
}

install() {
  if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    local picked=()
    for whl in "$WHEELS"/*.whl; do
      dist=$(basename "$whl" | cut -d- -f1)
      case "$dist" in tgcore|tg_cuda|tg_conformance) picked+=("$whl"); continue ;; esac
      installed "$dist" || picked+=("$whl")
    done
    echo "installing from $WHEELS: ${picked[*]##*/}"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${picked[@]}"
  else
    echo "no wheels in $WHEELS: installing tgcore, tg-cuda and tg-conformance from this checkout"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" \
      "$ROOT" "$ROOT/plugins/tg-cuda" "$ROOT/tests/conformance"
  fi || return 1
  for dist in numpy pluggy pytest hypothesis nvidia-cuda-nvrtc; do
    installed "$dist" || { echo "missing: $dist (add its wheel to $WHEELS)"; return 1; }
  done
}

report() {
  echo
  echo "tg-cuda GPU check, $(($(date +%s) - START))s in all; logs and reports in $OUT"
  printf '%-13s %-5s %6s  %s\n' step result time summary
  printf '%s\n' "${ROWS[@]}"
}
trap report EXIT

step install 60 install || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
step devices 30 bash -c '"$0" -m tgcore devices && "$0" -m tg_cuda' "$PYTHON" || exit 1
step plugin-tests 50 "$PYTHON" -m pytest -q -p no:cacheprovider "$ROOT/plugins/tg-cuda/tests/test_gpu.py" \
  "$ROOT/plugins/tg-cuda/tests/test_cuda.py"
step conformance 210 "$PYTHON" -m tg_conformance --device CUDA --json "$OUT/conformance-cuda.json"
step bench-cuda 45 "$PYTHON" "$ROOT/plugins/tg-cuda/bench_cuda.py" --json "$OUT/bench-cuda.json"
if [ -f "$ROOT/bench/__main__.py" ]; then  # the project's benchmark suite, in its quick form
  step bench 60 "$PYTHON" -m bench --quick --devices CUDA --json "$OUT/bench.json"
else
  step bench 60 "$PYTHON" "$ROOT/bench/compile_latency.py" --devices CUDA --repeats 5
fi
ok=1
for row in "${ROWS[@]}"; do [[ "$row" == *" FAIL "* ]] && ok=0; done
[ "$ok" = 1 ]
