#!/usr/bin/env bash
# The one prepared run on a GPU machine (docs/design.md section 4, tier 5): every step in its
# own process under its own time box, the most telling first, each step's output kept even
# when an earlier step fails or hangs (no `set -e`, no `pytest -x`), the whole run within a
# budget of 420 s.
#
#   on the GPU machine:    KDACUPY_COMMIT=<sha> bash benchmarks/device_check.sh     (FLA from .whl/)
#   on any CPU machine:    bash benchmarks/device_check.sh --cpu-rehearsal           (CI runs this)
#   the steps, no run:     bash benchmarks/device_check.sh --print-steps
#   a rerun of some steps: bash benchmarks/device_check.sh --only 1 9    (step 1 brings FLA; steps
#                          8-10 read step 7's tuning file when $OUT still holds it, else heuristic tiles)
#
# The budget: 420 s, so that with the machine's start one rerun of a failed step still fits 15
# minutes on the machine. Before each step, if the time so far plus the step's box would pass the
# budget, the step is not started (summary.txt: "not run: only N s of the 420 s budget left, box M
# s; rerun with --only K") and the run goes on to the later, smaller steps; --only reruns obey it
# too. So the boxes' sum, 702 s, may pass the budget: the guaranteed prefix (steps 1-13: every
# box used to its end, 410 s) holds the must-haves, and the estimates are about half the boxes,
# so the steps after it usually run too. Step 2 runs in the background from step 1's end until
# step 7 starts (no timing step runs beside it); its box ends inside steps 3-6's (130 s), so it
# costs the prefix nothing. In seconds ("?": a guess, which only the GPU machine can measure):
#
#  #  step                                      box  est  what it will tell us
#  1  FLA wheels                                 15    3  whether FLA is there for the comparisons
#  2  FLA's Triton kernels, compiled ahead       90   26  (background) FLA's first chunk_kda calls find their binaries
#  3  device info                                10    4  GPU, driver, CuPy/NVRTC, the runtime's target (sm_90a), tools
#  4  PTX conformance                            25   15  whether the CPU twins are the hardware (bit-exact cvt,
#                                                         ldmatrix, cp.async, mma, wgmma, mbarrier, bulk copy;
#                                                         .approx bounds; the mma and wgmma accumulation
#                                                         models): is the emulation's evidence valid
#  5  GPU suite: forward, decode, seqpar         55   39  parity with the precision model over the option matrix,
#                                                         graphs, streams, 2^31 offsets, DLPack: are the kernels right
#  6  GPU backward                               40   28  the backward's parity with the model, accuracy against the
#                                                         float64 gradient, bitwise repeatability, graphs, stream;
#                                                         any head size (K = 60, V = 100): forward and backward
#  7  tuning (Kimi shapes)                       30   19  the fastest tiles per bucket (mma.sync and wgmma), into the file kda_forward reads
#  8  benchmark, Kimi shapes, tuned tiles        20   10  kdacupy's times, GB/s against the copy bandwidth (the floor)
#  9  benchmark against FLA (H = 96)             75  48?  FLA / kdacupy on the same inputs, and their agreement
# 10  backward against FLA (T = 8192, H = 96)    60  32?  fwd+bwd FLA / kdacupy (goal 1.5), gradients' agreement
# 11  compute-sanitizer memcheck                 20   8?  out-of-bounds accesses the emulation cannot see
# 12  GPU long sweep (T = 8192)                  20   12  RMSE against the float64 reference over the gate/bias sweep
# 13  decode on a state pool, against FLA        40  25?  device / stream / host time per step; FLA's pool decode
# 14  compute-sanitizer racecheck                25  12?  shared-memory races (forward, pool, split, maps)
# 15  compute-sanitizer synccheck                15   7?  barrier misuse
# 16  accuracy, T = 8192, fp32 state             12    6  the fp32-state mode's accuracy on the GPU
# 17  adversarial accuracy                       15    8  repeated / collinear keys on the GPU
# 18  frameworks on the GPU                      60  34?  torch's stream, zero copy, no host sync, graph capture,
#                                                         inductor, fla's Triton decode, JAX under jit on XLA's stream
# 19  few heads: serial vs split                 30   15  what sequence parallelism buys (calibrates its heuristic)
# 20  Nsight Compute: instructions per kernel    30  18?  warp instructions executed in all and on the busiest
#                                                         scheduler, issue-active cycles, per kernel (kimi-T8192-H64),
#                                                         next to the issue-aware profile's (where ncu is installed)
# 21  context parallelism (NCCL, MPI)            15  11?  CP forward and backward on the GPU (CuPy's NCCL, torch's,
#                                                         MPI), one rank; last, so an NCCL hang costs only its box
#
# How the boxes were sized (measured on a 2-core CPU machine without a GPU, then a margin of
# about 1.5-2x for what only the GPU machine can tell):
# - compiles: benchmarks/device_census.py runs every step's calls through the emulation with a
#   recording loader. Steps run in this order and CuPy's kernel cache is on disk, so a variant is
#   compiled once, by the first step that asks for it: step 5 compiles 59 (14 prepare, 23
#   recurrence, 16 decode, 6 scan), step 6 25 (5 prepare, 8 recurrence storing chunk states,
#   6 bwd_chunk, 4 bwd_chain, 2 bwd_reduce), 7 7 (the other tile candidates; on sm_90a the wgmma
#   ones too: 12 candidates per Kimi bucket instead of 8, so its box went 25 -> 30 s), 10 none, 13 2,
#   17 3, 18 8 (the frameworks' kdacupy calls), 19 2, the rest none (the sanitizer runs reuse step
#   5's). NVRTC per variant for sm_90 here (python -m kdacupy.compile --arch sm_90 --jobs 1;
#   device_census.py --time): prepare 0.23 s, recurrence 0.37 s (0.41 storing states), decode
#   0.09 s, scan 0.38 s, bwd_chain 0.42 s, bwd_chunk 0.72 s, bwd_reduce 0.04 s of CPU; step 5's
#   compiles are ~15 s, step 6's ~10 s, one after another in one process.
# - FLA's first calls (device_census.py --time-fla: FLA's launches recorded on CPU tensors with
#   an H200's configuration lists, each compiled for sm_90 through Triton's own specialisation):
#   FLA's autotuner compiles every configuration it lists, one after another, and times each
#   (triton.testing.do_bench: ~0.2 s a configuration). Step 9: 188 configurations (fixed, then
#   varlen keys), 68 s of compiles here; step 10: 109 more for the backward, 63 s. Step 2
#   (benchmarks/fla_precompile.py) compiles exactly those in 8 processes through Triton's JIT
#   warm-up, into the on-disk cache steps 9 and 10 read: 131 s of CPU in ~16 s, plus ~10 s of
#   imports and recording; what remains of steps 9 and 10 is FLA's autotuning (~38 s and ~22 s,
#   the guess in their estimates). Should a binary be missed, FLA compiles it itself: step 9
#   then needs ~115 s and step 10 ~95 s, and their boxes cut them (step 10 writes kdacupy's
#   times before FLA's first call; step 9 the JSON after each shape, kdacupy first). Step 13's
#   FLA is fused_recurrent_kda_fwd: no autotuning, one Triton compile per head count, pool dtype
#   and T = 1 / verify (8), compiled by the step itself.
# - the CPU side of the checks (one core, this machine): the float64 reference at T = 8192,
#   H = 4, K = V = 128 1.6 s (H = 1: 0.13 s); the precision model at T = 8192, H = 1 0.6 s; one
#   job of the long sweep (model chained over 256-token segments plus the reference) 1.6 s,
#   twelve in parallel processes; step 5's 68 model runs 0.8 s; the mma probe of step 4 1.5 s
#   (its sm_90a probes: NVRTC 1.7 s, the wgmma model table 2.3 s);
#   step 6's backward float64 reference at T = 1024, H = 4 0.65 s (three tests), its ten model
#   runs 0.25 s.
# - fixed costs: Python with CuPy and kdacupy 0.3 s, pytest collection of tests/gpu 0.5 s, the
#   GPU's context a second or so; imports here: torch 1.2 s, kdacupy.torch 1.1 s, torch with
#   fla.ops.kda 4.4 s, JAX 0.7 s on the CPU (its CUDA plugin's start on the GPU: a guess, a few
#   seconds). Step 18 also compiles one decode step with torch.compile (inductor: a guess,
#   ~10 s cold) and runs fla's naive reference and one Triton decode kernel.
# - GPU time is small everywhere (the largest input is step 5's 45 GB offsets test), except
#   FLA's autotuning above. compute-sanitizer slows kernels by a factor no CPU measurement
#   gives; its runs are small (the shapes of step 5's cheapest tests, every variant compiled).
# - each box is about 1.5-2x its estimate; an estimate is the sum of the terms above for the
#   step's own calls (e.g. step 6: 3 s start and collection, 10 s compiles, 2.3 s references and
#   model runs, 2 s on the GPU, 3 s the tests' own overhead; step 10: 6 s imports and context,
#   2 s kdacupy, 22 s FLA's autotuning, 2 s FLA's timed runs).
# - tests/test_device_check.py holds the budget, the prefix's must-haves and every step's CPU form.
#
# Output: eight files under $OUT at most, written as the run goes (a run cut off from outside
# keeps all it wrote): summary.txt (one line per step: status, seconds, box, cubins compiled,
# then the step's last lines; the steps not run; the profiler's predictions next to the measured
# times), run.log (every step's full output, headed), tuning/<model>.yaml, bench.json,
# bench-fla.json, bench-backward.json, bench-decode.json, bench-fewhead.json (step 20's Nsight
# Compute table is in run.log and summary.txt, where ncu exists; step 16's accuracy
# table is in run.log and summary.txt; step 2's log is $OUT/step-2.log until step 7 appends it to
# run.log). pytest runs with -v -rA (each test's name when it starts and its outcome when it
# ends, then the summary), a faulthandler timeout (a test stuck past it dumps every thread's
# stack) and, where pytest-timeout is installed, a per-test timeout. A box sends SIGINT first
# (pytest then still prints its summary and durations; a CLI its traceback), SIGKILL 5 s later.
# Status 124: the box ran out.
#
# --cpu-rehearsal runs every step's CPU form on this machine (GPU tests skip, the sanitizer runs
# on the precision model, tune and bench with --dry-run, step 2 checks every FLA launch through
# Triton's binder) and checks that each step starts, writes its log under $OUT and ends with
# status 0 (5 for a pytest step whose tests all skip), that none was left out for the budget,
# and that $OUT holds no other file than the eight above; exit status 1 otherwise.
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
BUDGET=${DEVICE_CHECK_BUDGET:-420}  # seconds; the variable is for tests of this script

