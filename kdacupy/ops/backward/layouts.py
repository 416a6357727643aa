"""Byte layouts of the backward kernels, rendered into them as ``#define``s (as ops/forward/layouts.py
does for the forward's): the launcher's sizes and the kernels' offsets come from here alone."""
from __future__ import annotations

from ...numerics.backward_model import vblock
from ..forward.layouts import CHUNK, SMALL_ROW, _place

REDUCE_THREADS = 128  # kernels/kda_bwd_reduce.cu's block (its __launch_bounds__ and loop stride)


def chunk_threads(K: int) -> int:
    """kda_bwd_chunk: a warp per 16 channels of its [16, K] chains."""
    return K // 16 * 32


def chain_smem(K: int, BV: int, stages: int, elem_bytes: int) -> dict[str, int]:
    """kda_bwd_chain: ``stages`` copies of one chunk's workspace block (padded rows) and its [16, BV]
    tile of do."""
    tile = CHUNK * (K + 8) * 2
    dorow = BV * elem_bytes + 16
    parts = [("QDEC", tile), ("KDEC", tile), ("KRES", tile), ("INV", CHUNK * SMALL_ROW), ("MQK", CHUNK * SMALL_ROW),
             ("GEXP", K * 4), ("BETA", CHUNK * 4), ("DO", CHUNK * dorow)]
    off, stage = _place(parts)
    out = {f"BSM_{n}": v for n, v in off.items()}
    out.update(BSM_DOROW=dorow, BSM_STAGE=stage, BSM_TOTAL=stages * stage)
    return out


def chunk_smem(K: int, BVC: int | None = None) -> dict[str, int]:
    """kda_bwd_chunk: the chunk's rows, operands and the group's dq/dk sums for the whole call, then
    one region that holds, in turn, a V-block's tiles and the decay gradient's tiles (from the end of the
    V-blocks). [B6]'s low parts of k_i, q_m, k_m take the tiles of k_i, q_m, k_m once read. The reference
    gr (from [4], read last in [B7]) takes the per channel dA_log terms' bytes (from [B8]); INV and Mqk
    are copied from the workspace (no Lb tile). q_dec is not kept: [B7]'s state terms round it again from qn.
    At K <= 128 the gate rows [2] loads (GRAW) and dt_bias's row (BIAS) are kept for [B8] (K = 256: the
    loads again, its shared memory near sm_80's limit), and [B6]'s low parts of q_m, k_m, k_i, formed in [5]
    (QL, KML, KIL; K = 256: formed in [B6] into the high parts' tiles). ``BVC``: the value columns of a block (default the
    backward model's ``vblock(K)``; kdacupy/ops/backward/tiles.py's ``chunk_block`` says when more)."""
    BVC = BVC or vblock(K)
    tile, small = CHUNK * (K + 8) * 2, CHUNK * 24 * 2
    rowsf, c2 = CHUNK * K * 4, CHUNK * CHUNK * 4
    vt = CHUNK * (BVC + 8) * 2
    fixed = [("QN", rowsf), ("KN", rowsf), ("G", rowsf), ("QM", tile), ("KD", tile), ("KM", tile), ("KI", tile),
             ("KR", tile), ("L", c2), ("DLB", c2), ("DM", c2), ("DL", c2), ("MQ", small), ("INV", small),
             ("DL16", small), ("DM16", small), ("BETA", CHUNK * 4), ("BETAD", CHUNK * 4), ("GEXP", K * 4), ("RQ", CHUNK * 4),
             ("RK", CHUNK * 4), ("COLA", K * 4), ("DQN", rowsf), ("DKN", rowsf),
             ("GRAW", rowsf if K <= 128 else 0), ("BIAS", K * 4 if K <= 128 else 0),
             ("QL", tile if K <= 128 else 0), ("KML", tile if K <= 128 else 0), ("KIL", tile if K <= 128 else 0),
             ("REGION", 0)]
    off, base = _place(fixed)
    block = [("S", BVC * (K + 8) * 2), ("D", BVC * (K + 8) * 2), ("VR", CHUNK * (BVC + 8) * 4), ("DO", vt), ("Y", vt),
             ("X", CHUNK * BVC * 4 if K > 128 else 0),
             ("U", vt), ("DU", vt), ("DYB", vt), ("DXB", vt)]
    boff, bsize = _place(block)
    gphase, gsize = _place([("DGAM", rowsf), ("KT", rowsf)])
    out = {f"CSM_{n}": v for n, v in off.items() if n != "REGION"}
    out.update(CSM_REF=off["COLA"])
    for table in (boff, gphase):
        out.update({f"CSM_{n}": base + v for n, v in table.items()})
    out.update(CSM_TOTAL=base + max(bsize, gsize), KDA_BVC=BVC)
    return out
