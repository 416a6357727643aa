#!/usr/bin/env bash
# The one prepared run on a GPU machine (docs/design.md section 4, tier 5): every step in its
# own process under its own time box, the most telling first, each step's output kept even
# when an earlier step fails or hangs (no `set -e`, no `pytest -x`).
#
#   on the GPU machine:    KDACUPY_COMMIT=<sha> bash benchmarks/device_check.sh     (FLA from .whl/)
#   on any CPU machine:    bash benchmarks/device_check.sh --cpu-rehearsal           (CI runs this)
#   the steps, no run:     bash benchmarks/device_check.sh --print-steps
#   a rerun of some steps: bash benchmarks/device_check.sh --only 1 7    (step 1 brings FLA; steps
#                          6-7 read step 5's tuning file when $OUT still holds it, else heuristic tiles)
#
# Boxes and estimates (seconds; the boxes' sum, 417 s, stays under 7 minutes so that with the
# machine's start one rerun of a failed step still fits 15 minutes on the machine; "?": a guess, which
# only the GPU machine can measure):
#
#  #  step                                      box  est  what it will tell us
#  1  FLA wheels                                 15    3  whether FLA is there for the comparisons
#  2  device info                                10    4  GPU, driver, CuPy/NVRTC, CuPy's target (sm_90), tools present
#  3  PTX conformance                            25   10  whether the CPU twins are the hardware (bit-exact cvt,
#                                                         ldmatrix, cp.async, mma; .approx bounds; the mma
#                                                         accumulation model): is the emulation's evidence valid
#  4  GPU suite: forward, decode, seqpar         55   37  parity with the precision model over the option matrix,
#                                                         graphs, streams, 2^31 offsets, DLPack: are the kernels right
#  5  tuning (Kimi shapes)                       25   15  the fastest tiles per bucket, into the file kda_forward reads
#  6  benchmark, Kimi shapes, tuned tiles        20   10  kdacupy's times, GB/s against the copy bandwidth (the floor)
#  7  benchmark against FLA (H = 96)             75  40?  FLA / kdacupy on the same inputs, and their agreement
#  8  compute-sanitizer memcheck                 20   8?  out-of-bounds accesses the emulation cannot see
#  9  compute-sanitizer racecheck                25  12?  shared-memory races (forward, pool, split, maps)
# 10  compute-sanitizer synccheck                15   7?  barrier misuse
# 11  GPU long sweep (T = 8192)                  20   12  RMSE against the float64 reference over the gate/bias sweep
# 12  accuracy, T = 8192, fp32 state             12    6  the fp32-state mode's accuracy on the GPU
# 13  adversarial accuracy                       15    8  repeated / collinear keys on the GPU
# 14  few heads: serial vs split                 30   15  what sequence parallelism buys (calibrates its heuristic)
# 15  decode on a state pool, against FLA        40  25?  device / stream / host time per step; FLA's pool decode
# 16  context parallelism (NCCL, MPI)            15    8  CP on the GPU; last, so an NCCL hang costs only its box
#
# How the boxes were sized (measured on a 2-core CPU machine without a GPU, then a margin of
# about 1.5-2x for what only the GPU machine can tell):
# - compiles: benchmarks/device_census.py runs every step's calls through the emulation with a
#   recording loader. Steps run in this order and CuPy's kernel cache is on disk, so a variant is
#   compiled once, by the first step that asks for it: step 4 compiles 59 (14 prepare, 23
#   recurrence, 16 decode, 6 scan), step 5 7 (the other tile candidates), 13 3, 14 2, 15 2, the
#   rest none (the sanitizer runs reuse step 4's). NVRTC per variant for sm_90 here
#   (python -m kdacupy.compile --arch sm_90 --jobs 1): prepare 0.19 s, recurrence 0.37 s, decode
#   0.09 s, scan 0.1 s of CPU (twice that on this machine under a load of 7); step 4's compiles
#   are ~13 s, one after another in one process.
# - the CPU side of the checks (one core, this machine): the float64 reference at T = 8192,
#   H = 4, K = V = 128 1.6 s (H = 1: 0.13 s); the precision model at T = 8192, H = 1 0.6 s; one
#   job of the long sweep (model chained over 256-token segments plus the reference) 1.6 s,
#   twelve in parallel processes; step 4's 68 model runs 0.8 s; the mma probe of step 3 1.5 s.
# - fixed costs: Python with CuPy and kdacupy 0.3 s, pytest collection of tests/gpu 0.5 s, the
#   GPU's context a second or so, torch and JAX imports a few seconds each (steps 4, 7, 15).
# - GPU time is small everywhere (the largest input is step 4's 45 GB offsets test), except
#   FLA's first calls on a fresh machine: Triton compiles and autotunes chunk_kda's kernels
#   (tens of configurations, per head count and per varlen / fixed: not measurable here). So
#   step 7 is the box sized most by guess; it times kdacupy before FLA on every shape and writes
#   the JSON after each, so a box that runs out keeps every finished shape. Step 15's FLA is
#   fused_recurrent_kda_fwd: no autotuning, one Triton compile per head count, pool dtype and
#   T = 1 / verify (8). compute-sanitizer slows kernels by a factor no CPU measurement gives;
#   its runs are small (the shapes of step 4's cheapest tests, every variant already compiled).
# - each box is about 1.5-2x its estimate; an estimate is the sum of the terms above for the
#   step's own calls (e.g. step 4: 3 s start and collection, 13 s compiles, 5 s references and
#   model runs, 8 s torch and JAX, 3 s on the GPU, 5 s the tests' own overhead).
# - the sum is held by tests/test_device_check.py (with every step's CPU form).
#
# Output: eight files under $OUT at most, written as the run goes (a run cut off from outside
# keeps all it wrote): summary.txt (one line per step: status, seconds, box, cubins compiled,
# then the step's last lines), run.log (every step's full output, headed), tuning/<model>.yaml,
# bench.json, bench-fla.json, bench-fewhead.json, bench-decode.json, accuracy.json.
# pytest runs with -v -rA (each test's name when it starts and its outcome when it ends, then
# the summary), a faulthandler timeout (a test stuck past it dumps every thread's stack) and,
# where pytest-timeout is installed, a per-test timeout. A box sends SIGINT first (pytest then
# still prints its summary and durations; a CLI its traceback), SIGKILL 5 s later. Status 124:
# the box ran out.
#
# --cpu-rehearsal runs every step's CPU form on this machine (GPU tests skip, the sanitizer runs
# on the precision model, tune and bench with --dry-run) and checks that each step starts, writes
# its log under $OUT and ends with status 0 (5 for a pytest step whose tests all skip), and that
# $OUT holds no other file than the eight above; exit status 1 otherwise.
#
# FLA travels as wheels in .whl/ (ignored by git), made on a machine with internet access with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl flash-linear-attention fla-core
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
MODE=gpu ONLY=""
while [ $# -gt 0 ]; do
  case $1 in
    --cpu-rehearsal) MODE=cpu ;;
    --print-steps) MODE=print ;;
    --only) shift; while [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; do ONLY+=" $1"; shift; done; continue ;;
    *) echo "usage: bash benchmarks/device_check.sh [--cpu-rehearsal | --print-steps] [--only N...]" >&2; exit 2 ;;
  esac
  shift