# ---------------------------------------------------------------------------------------------
# the steps: name, box (s), the GPU command, the CPU rehearsal's command (default: the same),
# and for a background step the step before which it is joined. Commands are bash text run with
# $PY, $PYTEST, $OUT and $SAN set.
NAMES=() BOXES=() GPU_CMDS=() CPU_CMDS=() JOINS=()
add() { NAMES+=("$1"); BOXES+=("$2"); GPU_CMDS+=("$3"); CPU_CMDS+=("${4:-$3}"); JOINS+=("${5:-}"); }
NO_SAN='test -n "$SAN" || { echo "compute-sanitizer: not found on this machine; skipped"; exit 0; }; '

add "FLA wheels" 15 \
  'if ls .whl/*.whl >/dev/null 2>&1; then $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl && ls "$SITE"; else echo "no .whl/: FLA is not installed (its columns stay empty)"; fi'
add "FLA's Triton kernels, compiled ahead" 90 \
  '$PY benchmarks/fla_precompile.py' \
  'nice -n 10 $PY benchmarks/fla_precompile.py --dry-run --workers 1' 7
add "device info" 10 \
  'nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total,memory.used --format=csv || echo "nvidia-smi: none"; echo "commit: ${KDACUPY_COMMIT:-unknown}"; uname -r; nproc; $PY benchmarks/device_info.py'
