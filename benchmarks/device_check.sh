#!/usr/bin/env bash
# The one prepared run on a GPU machine (docs/design.md section 4, tier 5), in this order,
# every step time-boxed (timeout), all within 8 minutes, each step's output kept even when an
# earlier step fails (no `set -e`, no `pytest -x`):
#   1 device info                                                              10 s
#   2 PTX conformance (tests/gpu/test_gpu_ptx.py)                              35 s
#   3 GPU suite: forward, decode, sequence parallelism, context parallelism
#     (NCCL, one rank), DLPack, graphs, streams (tests/gpu/, no -x)           130 s
#     then the T=8192 sweep last (tests/gpu/test_gpu_long.py)                  50 s
#   4 compute-sanitizer memcheck / racecheck / synccheck on small forwards   3 x 15 s
#   5 accuracy on the GPU: T=8192 fp32 state, one head; the adversarial sweep  20 + 30 s
#   6 tuning (Kimi shapes; a cut-off run keeps its sidecar, in the archive)    30 s
#   7 benchmarks: Kimi shapes against FLA; few-head serial vs split;
#     decode on a state pool against FLA's fused_recurrent_kda                 40 + 45 + 30 s
# (boxes sum to 465 s; the rest of the 8 minutes is pip, tar and Python start-up)
#
#   on the GPU machine:  KDACUPY_COMMIT=<sha> bash benchmarks/device_check.sh   (with .whl/ for FLA)
#
# What comes back: $OUT/summary.txt (device, then one line per step: exit status, seconds,
# the log's last lines), $OUT/logs.tar.gz (every step's full log, re-made after each step),
# and the JSON/YAML results when those steps got that far. Exit status 124 in a step's line
# means its time box ran out.
#
# FLA travels as wheels in .whl/ (ignored by git), made on a machine with internet access with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl flash-linear-attention fla-core
set -uo pipefail
OUT=${OUT:-/tmp/kdacupy-out}
WORK=$(mktemp -d /tmp/kdacupy-run.XXXXXX)
mkdir -p "$OUT" "$WORK/tuning"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KDACUPY_TUNING_DIR=$WORK/tuning
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX (torch/JAX input test) takes memory as needed
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$WORK/pip.log" 2>&1 && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
SUMMARY=$OUT/summary.txt
start=$SECONDS
: > "$SUMMARY"
pack() { tar czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null; }
# step NAME SECONDS LOG CMD...: runs CMD under `timeout`, records status and time, echoes the tail
step() {
  local name=$1 box=$2 log=$WORK/$3 t0=$SECONDS rc
  shift 3
  echo "== $name (at $((SECONDS - start)) s, box $box s)"
  timeout -k 5 "$box" "$@" > "$log" 2>&1
  rc=$?
  printf '%-34s rc=%-3s %4d s  %s\n' "$name" "$rc" $((SECONDS - t0)) "$(basename "$log")" >> "$SUMMARY"
  tail -n 12 "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
  pack
}

# 1 device info
step "device info" 10 device.txt bash -c '
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total,memory.used --format=csv
  echo "commit: ${KDACUPY_COMMIT:-unknown}"; uname -r; nproc
  python3 -c "import cupy, numpy; print(\"cupy\", cupy.__version__, \"numpy\", numpy.__version__, \"cuda runtime\", cupy.cuda.runtime.runtimeGetVersion(), \"nvrtc\", cupy.cuda.nvrtc.getVersion()); print(\"cc\", cupy.cuda.Device().compute_capability, \"SMs\", cupy.cuda.Device().attributes[\"MultiProcessorCount\"])"
  command -v g++ c++ || echo "no host C++ compiler (emulation-based checks skip)"
  command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null || echo "compute-sanitizer: not found"'

# 2 PTX conformance: the twin tests' kernels on the GPU (bit-exact cvt/ldmatrix/cp.async/integer mma,
#   .approx within the ISA bounds, the mma accumulation probe's table with -s)
step "PTX conformance" 35 ptx.log python3 -m pytest -q -rs -s tests/gpu/test_gpu_ptx.py

# 3 the GPU suite without -x, the long sweep last
step "GPU suite" 130 gpu_tests.log python3 -m pytest -q -rs --durations=15 tests/gpu \
  --ignore=tests/gpu/test_gpu_ptx.py --ignore=tests/gpu/test_gpu_long.py
step "GPU long sweep (T=8192)" 50 gpu_long.log python3 -m pytest -q -rs -s --durations=5 tests/gpu/test_gpu_long.py

# 4 compute-sanitizer on small forwards (CuPy's pool off: every array its own allocation)
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [ -n "$SAN" ]; then
  for tool in memcheck racecheck synccheck; do
    step "compute-sanitizer $tool" 15 "sanitize-$tool.log" "$SAN" --tool "$tool" --error-exitcode 9 \
      python3 benchmarks/sanitize_forward.py
  done
else
  echo "compute-sanitizer                  skipped: not installed on this machine" | tee -a "$SUMMARY"
fi

# 5 accuracy against the float64 reference
step "accuracy on the GPU, T=8192" 20 accuracy.txt python3 -m kdacupy.accuracy --backend cuda --T 8192 --H 1 --quick \
  --state-precision fp32 --json "$WORK/accuracy.json"
step "adversarial accuracy on the GPU" 30 accuracy-adversarial.txt python3 -m kdacupy.accuracy --backend cuda \
  --adversarial --H 1 --json "$WORK/accuracy-adversarial.json"

# 6 tuning
step "tuning (Kimi shapes)" 30 tune.log python3 -m kdacupy.tune --shapes kimi --output "$WORK/tuning/tuned.yaml"

# 7 benchmarks
step "benchmark against FLA (Kimi)" 40 bench.txt python3 -m kdacupy.bench --shapes kimi --json "$WORK/bench.json"
step "few-head: serial vs split" 45 bench-fewhead.txt python3 -m kdacupy.bench --shapes fewhead --no-fla \
  --split 4 16 --iters 5 --warmup 1 --json "$WORK/bench-fewhead.json"
step "decode on a state pool" 30 bench-decode.txt python3 -m kdacupy.bench --shapes decode --iters 30 --warmup 3 \
  --json "$WORK/bench-decode.json"

for f in accuracy.json accuracy-adversarial.json tuning/tuned.yaml bench.json bench-fewhead.json bench-decode.json; do
  [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/$(basename "$f")"
done
echo "total $((SECONDS - start)) s" | tee -a "$SUMMARY"
pack