done

# ---------------------------------------------------------------------------------------------
# the steps: name, box (s), the GPU command, the CPU rehearsal's command (default: the same).
# Commands are bash text run with $PY, $PYTEST, $OUT and $SAN set.
NAMES=() BOXES=() GPU_CMDS=() CPU_CMDS=()
add() { NAMES+=("$1"); BOXES+=("$2"); GPU_CMDS+=("$3"); CPU_CMDS+=("${4:-$3}"); }
NO_SAN='test -n "$SAN" || { echo "compute-sanitizer: not found on this machine; skipped"; exit 0; }; '

add "FLA wheels" 15 \
  'if ls .whl/*.whl >/dev/null 2>&1; then $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl && ls "$SITE"; else echo "no .whl/: FLA is not installed (its columns stay empty)"; fi'
add "device info" 10 \
  'nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total,memory.used --format=csv || echo "nvidia-smi: none"; echo "commit: ${KDACUPY_COMMIT:-unknown}"; uname -r; nproc; $PY benchmarks/device_info.py'
add "PTX conformance" 25 '$PYTEST -s tests/gpu/test_gpu_ptx.py'
add "GPU suite: forward, decode, seqpar" 55 \
  '$PYTEST --durations=15 tests/gpu --ignore=tests/gpu/test_gpu_ptx.py --ignore=tests/gpu/test_gpu_long.py --ignore=tests/gpu/test_gpu_distributed.py'