add "PTX conformance" 25 '$PYTEST -s tests/gpu/test_gpu_ptx.py'
add "GPU suite: forward, decode, seqpar" 55 \
  '$PYTEST --durations=15 tests/gpu --ignore=tests/gpu/test_gpu_ptx.py --ignore=tests/gpu/test_gpu_long.py --ignore=tests/gpu/test_gpu_distributed.py --ignore=tests/gpu/test_gpu_backward.py --ignore=tests/gpu/test_gpu_any_dims.py'
add "GPU backward" 40 '$PYTEST --durations=10 tests/gpu/test_gpu_backward.py tests/gpu/test_gpu_any_dims.py'
add "tuning (Kimi shapes)" 30 \
  '$PY -m kdacupy.tune --shapes kimi --iters 20 --warmup 3' \
  '$PY -m kdacupy.tune --shapes kimi --dry-run --arch sm_90 --jobs 2'
add "benchmark, Kimi shapes, tuned tiles" 20 \
  '$PY -m kdacupy.bench --shapes kimi --no-fla --json "$OUT/bench.json"' \
  '$PY -m kdacupy.bench --shapes kimi --no-fla --dry-run'
add "benchmark against FLA (H = 96)" 75 \
  '$PY -m kdacupy.bench --shapes kimi96 --json "$OUT/bench-fla.json"' \
  '$PY -m kdacupy.bench --shapes kimi96 --dry-run'
