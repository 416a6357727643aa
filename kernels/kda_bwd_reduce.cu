// kda_bwd_reduce: the sums over chunks of dA_log and dt_bias's gradients (docs/design.md section 9.3),
// from kda_bwd_chunk's per-chunk partial sums, each in one fixed order (slot by slot): the result
// is bitwise the same on every run, unlike a sum by atomics. One CTA per value head.
// Rounding points: kdacupy/numerics/backward_model.py, kda_bwd_reduce.
//
// Rendered configuration: KDA_K (the key tile of the partial sums); the true head dim kdim <= KDA_K is an
// argument (the any-size backward: dt_bias's rows are kdim apart, the tile's channels past it are not written).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(128) kda_bwd_reduce(
    const float* part_ddt, const float* part_dA, float* ddt_bias, float* dA_log, int nslots, int kdim) {
  constexpr int K = KDA_K;
  const int hv = blockIdx.x, tid = threadIdx.x;
  const i64 base = static_cast<i64>(hv) * nslots;
  if (part_ddt != nullptr) {
    for (int c = tid; c < kdim; c += 128) {
      float acc = 0.f;
      for (int s = 0; s < nslots; ++s) acc += part_ddt[(base + s) * K + c];
      ddt_bias[static_cast<i64>(hv) * kdim + c] = acc;
    }
  }
  if (part_dA != nullptr && tid == 0) {
    float acc = 0.f;
    for (int s = 0; s < nslots; ++s) acc += part_dA[base + s];
    dA_log[hv] = acc;
  }
}