add "tuning (Kimi shapes)" 25 \
  '$PY -m kdacupy.tune --shapes kimi --iters 20 --warmup 3' \
  '$PY -m kdacupy.tune --shapes kimi --dry-run --arch sm_90 --jobs 2'
add "benchmark, Kimi shapes, tuned tiles" 20 \
  '$PY -m kdacupy.bench --shapes kimi --no-fla --json "$OUT/bench.json"' \
  '$PY -m kdacupy.bench --shapes kimi --no-fla --dry-run'
add "benchmark against FLA (H = 96)" 75 \
  '$PY -m kdacupy.bench --shapes kimi96 --json "$OUT/bench-fla.json"' \
  '$PY -m kdacupy.bench --shapes kimi96 --dry-run'
add "compute-sanitizer memcheck" 20 \
  "$NO_SAN"'"$SAN" --tool memcheck --error-exitcode 9 $PY benchmarks/sanitize.py' \
  '$PY benchmarks/sanitize.py --backend model'
add "compute-sanitizer racecheck" 25 \
  "$NO_SAN"'"$SAN" --tool racecheck --error-exitcode 9 $PY benchmarks/sanitize.py --only forward pool split maps' \
  '$PY benchmarks/sanitize.py --backend model --only forward pool split maps'
add "compute-sanitizer synccheck" 15 \
  "$NO_SAN"'"$SAN" --tool synccheck --error-exitcode 9 $PY benchmarks/sanitize.py' \
  '$PY benchmarks/sanitize.py --backend model'
add "GPU long sweep (T = 8192)" 20 '$PYTEST -s --durations=5 tests/gpu/test_gpu_long.py'
add "accuracy, T = 8192, fp32 state" 12 \
  '$PY -m kdacupy.accuracy --backend cuda --T 8192 --H 1 --quick --state-precision fp32 --json "$OUT/accuracy.json"' \
  '$PY -m kdacupy.accuracy --backend model --T 256 --H 1 --quick --state-precision fp32'
add "adversarial accuracy" 15 \
  '$PY -m kdacupy.accuracy --backend cuda --adversarial --H 1' \
  '$PY -m kdacupy.accuracy --backend model --adversarial --H 1 --T 64 --K 64 --V 64'
add "few heads: serial vs split" 30 \
  '$PY -m kdacupy.bench --shapes fewhead --no-fla --split 4 16 --iters 5 --warmup 1 --json "$OUT/bench-fewhead.json"' \
  '$PY -m kdacupy.bench --shapes fewhead --no-fla --dry-run'
add "decode on a state pool, against FLA" 40 \
  '$PY -m kdacupy.bench --shapes decode --decode-n 1 64 512 --iters 60 --warmup 3 --json "$OUT/bench-decode.json"' \
  '$PY -m kdacupy.bench --shapes decode --decode-n 1 64 512 --iters 1 --dry-run'
add "context parallelism (NCCL, MPI)" 15 '$PYTEST tests/gpu/test_gpu_distributed.py'

#: what may be left under $OUT (the rehearsal checks it)
RESULTS="summary.txt run.log bench.json bench-fla.json bench-fewhead.json bench-decode.json accuracy.json"

if [ "$MODE" = print ]; then
  for i in "${!NAMES[@]}"; do
    printf '%s\t%s\t%s\t%s\n' "${NAMES[$i]}" "${BOXES[$i]}" "${GPU_CMDS[$i]}" "${CPU_CMDS[$i]}"
  done
  exit 0
fi

# ---------------------------------------------------------------------------------------------
OUT=${OUT:-/tmp/kdacupy-out}
mkdir -p "$OUT/tuning"
SUMMARY=$OUT/summary.txt LOG=$OUT/run.log
: > "$SUMMARY"
: > "$LOG"
PY=${PYTHON:-python3}
if [ "$MODE" = gpu ]; then SITE=/tmp/site; else SITE=$(mktemp -d /tmp/kdacupy-site.XXXXXX); fi
TIMEOUT_OPT=""
"$PY" -c "import pytest_timeout" >/dev/null 2>&1 && TIMEOUT_OPT="--timeout=45"  # the plugin loads itself
PYTEST="$PY -m pytest -v -rA -p no:cacheprovider -o faulthandler_timeout=30 $TIMEOUT_OPT"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
export PY PYTEST OUT SAN SITE
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KDACUPY_TUNING_DIR=$OUT/tuning
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX (the torch/JAX input test) takes memory as it needs it
# one BLAS thread: the float64 checks multiply small matrices, where more threads only contend
# (the boxes' CPU costs were measured so; two threads on a busy 2-core machine ran 9x slower)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
CUBINS=${CUPY_CACHE_DIR:-$HOME/.cupy/kernel_cache}
start=$SECONDS
total=0
for b in "${BOXES[@]}"; do total=$((total + b)); done
echo "kdacupy device check ($MODE) at commit ${KDACUPY_COMMIT:-unknown}; ${#NAMES[@]} steps, boxes sum to $total s" \
  | tee -a "$SUMMARY"