add "backward against FLA (T = 8192, H = 96)" 60 \
  '$PY -m kdacupy.bench --shapes backward kimi-T8192-H96 --iters 20 --warmup 3 --json "$OUT/bench-backward.json"' \
  '$PY -m kdacupy.bench --shapes backward kimi-T8192-H96 --dry-run'
add "compute-sanitizer memcheck" 20 \
  "$NO_SAN"'"$SAN" --tool memcheck --error-exitcode 9 $PY benchmarks/sanitize.py' \
  '$PY benchmarks/sanitize.py --backend model'
add "GPU long sweep (T = 8192)" 20 '$PYTEST -s --durations=5 tests/gpu/test_gpu_long.py'
add "decode on a state pool, against FLA" 40 \
  '$PY -m kdacupy.bench --shapes decode --decode-n 1 64 512 --iters 60 --warmup 3 --json "$OUT/bench-decode.json"' \
  '$PY -m kdacupy.bench --shapes decode --decode-n 1 64 512 --iters 1 --dry-run'
add "compute-sanitizer racecheck" 25 \
  "$NO_SAN"'"$SAN" --tool racecheck --error-exitcode 9 $PY benchmarks/sanitize.py --only forward pool split maps' \
  '$PY benchmarks/sanitize.py --backend model --only forward pool split maps'
add "compute-sanitizer synccheck" 15 \
  "$NO_SAN"'"$SAN" --tool synccheck --error-exitcode 9 $PY benchmarks/sanitize.py' \
  '$PY benchmarks/sanitize.py --backend model'
add "accuracy, T = 8192, fp32 state" 12 \
  '$PY -m kdacupy.accuracy --backend cuda --T 8192 --H 1 --quick --state-precision fp32' \
  '$PY -m kdacupy.accuracy --backend model --T 256 --H 1 --quick --state-precision fp32'
add "adversarial accuracy" 15 \
  '$PY -m kdacupy.accuracy --backend cuda --adversarial --H 1' \
  '$PY -m kdacupy.accuracy --backend model --adversarial --H 1 --T 64 --K 64 --V 64'
add "frameworks on the GPU" 60 '$PYTEST --durations=10 tests/frameworks/test_gpu_frameworks.py'
add "few heads: serial vs split" 30 \
  '$PY -m kdacupy.bench --shapes fewhead --no-fla --split 4 5 16 --iters 5 --warmup 1 --json "$OUT/bench-fewhead.json"' \
  '$PY -m kdacupy.bench --shapes fewhead --no-fla --dry-run'
