"""Byte layouts shared by the kernels and their launchers.

Python is the single source of these numbers: they are rendered into each
kernel variant as ``#define``s (see ``kdacupy.jit``), so the launcher's
allocation sizes and the kernel's offsets cannot disagree.
"""
from __future__ import annotations

CHUNK = 16
PREPARE_THREADS = 128
SMALL_ROW = 48  # bytes per row of a padded 16x16 16-bit tile (16 B pad: no ldmatrix bank conflicts)


def _align(n, a=16):
    return (n + a - 1) // a * a


def _place(parts, align=16):
    """Sequential offsets for (name, bytes) parts; returns (offsets, total)."""
    off, out = 0, {}
    for name, size in parts:
        off = _align(off, align)
        out[name] = off
        off += size
    return out, _align(off, align)


def workspace(K: int) -> dict[str, int]:
    """What the prepare kernel hands the recurrence, per (value head, chunk):
    q_dec, k_dec, k_res [16, K] bf16; INV, Mqk [16, 16] bf16; gexp [K] fp32;
    beta [16] fp32. Contiguous, so the recurrence streams it with 16-byte copies."""
    parts = [("QDEC", CHUNK * K * 2), ("KDEC", CHUNK * K * 2), ("KRES", CHUNK * K * 2),
             ("INV", CHUNK * CHUNK * 2), ("MQK", CHUNK * CHUNK * 2), ("GEXP", K * 4), ("BETA", CHUNK * 4)]
    off, total = _place(parts)
    return {f"WS_{n}": v for n, v in off.items()} | {"WS_STRIDE": total}


def core_offset(r: int, c: int) -> int:
    """Byte offset of element (r, c) of a [16, C] 16-bit workspace tile in the core-matrix layout
    (``KDA_WS_CORE``, the wgmma recurrence's): 8 columns of 16 rows, 256 bytes, one after the other,
    each row's 8 elements 16 contiguous bytes: the 8x16-byte core matrices of a no-swizzle wgmma
    descriptor, K-major (n = row) and N-major (k = row) alike."""
    return (c // 8) * CHUNK * 16 + r * 16 + (c % 8) * 2


def prepare_row(K: int, g_pairs: bool = False) -> int:
    """Floats per padded fp32 [16, K] row of kda_prepare: 4 words of pad per 32 channels,
    rounded up to 1 mod 4 (odd), which keeps its row, column and row-segment accesses free
    of bank conflicts; ``g_pairs`` (KDA_G_PAIRS): to 2 mod 4, for 8-byte channel pairs
    (kernels/kda_prepare.cu, gx)."""
    n = K + K // 8
    return n + ((2 if g_pairs else 1) - n) % 4


def prepare_grow(K: int, g_bytes: int) -> int:
    """Bytes between the input stage's g rows: 16-bit gates are read 8 bytes a thread, two rows
    per half-warp, so rows sit 64 bytes off the 128-byte bank period (kernels/kda_prepare.cu)."""
    return K * g_bytes + (64 if g_bytes == 2 else 0)


def prepare_smem(K: int, dt_bytes: int, g_bytes: int, g_pairs: bool = False) -> dict[str, int]:
    """Shared memory of kda_prepare. The fast path keeps bf16 tiles (padded rows
    for ldmatrix: q_m, k_m, k_i and the low parts of q_m, k_i), the pair path padded fp32
    rows of q*scale and k: they share a region.
    REF: the factored form's reference per channel (precision.py step 4), padded as a row of G.
    INQ, INK, ING: the input stage, the next chunk's q, k and g rows on their way (cp.async)."""
    tile = CHUNK * (K + 8) * 2
    rows = CHUNK * prepare_row(K, g_pairs) * 4
    parts = [("G", rows), ("U", max(5 * tile, 2 * rows)), ("L", CHUNK * CHUNK * 4),
             ("M", CHUNK * CHUNK * 4), ("BETA", CHUNK * 4), ("REF", (K + K // 8) * 4),
             ("INQ", CHUNK * K * dt_bytes), ("INK", CHUNK * K * dt_bytes), ("ING", CHUNK * prepare_grow(K, g_bytes))]
    off, total = _place(parts)
    return ({f"PSM_{n}": v for n, v in off.items()}
            | {"PSM_TOTAL": total, "PSM_GS": prepare_row(K, g_pairs), "PSM_GROW": prepare_grow(K, g_bytes)})


def prepare_slots_per_cta(nslots: int) -> int:
    """Chunk slots per kda_prepare CTA (of one value head): up to 8 in its pipeline, while a head's
    slots give at least 64 CTAs (short sequences keep one chunk per CTA, and their parallelism)."""
    return max(1, min(8, nslots // 64))


def recurrence_smem(K: int, BV: int, stages: int, elem_bytes: int, mma: str = "sync") -> dict[str, int]:
    """Shared memory of kda_recurrence: ``stages`` copies of one chunk's inputs
    (the workspace block with padded rows, and the [16, BV] value tile), then a
    per-warp staging tile for the output. ``mma="wgmma"``: a stage is the workspace
    block as it is in global memory (one bulk copy; core-matrix tiles, ``workspace_core``)
    and the value rows, then one mbarrier per stage, 16 bytes apart (RSM_BAR); ``"tcgen05"``:
    the same stages and barriers, then the products' mbarrier (RSM_MMABAR) and the tensor-memory
    address (RSM_TMEM), no staging tile."""
    vrow = BV * elem_bytes + 16
    if mma in ("wgmma", "tcgen05"):
        ws = workspace(K)
        stage = _align(ws["WS_STRIDE"] + CHUNK * vrow)
        orow = 16 * elem_bytes + 16
        out = {f"RSM_{n[3:]}": v for n, v in ws.items() if n != "WS_STRIDE"}
        bar = stages * stage
        ot = bar + 16 * stages  # an mbarrier every 16 bytes
        if mma == "tcgen05":  # no staging (each thread stores its o column): the products' mbarrier, the TMEM address
            out.update(RSM_VT=ws["WS_STRIDE"], RSM_VROW=vrow, RSM_STAGE=stage, RSM_BAR=bar, RSM_MMABAR=ot,
                       RSM_TMEM=ot + 16, RSM_TOTAL=ot + 32)
            return out
        out.update(RSM_VT=ws["WS_STRIDE"], RSM_VROW=vrow, RSM_STAGE=stage, RSM_BAR=bar, RSM_OT=ot,
                   RSM_OROW=orow, RSM_TOTAL=ot + BV // 16 * CHUNK * orow)
        return out
    tile = CHUNK * (K + 8) * 2
    parts = [("QDEC", tile), ("KDEC", tile), ("KRES", tile), ("INV", CHUNK * SMALL_ROW),
             ("MQK", CHUNK * SMALL_ROW), ("GEXP", K * 4), ("BETA", CHUNK * 4), ("VT", CHUNK * vrow)]
    off, stage = _place(parts)
    warps = BV // 16
    orow = 16 * elem_bytes + 16
    out = {f"RSM_{n}": v for n, v in off.items()}
    out.update(RSM_VROW=vrow, RSM_STAGE=stage, RSM_OT=stages * stage, RSM_OROW=orow,
               RSM_TOTAL=stages * stage + warps * CHUNK * orow)
    return out