cubins() { find "$CUBINS" -type f 2>/dev/null | wc -l; }

# step I: runs step I's command for this mode under its box, appends its output to run.log,
# its status line and last lines to summary.txt
step() {
  local i=$1 name=${NAMES[$1]} box=${BOXES[$1]} cmd t0=$SECONDS rc from c0 status
  [ -n "${BOX_OVERRIDE:-}" ] && box=$BOX_OVERRIDE  # tests of this script only
  if [ "$MODE" = gpu ]; then cmd=${GPU_CMDS[$i]}; else cmd=${CPU_CMDS[$i]}; fi
  c0=$(cubins)
  printf '\n===== step %d: %s (at %d s, box %d s)\n$ %s\n' $((i + 1)) "$name" $((SECONDS - start)) "$box" "$cmd" >> "$LOG"
  from=$(($(wc -c < "$LOG") + 1))
  echo "== $((i + 1)) $name (box $box s)"
  timeout -s INT -k 5 "$box" bash -c "$cmd" >> "$LOG" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    5) status="ok (no test ran here)"; [ "$MODE" = gpu ] && status="NOTHING RAN" ;;
    124|137) status="TIMED OUT (box $box s)" ;;
    *) status=FAILED ;;
  esac
  printf '%2d %-38s rc=%-3d %4d s of %3d  cubins +%-3d %s\n' $((i + 1)) "$name" "$rc" $((SECONDS - t0)) "$box" \
    $(($(cubins) - c0)) "$status" >> "$SUMMARY"
  tail -c +"$from" "$LOG" | tail -n 12 | sed 's/^/      /' >> "$SUMMARY"
  printf '===== step %d ended: status %d (%s) after %d s\n' $((i + 1)) "$rc" "$status" $((SECONDS - t0)) >> "$LOG"
  RCS+=("$rc")
}

RCS=()
for i in "${!NAMES[@]}"; do
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $((i + 1)) "* ]]; then RCS+=("skipped"); continue; fi
  step "$i"
  if [ "$i" = 0 ] && [ -n "$(ls -A "$SITE" 2>/dev/null)" ]; then
    export PYTHONPATH=$PYTHONPATH:$SITE  # FLA for every later step
  fi
done

# Predictions: where the emulation profiler's prediction of each kernel's time (its counters
# and roofline) will go, next to the measured times, once it exists; nothing is predicted yet.
echo "predictions (the emulation profiler's, per kernel): none yet" >> "$SUMMARY"
echo "total $((SECONDS - start)) s" | tee -a "$SUMMARY"
[ "$MODE" = cpu ] && rm -rf "$SITE"

if [ "$MODE" = cpu ]; then
  bad=0
  for i in "${!NAMES[@]}"; do
    [ "${RCS[$i]}" = skipped ] && continue
    if ! grep -q "^===== step $((i + 1)): " "$LOG" || ! grep -q "^===== step $((i + 1)) ended: " "$LOG"; then
      echo "rehearsal: step $((i + 1)) (${NAMES[$i]}) left no log" | tee -a "$SUMMARY"; bad=1
    fi
    case ${RCS[$i]} in 0|5) ;; *) echo "rehearsal: step $((i + 1)) (${NAMES[$i]}) ended with status ${RCS[$i]}" \
      | tee -a "$SUMMARY"; bad=1 ;; esac
  done
  while IFS= read -r f; do
    rel=${f#"$OUT"/}
    case " $RESULTS " in *" $rel "*) continue ;; esac
    [[ $rel == tuning/*.yaml ]] && continue
    echo "rehearsal: unexpected file under \$OUT: $rel" | tee -a "$SUMMARY"; bad=1
  done < <(find "$OUT" -type f)
  [ $bad = 0 ] && echo "rehearsal: every step started, logged and ended" | tee -a "$SUMMARY"
  exit $bad
fi
exit 0