add "Nsight Compute: instructions per kernel" 30 \
  'NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1); if [ -z "$NCU" ]; then echo "ncu: not found on this machine (the issue term stays unchecked); the predictions:"; $PY benchmarks/ncu_issue.py; exit 0; fi; "$NCU" --csv --metrics "$($PY benchmarks/ncu_issue.py --metrics)" -k regex:kda_ -c 4 $PY -m kdacupy.bench --shapes kimi-T8192-H64 --no-fla --no-split --iters 1 --warmup 0 > /tmp/kdacupy-ncu.csv 2>&1; rc=$?; $PY benchmarks/ncu_issue.py /tmp/kdacupy-ncu.csv; exit $rc' \
  '$PY benchmarks/ncu_issue.py'
add "context parallelism (NCCL, MPI)" 15 '$PYTEST tests/gpu/test_gpu_distributed.py'

#: what may be left under $OUT (the rehearsal checks it), with tuning/<model>.yaml
RESULTS="summary.txt run.log bench.json bench-fla.json bench-backward.json bench-decode.json bench-fewhead.json"

# the guaranteed prefix: the steps that start even when every box before them is used to its end
# (a background step's box runs beside the steps before its join)
prefix() {
  local t=0 bg_end=0 n=0 i
  for i in "${!NAMES[@]}"; do
    for j in "${!JOINS[@]}"; do [ "${JOINS[$j]}" = $((i + 1)) ] && [ $t -lt $bg_end ] && t=$bg_end; done
    [ $((t + BOXES[i])) -gt "$BUDGET" ] && break
    if [ -n "${JOINS[$i]}" ]; then bg_end=$((t + BOXES[i])); else t=$((t + BOXES[i])); fi
    n=$((i + 1))
  done
  echo "$n $t"
}

if [ "$MODE" = print ]; then
  for i in "${!NAMES[@]}"; do
    printf '%s\t%s\t%s\t%s\t%s\n' "${NAMES[$i]}" "${BOXES[$i]}" "${GPU_CMDS[$i]}" "${CPU_CMDS[$i]}" "${JOINS[$i]}"
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
read -r guaranteed prefix_s < <(prefix)
echo "kdacupy device check ($MODE) at commit ${KDACUPY_COMMIT:-unknown}; ${#NAMES[@]} steps, boxes sum to $total s;" \
  "budget $BUDGET s, which steps 1-$guaranteed fit even when every box runs out ($prefix_s s)" | tee -a "$SUMMARY"

cubins() { find "$CUBINS" -type f 2>/dev/null | wc -l; }
RCS=() NOT_RUN=()

# whether step I's box fits what is left of the budget; if not, says so and records it
fits() {
  local i=$1 box=$2 left=$((BUDGET - (SECONDS - start)))
  [ "$box" -le "$left" ] && return 0
  [ $left -lt 0 ] && left=0
  printf '%2d %-38s not run: only %d s of the %d s budget left, box %d s; rerun with --only %d\n' $((i + 1)) \
    "${NAMES[$i]}" "$left" "$BUDGET" "$box" $((i + 1)) >> "$SUMMARY"
  printf '\n===== step %d: %s not run (at %d s: only %d s of the %d s budget left, box %d s)\n===== step %d ended: not run\n' \
    $((i + 1)) "${NAMES[$i]}" $((SECONDS - start)) "$left" "$BUDGET" "$box" $((i + 1)) >> "$LOG"
  echo "== $((i + 1)) ${NAMES[$i]}: not run (budget)"
  RCS[$i]=notrun NOT_RUN+=($((i + 1)))
  return 1
}

status_of() {  # rc -> the summary's word for it
  case $1 in
    0) echo ok ;;
    5) if [ "$MODE" = gpu ]; then echo "NOTHING RAN"; else echo "ok (no test ran here)"; fi ;;
    124|137) echo "TIMED OUT (box $2 s)" ;;
    *) echo FAILED ;;
  esac
}

