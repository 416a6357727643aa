// kda_decode: decode and speculative verify on a state pool (docs/design.md section 7.1).
// One launch for the whole batch; one CTA per (sequence, slice of BV value
// rows, value head). Each warp owns RV = BV / WARPS value rows of the state and
// all K keys of them: lane l holds keys l, l + 32, ... (RK = K / 32 of them), so
// a warp reads and writes whole rows of a "vk" pool in 128-byte pieces (a "kv"
// pool is read row by row of keys, the sectors reused through L1). The state is
// read from the pool once, kept in fp32 registers across the call's T tokens
// and written back once per stored token, rounded to the pool's dtype. Gate,
// beta and l2norm are computed here (no prepare kernel, no workspace).
// Reductions over K: a per-lane fp32 FMA chain, then a 5-step xor shuffle.
// Rounding points: kdacupy/numerics/decode_model.py steps 1-8.
// Tree verify (docs/design.md section 7.1): token t > 0 starts from the state after its parent
// parents[n, t] (t - 1: the registers as they are; -1: the start slot, read again; another
// draft: its step state, read back from ``steps`` in the step dtype). Each thread reads back
// only the elements it stored itself, so no barrier orders those reads. ``steps``
// [rows, S, HV, V, K] ("vk"; "kv": [.., K, V]) receives the state after every token of a
// sequence with a step row; ``update_pool`` 0 leaves the pool unwritten.
// ``null_slot``: slots at or below it are padding (-1: the negative ones; vLLM's null block: 0),
// so an engine's slot table is read as it is, with no per-step transform of it on the device.
// ``cu_seqlens`` (optional, [N + 1]): the packed offsets an engine passes with its N sequences of
// T tokens; each CTA checks its sequence's two and traps where they are not n T and (n + 1) T (as
// a failed device assert does), so no per-step launch has to check them.
//
// Head sizes (docs/design.md section 2): KDA_K is the key tile, a multiple of 32 (RK keys per lane);
// KDA_V the value rows, or 0 for any V. With KDA_V = 0 the true sizes come as the arguments
// K_true <= KDA_K and V_true: key channels at or above K_true read as zero and are never stored,
// value rows at or above V_true are neither read nor written, the arrays (the pool too) have their
// true extents, and ceil(V_true / BV) CTAs cover the value rows. Zero keys add exact zeros to every
// lane's FMA chain, so the sums are those of decode_model.py over the keys padded with zeros. With
// KDA_V > 0 (K, V in {64, 128, 256}) the sizes are the constants and the masks compile away.
// Rendered configuration: KDA_K, KDA_V, KDA_DT (q, k, v, o), KDA_G_DT, KDA_BETA_DT,
// KDA_GATE, KDA_BETA_MODE, KDA_L2NORM, KDA_POOL_DT (KDA_BF16 or KDA_F32),
// KDA_LAYOUT_VK, KDA_BV, KDA_WARPS; optional KDA_STEP_DT (the step states' dtype, default
// the pool's).
#include "common.cuh"
#include "gates.cuh"

#ifndef KDA_STEP_DT
#define KDA_STEP_DT KDA_POOL_DT
#endif

