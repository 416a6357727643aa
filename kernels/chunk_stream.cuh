// The chunk stream of the per-sequence kernels (kda_recurrence forward, kda_bwd_chain in reverse):
// per 16-token chunk, one cp.async stage holds the prepare's workspace block (WS_* layout,
// kdacupy/ops/forward/layouts.py; the tiles re-padded for ldmatrix) and a [16, BV] tile of values
// (v, or do), which each warp then reads transposed as an A operand.
#pragma once
#include "common.cuh"

namespace kda {

// Queue the copies of one workspace block into a stage: q_dec, k_dec, k_res rows to rows of K + 8
// bf16 from QDEC, INV and Mqk (32-byte rows) to 48-byte rows at INV / MQK, gexp and beta to GEXP.
// WITH_Q = false: q_dec and Mqk are not copied (the segment maps never read them).
template <int K, int NT, int QDEC, int INV, int MQK, int GEXP, bool WITH_Q>
__device__ __forceinline__ void copy_ws_block(unsigned char* stage, const unsigned char* blk, int tid) {
  constexpr int TS = K + 8, QCH = 2 * K / 16, TILE_PIECES = 3 * CHUNK * QCH;
  static_assert(WS_KDEC == WS_QDEC + CHUNK * K * 2 && WS_KRES == WS_KDEC + CHUNK * K * 2, "workspace tiles");
  static_assert(WS_INV == WS_KRES + CHUNK * K * 2 && WS_MQK == WS_INV + 512 && WS_GEXP == WS_MQK + 512, "workspace");
  static_assert(WS_BETA == WS_GEXP + K * 4, "gexp and beta travel together");
  for (int p = tid; p < WS_STRIDE / 16; p += NT) {
    if (!WITH_Q && (p < CHUNK * QCH || (p >= TILE_PIECES + 32 && p < TILE_PIECES + 64))) continue;
    int dst;
    if (p < TILE_PIECES) {  // q_dec, k_dec, k_res rows -> padded rows
      const int m = p / (CHUNK * QCH), r = (p / QCH) % CHUNK, c = p % QCH;
      dst = QDEC + m * CHUNK * TS * 2 + r * TS * 2 + c * 16;
    } else if (p < TILE_PIECES + 64) {  // INV, Mqk (32-byte rows) -> 48-byte rows
      const int p2 = p - TILE_PIECES, m = p2 / 32, r = (p2 / 2) % CHUNK, c = p2 % 2;
      dst = (m ? MQK : INV) + r * 48 + c * 16;
    } else {  // gexp, beta
      dst = GEXP + (p - TILE_PIECES - 64) * 16;
    }
    cp_async_16(stage + dst, blk + static_cast<i64>(p) * 16);
  }
}

// Queue CHUNK rows of PIECES 16-byte pieces from src (rows src_row bytes apart) to dst (DST_ROW
// bytes apart); rows from ``rows`` on, a ragged tail, read zeros (0 * garbage could be NaN).
template <int NT, int PIECES, int DST_ROW>
__device__ __forceinline__ void copy_rows_zfill(unsigned char* dst, const unsigned char* src, i64 src_row, int rows, int tid) {
  for (int p = tid; p < CHUNK * PIECES; p += NT) {
    const int r = p / PIECES, c = p % PIECES;
    const bool valid = r < rows;
    cp_async_16_zfill(dst + r * DST_ROW + c * 16, valid ? src + r * src_row + c * 16 : src, valid);
  }
}

// copy_rows_zfill at any head size (KDA_ANY_DIMS): of each row only the first ``cols`` elements (of EB
// bytes) exist; the rest of the tile, and the rows from ``rows`` on, read zeros (fill_piece16).
template <int NT, int PIECES, int DST_ROW, int EB>
__device__ __forceinline__ void fill_rows_dims(unsigned char* dst, const unsigned char* src, i64 src_row, int rows,
                                               int cols, int tid) {
  for (int p = tid; p < CHUNK * PIECES; p += NT) {
    const int r = p / PIECES, c = p % PIECES;
    fill_piece16<EB>(dst + r * DST_ROW + c * 16, src + r * src_row + c * 16, cols - c * (16 / EB), r < rows);
  }
}

// 16 columns from col0 of a [16 tokens, *] tile of type DT (rows ROW bytes apart), transposed, as
// two n8 accumulator tiles: x[nt][e] = tile[token 8 nt + 2 t + (e & 1)][col0 + g + 8 (e >> 1)].
template <int DT, int ROW>
__device__ __forceinline__ void load_tile_t(float (&x)[2][4], const unsigned char* tile, int col0, int lane) {
  if constexpr (elem_bytes<DT>() == 2) {
    u32 r[4];
    const int m = lane >> 3;
    ldmatrix_x4_trans(r, tile + ((lane & 7) + 8 * (m >> 1)) * ROW + (col0 + 8 * (m & 1)) * 2);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const u32 w = r[2 * nt + h2];
        if constexpr (DT == KDA_BF16) {
          x[nt][2 * h2] = bf16_lo(w);
          x[nt][2 * h2 + 1] = bf16_hi(w);
        } else {
          x[nt][2 * h2] = f16_to_f32(static_cast<u16>(w & 0xffffu));
          x[nt][2 * h2 + 1] = f16_to_f32(static_cast<u16>(w >> 16));
        }
      }
    }
  } else {
    const float* ft = reinterpret_cast<const float*>(tile);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[nt][e] = ft[(8 * nt + 2 * t + (e & 1)) * (ROW / 4) + col0 + g + 8 * (e >> 1)];
    }
  }
}

}  // namespace kda