box_of() { if [ -n "${BOX_OVERRIDE:-}" ]; then echo "$BOX_OVERRIDE"; else echo "${BOXES[$1]}"; fi; }  # tests only
cmd_of() { if [ "$MODE" = gpu ]; then echo "${GPU_CMDS[$1]}"; else echo "${CPU_CMDS[$1]}"; fi; }

# step I: runs step I's command for this mode under its box, appends its output to run.log,
# its status line and last lines to summary.txt
step() {
  local i=$1 name=${NAMES[$1]} box cmd t0=$SECONDS rc from c0 status
  box=$(box_of "$i") cmd=$(cmd_of "$i")
  fits "$i" "$box" || return 0
  c0=$(cubins)
  printf '\n===== step %d: %s (at %d s, box %d s)\n$ %s\n' $((i + 1)) "$name" $((SECONDS - start)) "$box" "$cmd" >> "$LOG"
  from=$(($(wc -c < "$LOG") + 1))
  echo "== $((i + 1)) $name (box $box s)"
  timeout -s INT -k 5 "$box" bash -c "$cmd" >> "$LOG" 2>&1
  rc=$?
  status=$(status_of $rc "$box")
  printf '%2d %-38s rc=%-3d %4d s of %3d  cubins +%-3d %s\n' $((i + 1)) "$name" "$rc" $((SECONDS - t0)) "$box" \
    $(($(cubins) - c0)) "$status" >> "$SUMMARY"
  tail -c +"$from" "$LOG" | tail -n 12 | sed 's/^/      /' >> "$SUMMARY"
  printf '===== step %d ended: status %d (%s) after %d s\n' $((i + 1)) "$rc" "$status" $((SECONDS - t0)) >> "$LOG"
  RCS[$i]=$rc
}

# a background step: started here under its box, its output in $OUT/step-N.log (so a run cut off
# from outside keeps it) until join_background moves it into run.log and summary.txt
BG="" BG_PID="" BG_T0=0
start_background() {
  local i=$1 box cmd
  box=$(box_of "$i") cmd=$(cmd_of "$i")
  fits "$i" "$box" || return 0
  BG=$i BG_T0=$SECONDS
  echo "== $((i + 1)) ${NAMES[$i]} (background until step ${JOINS[$i]}, box $box s)"
  { timeout -s INT -k 5 "$box" bash -c "$cmd" > "$OUT/step-$((i + 1)).log" 2>&1; echo "@@ended $? $SECONDS" \
      >> "$OUT/step-$((i + 1)).log"; } &
  BG_PID=$!
}
join_background() {
  [ -n "$BG" ] || return 0
  local i=$BG box bglog="$OUT/step-$((BG + 1)).log" rc end status from
  box=$(box_of "$i")
  wait "$BG_PID"
  read -r _ rc end < <(grep '^@@ended ' "$bglog" | tail -n 1)
  rc=${rc:-1} end=${end:-$SECONDS}
  status=$(status_of "$rc" "$box")
  printf '\n===== step %d: %s (background from %d s, box %d s; joined at %d s)\n$ %s\n' $((i + 1)) "${NAMES[$i]}" \
    $((BG_T0 - start)) "$box" $((SECONDS - start)) "$(cmd_of "$i")" >> "$LOG"
  from=$(($(wc -c < "$LOG") + 1))
  grep -v '^@@ended ' "$bglog" >> "$LOG"
  printf '%2d %-38s rc=%-3d %4d s of %3d  (background) %s\n' $((i + 1)) "${NAMES[$i]}" "$rc" $((end - BG_T0)) "$box" \
    "$status" >> "$SUMMARY"
  tail -c +"$from" "$LOG" | tail -n 12 | sed 's/^/      /' >> "$SUMMARY"
  printf '===== step %d ended: status %d (%s) after %d s\n' $((i + 1)) "$rc" "$status" $((end - BG_T0)) >> "$LOG"
  rm -f "$bglog"
  RCS[$i]=$rc BG=""
}

