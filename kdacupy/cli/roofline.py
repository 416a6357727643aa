"""A roofline per GPU for the emulation's counters (docs/design.md section 11): the time each
resource needs for one launch's work, which one binds, and the occupancy the compile report
allows. Every figure of GPUS is sourced in docs/design.md section 11; none is measured here."""
from __future__ import annotations

import math
from dataclasses import dataclass

MMA_FLOP = 2 * 16 * 8 * 16  # one mma.sync m16n8k16: the only tensor-core shape the kernels use
#: critical path of one chunk of kda_recurrence, cycles (docs/design.md section 11): its chunks run
#: in order, so a sequence of n chunks takes at least n times this, whatever the throughput. The
#: backward's kda_bwd_chain walks them the same way, on a path as long (9 accumulating k-steps of
#: dU^T, then dY^T and D's update: 11 dependent mma against the recurrence's 12; the cp.async
#: wait and two barriers): the same figure
CHAIN_CYCLES_PER_CHUNK = 500
CHAIN_KERNELS = ("kda_recurrence", "kda_bwd_chain")


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    arch: str            # the NVRTC target of the compile report
    sms: int
    clock_ghz: float     # the clock the datasheet's tensor rate implies
    hbm_tb_s: float      # datasheet HBM bandwidth, TB/s
    bf16_tflops: float   # datasheet dense bf16 tensor-core rate, TFLOP/s
    smem_per_sm: int = 228 * 1024
    regs_per_sm: int = 65536
    max_warps_per_sm: int = 64
    max_ctas_per_sm: int = 32
    smem_bytes_per_clk: int = 128  # 32 banks x 4 bytes: one wavefront per clock per SM
    sfu_per_clk: int = 16          # .approx results per clock per SM
    smem_reserved_per_cta: int = 1024

    def label(self) -> str:
        return (f"{self.name}: {self.sms} SMs at {self.clock_ghz:.2f} GHz, HBM {self.hbm_tb_s:g} TB/s, "
                f"bf16 {self.bf16_tflops:g} TFLOP/s dense, shared memory {self.smem_bytes_per_clk} B/clk/SM")


GPUS = {
    "h100": Gpu("h100", "NVIDIA H100 SXM", "sm_90a", 132, 1.83, 3.35, 989.4),
    "h200": Gpu("h200", "NVIDIA H200 SXM", "sm_90a", 132, 1.83, 4.8, 989.4),
    "b200": Gpu("b200", "NVIDIA B200", "sm_100a", 148, 1.86, 8.0, 2250.0),
}


def occupancy(gpu: Gpu, threads: int, regs: int, smem: int) -> dict:
    """CTAs and warps per SM that registers (allocated per warp in units of 256), shared
    memory (plus the per-CTA reservation), threads and the CTA limit allow."""
    warps = -(-threads // 32)
    limits = {"warps": gpu.max_warps_per_sm // warps, "ctas": gpu.max_ctas_per_sm}
    if regs > 0:
        per_warp = -(-regs * 32 // 256) * 256
        limits["registers"] = gpu.regs_per_sm // (per_warp * warps)
    if smem > 0:
        limits["shared memory"] = gpu.smem_per_sm // (smem + gpu.smem_reserved_per_cta)
    ctas = min(limits.values())
    return dict(ctas_per_sm=ctas, warps_per_sm=ctas * warps, occupancy=ctas * warps / gpu.max_warps_per_sm,
                limited_by=min(limits, key=limits.get))


def times(rec: dict, gpu: Gpu, chunks: int = 0) -> dict:
    """Seconds each resource needs for one launch record's counts: HBM (bytes read and written
    once, an ideal L2), shared memory (wavefronts), tensor cores (mma at the datasheet rate),
    SFU (.approx warp instructions), and for the chunk chains (CHAIN_KERNELS) the chain; per-SM resources
    over the SMs the CTAs occupy (a last partial wave counts whole)."""
    ctas = max(1, rec.get("ctas", 1))
    waves = math.ceil(ctas / gpu.sms) * gpu.sms / ctas  # >= 1: SMs idle in the last wave
    per_sm = gpu.sms * gpu.clock_ghz * 1e9 / waves
    out = {
        "hbm": (rec["dram_read_bytes"] + rec["dram_write_bytes"]) / (gpu.hbm_tb_s * 1e12),
        "smem": rec["smem_wavefronts"] / per_sm,
        "tensor": rec["mma"] * MMA_FLOP / (gpu.bf16_tflops * 1e12 / waves),
        "sfu": rec["sfu"] * 32 / (per_sm * gpu.sfu_per_clk),
    }
    if rec["kernel"] in CHAIN_KERNELS and chunks:
        out["chain"] = chunks * CHAIN_CYCLES_PER_CHUNK / (gpu.clock_ghz * 1e9)
    return out


def bound(t: dict) -> tuple[str, float]:
    """The binding resource and its time."""
    name = max(t, key=t.get)
    return name, t[name]
