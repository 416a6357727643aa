#!/usr/bin/env bash
# One time-boxed GPU run (docs/design.md section 4, step 5): GPU parity suite,
# accuracy on the GPU, a pruned tuning run, and the benchmark against FLA; well
# under 8 minutes. Every result is written under $OUT.
#
#   OUT=<dir> KDACUPY_COMMIT=<sha> bash benchmarks/device_check.sh     (with .whl/ for FLA)
#
# FLA travels as wheels in .whl/ (ignored by git), made on a machine with network access with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl flash-linear-attention fla-core
set -uo pipefail
OUT=${OUT:-/tmp/kdacupy-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KDACUPY_TUNING_DIR=$OUT/tuning
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
start=$SECONDS
stamp() { echo "== $1 ($((SECONDS - start)) s)"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
  echo "commit: ${KDACUPY_COMMIT:-unknown}"
  python3 -c 'import cupy, numpy; print("cupy", cupy.__version__, "numpy", numpy.__version__, "cuda runtime", cupy.cuda.runtime.runtimeGetVersion())'
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

stamp "GPU parity suite"
timeout 210 python3 -m pytest -q -x -rs tests/gpu/test_gpu_forward.py > "$OUT/gpu_tests.log" 2>&1
echo "pytest exit $?"; tail -n 15 "$OUT/gpu_tests.log"

stamp "accuracy on the GPU, T=8192"
timeout 60 python3 -m kdacupy.accuracy --backend cuda --T 8192 --quick --json "$OUT/accuracy.json" > "$OUT/accuracy.txt" 2>&1
tail -n 9 "$OUT/accuracy.txt"

stamp "tuning (Kimi shapes)"
timeout 100 python3 -m kdacupy.tune --shapes kimi --output "$OUT/tuning/NVIDIA-H200.yaml" > "$OUT/tune.log" 2>&1
echo "tune exit $?"; tail -n 8 "$OUT/tune.log"

stamp "benchmark against FLA"
timeout 150 python3 -m kdacupy.bench --shapes all --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
echo "bench exit $?"; tail -n 25 "$OUT/bench.txt"
stamp "done"