for i in "${!NAMES[@]}"; do
  [ -n "$BG" ] && [ "${JOINS[$BG]}" = $((i + 1)) ] && join_background
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $((i + 1)) "* ]]; then RCS[$i]=skipped; continue; fi
  if [ -n "${JOINS[$i]}" ]; then start_background "$i"; else step "$i"; fi
  if [ "$i" = 0 ] && [ -n "$(ls -A "$SITE" 2>/dev/null)" ]; then
    export PYTHONPATH=$PYTHONPATH:$SITE  # FLA for every later step
  fi
done
join_background

if [ ${#NOT_RUN[@]} -gt 0 ]; then
  echo "not run for the budget: ${NOT_RUN[*]}; rerun with: bash benchmarks/device_check.sh --only ${NOT_RUN[*]}" \
    | tee -a "$SUMMARY"
fi
# the emulation profiler's prediction of each kernel's time next to the benchmark's measurement,
# with each kernel's latency term, dependent path per chunk and loads in flight against Little's
# law's need where the profile has them: what this run calibrates (docs/design.md section 11.1;
# reads JSON only; the predictions alone when step 8 or 10 left no JSON)
echo "predictions (the emulation profiler's, per kernel) next to the measured medians of step 8:" >> "$SUMMARY"
echo "issue-aware (docs/design.md section 11.4; the wgmma recurrence, sm_90a's heuristic and tuned choice):" >> "$SUMMARY"
$PY -m kdacupy.profile --show benchmarks/profile-kimi-h200-backward2.json --measured "$OUT/bench.json" >> "$SUMMARY" 2>&1
echo "the fused forward (sm_90a's serial default where fused.pays; one launch, the workspace in L2):" >> "$SUMMARY"
$PY -m kdacupy.profile --show benchmarks/profile-kimi-h200-step3o.json --measured "$OUT/bench.json" >> "$SUMMARY" 2>&1
echo "before the issue term (datasheet HBM, no schedulers; the wgmma recurrence):" >> "$SUMMARY"
$PY -m kdacupy.profile --show benchmarks/profile-kimi-h200-step2.json --measured "$OUT/bench.json" >> "$SUMMARY" 2>&1
echo "the backward and forward + backward next to step 10's (issue-aware):" >> "$SUMMARY"
$PY -m kdacupy.profile --show benchmarks/profile-kimi-h200-backward2.json --measured "$OUT/bench-backward.json" \
  >> "$SUMMARY" 2>&1
echo "the training step with kept states (save_for_backward) next to step 10's kept f+b:" >> "$SUMMARY"
$PY -m kdacupy.profile --show benchmarks/profile-kimi-h200-train.json --measured "$OUT/bench-backward.json" \
  >> "$SUMMARY" 2>&1
echo "few heads: the default call (sm_90a: the split on wgmma, the prepare's work in the maps' and final launches)" \
  "next to step 3o's:" >> "$SUMMARY"
$PY -m kdacupy.profile --show benchmarks/profile-fewhead-h200-step3o.json --measured "$OUT/bench-fewhead.json" \
  >> "$SUMMARY" 2>&1
echo "total $((SECONDS - start)) s" | tee -a "$SUMMARY"
[ "$MODE" = cpu ] && rm -rf "$SITE"

if [ "$MODE" = cpu ]; then
  bad=0
  for i in "${!NAMES[@]}"; do
    [ "${RCS[$i]}" = skipped ] && continue
    if ! grep -q "^===== step $((i + 1)): " "$LOG" || ! grep -q "^===== step $((i + 1)) ended: " "$LOG"; then
      echo "rehearsal: step $((i + 1)) (${NAMES[$i]}) left no log" | tee -a "$SUMMARY"; bad=1
    fi
    case ${RCS[$i]} in
      0|5) ;;
      notrun) echo "rehearsal: step $((i + 1)) (${NAMES[$i]}) was not run: the budget ran out" | tee -a "$SUMMARY"; bad=1 ;;
      *) echo "rehearsal: step $((i + 1)) (${NAMES[$i]}) ended with status ${RCS[$i]}" | tee -a "$SUMMARY"; bad=1 ;;
    esac
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