namespace {
using namespace kda;

constexpr int K = KDA_K;  // the key tile
constexpr bool ANY = KDA_V == 0;  // true sizes at run time, loads and stores masked
constexpr int BV = KDA_BV;
constexpr int NW = KDA_WARPS;
constexpr int NT = NW * 32;
constexpr int RV = BV / NW;  // value rows per warp
constexpr int RK = K / 32;   // keys per lane
constexpr bool VK = KDA_LAYOUT_VK;

static_assert((ANY || KDA_V % BV == 0) && BV % NW == 0 && RV >= 1 && RV <= 16, "value rows split evenly over the warps");
static_assert(K % 32 == 0 && RK * RV <= 64, "the state slice fits in registers");

__device__ __forceinline__ i64 index_at(const void* p, int is_i64, i64 i) {
  return is_i64 ? static_cast<const i64*>(p)[i] : static_cast<i64>(static_cast<const i32*>(p)[i]);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// The true head sizes (ANY: the arguments). The masks test ANY first, so that without it the
// code is the fixed-size kernel's (the same registers and SASS).
struct Dims {
  int k, v;
  __device__ __forceinline__ bool key(int kk) const { return kk < k; }
  __device__ __forceinline__ bool row(int vr) const { return vr < v; }
  __device__ __forceinline__ bool elem(int kk, int vr) const { return ANY ? kk < k && vr < v : true; }
};

// Offset of state element (value row vr, key kk) of state sh (a [V, K] or [K, V] matrix).
__device__ __forceinline__ i64 state_offset(Dims d, i64 sh, int vr, int kk) {
  const i64 dk = ANY ? d.k : K, dv = ANY ? d.v : KDA_V;
  return VK ? (sh * dv + vr) * dk + kk : (sh * dk + kk) * dv + vr;
}

// The warp's slice of state sh (rows v0 + j, keys lane + 32 i) from and to memory of dtype DT: one
// base offset, the rest constants the loads and stores take as immediates. Padded keys and rows
// (ANY) load as zero and are not stored.
template <int DT> __device__ __forceinline__ void load_slice(float (&S)[RK][RV], const void* base, Dims d, i64 sh,
                                                             int v0, int lane) {
#pragma unroll
  for (int i = 0; i < RK; ++i) {
#pragma unroll
    for (int j = 0; j < RV; ++j) {
      S[i][j] = d.elem(lane + 32 * i, v0 + j) ? load_f32<DT>(base, state_offset(d, sh, v0 + j, lane + 32 * i)) : 0.f;
    }
  }
}
template <int DT> __device__ __forceinline__ void store_slice(void* base, Dims d, i64 sh, int v0, int lane,
                                                              const float (&S)[RK][RV]) {
#pragma unroll
  for (int i = 0; i < RK; ++i) {
#pragma unroll
    for (int j = 0; j < RV; ++j) {
      if (d.elem(lane + 32 * i, v0 + j)) store_f32<DT>(base, state_offset(d, sh, v0 + j, lane + 32 * i), S[i][j]);
    }
  }
}

// Key lane + 32 i of a token's K-channel row at offset ro (zero for a padded key).
template <int DT> __device__ __forceinline__ float load_key(const void* base, Dims d, i64 ro, int lane, int i) {
  return ANY && !d.key(lane + 32 * i) ? 0.f : load_f32<DT>(base, ro + lane + 32 * i);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NT) kda_decode(
    const void* q, const void* k, const void* v, const void* g, const void* beta,
    i64 q_sb, i64 q_st, i64 q_sh, i64 k_sb, i64 k_st, i64 k_sh, i64 v_sb, i64 v_st, i64 v_sh,
    i64 g_sb, i64 g_st, i64 g_sh, i64 b_sb, i64 b_st, i64 b_sh, void* o, i64 o_sb, i64 o_st, i64 o_sh,
    const float* A_log, const float* dt_bias, void* pool, i64 P, const void* idx, int idx_i64, int per_token,
    const void* accepted, int acc_i64, int T, int H, int HV, float scale, float lb2,
    const void* parents, int par_i64, void* steps, i64 step_rows, int step_len, const void* step_idx,
    int sidx_i64, int update_pool, i64 null_slot, const void* cu_seqlens, int cu_i64, int K_true, int V_true) {
  const Dims d{K_true, V_true};
  const int VB = ANY ? (V_true + BV - 1) / BV : KDA_V / BV;  // CTAs per (sequence, head)
  // grid (N x VB, HV / H, H): value head hv of q / k head h, with no integer division (two of
  // them, with their corrections, were a tenth of a decode step's instructions)
  const int n = blockIdx.x / VB, h = blockIdx.z, hv = h * gridDim.y + blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int v0 = (blockIdx.x % VB) * BV + warp * RV;  // first value row of this warp
  if (cu_seqlens != nullptr && (index_at(cu_seqlens, cu_i64, n) != static_cast<i64>(n) * T ||
                                index_at(cu_seqlens, cu_i64, n + 1) != static_cast<i64>(n + 1) * T)) {
    __trap();  // unequal lengths: not one launch's rows of T tokens
  }

  // start slot; <= null_slot or >= P (only unvalidated device indices) pads the sequence
  i64 start;
  if (per_token) {
    i64 a = accepted != nullptr ? index_at(accepted, acc_i64, n) : 1;
    a = a < 1 ? 1 : (a > T ? T : a);
    start = index_at(idx, idx_i64, static_cast<i64>(n) * T + a - 1);
  } else {
    start = index_at(idx, idx_i64, n);
  }
  if (start <= null_slot || start >= P) {  // padding: zero output, the pool neither read nor written
    for (int t = 0; t < T; ++t) {
      if (ANY ? lane < RV && d.row(v0 + lane) : lane < RV) store_f32<KDA_DT>(o, n * o_sb + t * o_st + hv * o_sh + v0 + lane, 0.f);
    }
    return;
  }

  // this sequence's row of step states: sb, the state index of its step 0 (none: -1, which also
  // leaves the parents unread); token t's step state is sb + t * HV
  i64 sb = -1;
  if (steps != nullptr) {
    const i64 srow = step_idx != nullptr ? index_at(step_idx, sidx_i64, n) : n;
    sb = srow >= 0 && srow < step_rows ? srow * step_len * HV + hv : -1;
  }
  const bool tree = parents != nullptr && sb >= 0;

  // [1] the state slice, loaded once into fp32
  float S[RK][RV];
  load_slice<KDA_POOL_DT>(S, pool, d, start * HV + hv, v0, lane);

  // per-head gate parameters, hoisted out of the token loop
  float A = 1.f, bias[RK];
  if (KDA_GATE != KDA_GATE_LOG && A_log != nullptr) A = ex2_approx_ftz(A_log[hv] * LOG2E_F);
#pragma unroll
  for (int i = 0; i < RK; ++i) {
    bias[i] = (KDA_GATE != KDA_GATE_LOG && dt_bias != nullptr && (ANY ? d.key(lane + 32 * i) : true))
                  ? dt_bias[static_cast<i64>(hv) * (ANY ? d.k : K) + lane + 32 * i] : 0.f;
  }

#pragma unroll 1
  for (int t = 0; t < T; ++t) {
    if (tree && t > 0) {  // [1] tree verify: the parent's state
      const i64 par = index_at(parents, par_i64, static_cast<i64>(n) * T + t);
      if (par >= 0 && par < t - 1) {
        load_slice<KDA_STEP_DT>(S, steps, d, sb + par * HV, v0, lane);
      } else if (par != t - 1) {  // -1, or outside [-1, t) (unchecked device values): the start
        load_slice<KDA_POOL_DT>(S, pool, d, start * HV + hv, v0, lane);
      }
    }
    const i64 qo = n * q_sb + t * q_st + h * q_sh, ko = n * k_sb + t * k_st + h * k_sh;
    const i64 go = n * g_sb + t * g_st + hv * g_sh, vo = n * v_sb + t * v_st + hv * v_sh;
    float qs[RK], kn[RK], kd[RK], a[RK];
#pragma unroll
    for (int i = 0; i < RK; ++i) {
      qs[i] = load_key<KDA_DT>(q, d, qo, lane, i);
      kn[i] = load_key<KDA_DT>(k, d, ko, lane, i);
    }
    if constexpr (KDA_L2NORM) {  // [2] x * rsqrt(sum x^2 + 1e-6)
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int i = 0; i < RK; ++i) {
        sq = fmaf(qs[i], qs[i], sq);
        sk = fmaf(kn[i], kn[i], sk);
      }
      const float iq = rsqrt_approx_ftz(warp_sum(sq) + 1e-6f), ik = rsqrt_approx_ftz(warp_sum(sk) + 1e-6f);
#pragma unroll
      for (int i = 0; i < RK; ++i) {
        qs[i] *= iq;
        kn[i] *= ik;
      }
    }
    // [2]-[3] gate, decay, scaled query, decayed key
#pragma unroll
    for (int i = 0; i < RK; ++i) {
      a[i] = ex2_approx_ftz(gate_log2<KDA_GATE>(load_key<KDA_G_DT>(g, d, go, lane, i), A, bias[i], lb2));
      qs[i] *= scale;
      kd[i] = kn[i] * a[i];
    }
    const float bt = beta_activate<KDA_BETA_MODE>(
        KDA_BETA_MODE == KDA_BETA_NONE ? 0.f : load_f32<KDA_BETA_DT>(beta, n * b_sb + t * b_st + hv * b_sh));

    // [4]-[6] w = kd . S;  u = beta (v - w);  S = fma(S, a, k u)
#pragma unroll
    for (int j = 0; j < RV; ++j) {
      float w = 0.f;
#pragma unroll
      for (int i = 0; i < RK; ++i) w = fmaf(kd[i], S[i][j], w);
      w = warp_sum(w);
      const float u = bt * ((ANY && !d.row(v0 + j) ? 0.f : load_f32<KDA_DT>(v, vo + v0 + j)) - w);
#pragma unroll
      for (int i = 0; i < RK; ++i) S[i][j] = fmaf(S[i][j], a[i], kn[i] * u);
    }

    // [7] o = qs . S, lane j stores value row v0 + j
    float mine = 0.f;
#pragma unroll
    for (int j = 0; j < RV; ++j) {
      float x = 0.f;
#pragma unroll
      for (int i = 0; i < RK; ++i) x = fmaf(qs[i], S[i][j], x);
      x = warp_sum(x);
      if (lane == j) mine = x;
    }
    if (ANY ? lane < RV && d.row(v0 + lane) : lane < RV) store_f32<KDA_DT>(o, n * o_sb + t * o_st + hv * o_sh + v0 + lane, mine);

    // [8] store this token's state where asked: its step state, then its pool slot
    if (sb >= 0) store_slice<KDA_STEP_DT>(steps, d, sb + static_cast<i64>(t) * HV, v0, lane, S);
    const i64 slot = !update_pool ? -1 : per_token ? index_at(idx, idx_i64, static_cast<i64>(n) * T + t)
                                                   : (t == T - 1 ? start : -1);
    if (slot > null_slot && slot < P) store_slice<KDA_POOL_DT>(pool, d, slot * HV + hv, v0, lane, S);
  }
}
