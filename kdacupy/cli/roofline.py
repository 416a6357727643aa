"""A roofline per GPU for the emulation's counters (docs/design.md section 11): the time each
resource needs for one launch's work, which one binds, the occupancy the compile report allows,
the dependent path's time and the bytes the kernel keeps in flight against Little's law. Every
figure of GPUS and of the latency tables is sourced in docs/design.md section 11.1; none is
measured here."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..emulate.profile import PATH_KINDS

MMA_FLOP = 2 * 16 * 8 * 16  # one mma.sync m16n8k16: the only mma.sync shape the kernels use
#: wgmma m64nNk16 does 2 x 64 x N x 16 FLOP and reads 16 x N bf16 of B from shared memory: the
#: counter wgmma_smem_bytes (profile.h) gives its FLOP whatever the N
WGMMA_FLOP_PER_B_BYTE = 2 * 64 * 16 // (16 * 2)
#: kernels whose chunks one CTA walks in order: their path per chunk is reported
CHAIN_KERNELS = ("kda_recurrence", "kda_bwd_chain")

#: cycles per dependent step on Hopper (docs/design.md section 11.1 has the sources): dram, a
#: global load's round trip to HBM (pointer chase on an H100 SXM, markdewing/AI_kernels); smem,
#: a shared load (Accel-Sim's tested H100 configuration, gpgpu_smem_latency); mma, an mma.sync
#: (its ptx_opcode_latency_tesnor); sfu (ptx_opcode_latency_sfu); issue, one warp instruction per
#: clock (gpgpu_max_insn_issue_per_warp). Assumed, no figure read: ldmatrix and a shuffle as a
#: shared load; a barrier 0 beyond waiting for the last warp. profile.h's PATH_REF holds the same.
HOPPER_LATENCY = dict(issue=1, dram=700, smem=29, ldmatrix=29, mma=24, sfu=23, shuffle=29, barrier=0)
#: Blackwell: the B200's measured HBM round trip (the same source); the rest Hopper's (none read)
BLACKWELL_LATENCY = dict(HOPPER_LATENCY, dram=860)


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    arch: str            # the NVRTC target of the compile report
    sms: int
    clock_ghz: float     # the clock the datasheet's tensor rate implies
    hbm_tb_s: float      # datasheet HBM bandwidth, TB/s
    bf16_tflops: float   # datasheet dense bf16 tensor-core rate, TFLOP/s (wgmma on Hopper)
    mma_sync_tflops: float  # bf16 mma.sync's rate, TFLOP/s (Hopper: an assumption, section 11.1)
    latency: tuple = tuple(HOPPER_LATENCY.items())  # (kind, cycles) per dependent step
    #: the fraction of the datasheet's HBM bandwidth a tuned streaming kernel sustains: 0.9, after
    #: FlashMLA's 3000 GB/s on an H800 SXM5 (3.35 TB/s datasheet; deepseek-ai/FlashMLA's README),
    #: assumed for every GPU until the device run's copy bandwidth replaces it (section 11.1)
    hbm_sustained: float = 0.9
    schedulers: int = 4            # warp schedulers per SM, one instruction per clock each
    smem_per_sm: int = 228 * 1024
    regs_per_sm: int = 65536
    max_warps_per_sm: int = 64
    max_ctas_per_sm: int = 32
    smem_bytes_per_clk: int = 128  # 32 banks x 4 bytes: one wavefront per clock per SM
    sfu_per_clk: int = 16          # .approx results per clock per SM
    smem_reserved_per_cta: int = 1024

    @property
    def hbm_bytes_per_s(self) -> float:
        """The HBM bandwidth the model assumes: the datasheet's times hbm_sustained."""
        return self.hbm_tb_s * 1e12 * self.hbm_sustained

    def label(self) -> str:
        return (f"{self.name}: {self.sms} SMs at {self.clock_ghz:.2f} GHz, HBM {self.hbm_tb_s:g} TB/s "
                f"(datasheet; {self.hbm_sustained:.0%} sustained assumed), {self.schedulers} schedulers/SM, "
                f"bf16 {self.bf16_tflops:g} TFLOP/s dense (mma.sync {self.mma_sync_tflops:g}), shared memory {self.smem_bytes_per_clk} B/clk/SM, "
                f"DRAM latency {self.cycles('dram')} cycles")

    def cycles(self, kind: str) -> int:
        return dict(self.latency)[kind]

    def little_need_bytes(self, busy_sms: int | None = None) -> float:
        """Bytes each of ``busy_sms`` SMs (default all) must keep in flight for them to draw the HBM
        bandwidth (Little's law: bandwidth / SMs x the DRAM latency; the unloaded one, so a floor)."""
        return self.hbm_bytes_per_s / (busy_sms or self.sms) * self.cycles("dram") / (self.clock_ghz * 1e9)


#: bf16 mma.sync FLOP per clock per SM: Hopper's assumed rate (half its dense 4096, section 11.1), and
#: Blackwell's too: none read, so the legacy instruction is assumed no faster per SM and clock there
#: (the datasheets' Blackwell rates are tcgen05's)
MMA_SYNC_FLOP_PER_CLK = 2048


def _mma_sync_tflops(sms: int, clock_ghz: float) -> float:
    return round(MMA_SYNC_FLOP_PER_CLK * sms * clock_ghz / 1e3, 1)


GPUS = {
    "h100": Gpu("h100", "NVIDIA H100 SXM", "sm_90a", 132, 1.83, 3.35, 989.4, _mma_sync_tflops(132, 1.83)),
    "h200": Gpu("h200", "NVIDIA H200 SXM", "sm_90a", 132, 1.83, 4.8, 989.4, _mma_sync_tflops(132, 1.83)),
    "b200": Gpu("b200", "NVIDIA B200", "sm_100a", 148, 1.86, 8.0, 2250.0, _mma_sync_tflops(148, 1.86),
                tuple(BLACKWELL_LATENCY.items())),
    # one GPU of a GB200 superchip (its 1,200 W configuration): the B200's die at the clock its rate implies
    "gb200": Gpu("gb200", "NVIDIA GB200 (one GPU)", "sm_100a", 148, 2.06, 8.0, 2500.0, _mma_sync_tflops(148, 2.06),
                 tuple(BLACKWELL_LATENCY.items())),
}


#: tensor memory's columns an SM holds (Blackwell: 512 of 128 lanes); a CTA waits in tcgen05.alloc for its own
TMEM_COLUMNS = 512


def occupancy(gpu: Gpu, threads: int, regs: int, smem: int, tmem_cols: int = 0) -> dict:
    """CTAs and warps per SM that registers (allocated per warp in units of 256), shared
    memory (plus the per-CTA reservation), tensor memory (``tmem_cols`` a CTA), threads and the
    CTA limit allow."""
    warps = -(-threads // 32)
    limits = {"warps": gpu.max_warps_per_sm // warps, "ctas": gpu.max_ctas_per_sm}
    if tmem_cols > 0:
        limits["tensor memory"] = TMEM_COLUMNS // tmem_cols
    if regs > 0:
        per_warp = -(-regs * 32 // 256) * 256
        limits["registers"] = gpu.regs_per_sm // (per_warp * warps)
    if smem > 0:
        limits["shared memory"] = gpu.smem_per_sm // (smem + gpu.smem_reserved_per_cta)
    ctas = min(limits.values())
    return dict(ctas_per_sm=ctas, warps_per_sm=ctas * warps, occupancy=ctas * warps / gpu.max_warps_per_sm,
                limited_by=min(limits, key=limits.get))


def has_path(rec: dict) -> bool:
    return "path_max_issue" in rec


def path_cycles(rec: dict, gpu: Gpu, which: str = "max") -> float:
    """The dependent path priced at the GPU's latencies: "max" the longest CTA's, "sum" all CTAs'."""
    return float(sum(rec[f"path_{which}_{k}"] * gpu.cycles(k) for k in PATH_KINDS))


def resident_ctas(gpu: Gpu, ctas: int, ctas_per_sm: int) -> int:
    """The CTAs one SM holds at once: its occupancy, or all it gets when the grid is smaller."""
    return max(1, min(ctas_per_sm, math.ceil(max(1, ctas) / gpu.sms)))


def latency_cycles(rec: dict, gpu: Gpu, ctas_per_sm: int) -> float:
    """The dependent path's cycles for the launch: the longest CTA path, or, where an SM runs
    more CTAs than it holds at once, ceil(CTAs / SMs) / ctas_per_sm rounds of the mean CTA path."""
    ctas = max(1, rec["ctas"])
    rounds = math.ceil(ctas / gpu.sms) / max(1, ctas_per_sm)
    return max(path_cycles(rec, gpu, "max"), rounds * path_cycles(rec, gpu, "sum") / ctas)


def in_flight(rec: dict, gpu: Gpu, ctas_per_sm: int) -> dict:
    """Bytes of global loads per SM in flight against Little's law's need (over the SMs the grid
    keeps busy): on average, at the pace of the dependent path, the resident CTAs' load bytes x the
    DRAM latency / their mean path (at most their bytes; cp.async.bulk's bytes count as loads); at
    most (peak) the resident CTAs' largest
    in flight at once each. Below the need on average: the loads cannot draw the HBM bandwidth
    (latency-bound on loads)."""
    ctas = max(1, rec["ctas"])
    r = resident_ctas(gpu, ctas, ctas_per_sm)
    load = (32 * rec["gmem_load_sectors"] + rec.get("bulk_copy_bytes", 0)) / ctas  # bulk copies: no requests
    mean_path = path_cycles(rec, gpu, "sum") / ctas
    per_cta = min(load, load * gpu.cycles("dram") / mean_path) if mean_path else load
    need = gpu.little_need_bytes(min(gpu.sms, ctas))
    return dict(need_bytes=need, mean_bytes=r * per_cta, peak_bytes=r * rec["inflight_peak_bytes"], resident=r,
                latency_bound_on_loads=load > 0 and r * per_cta < need)


def path_info(rec: dict, gpu: Gpu, ctas_per_sm: int, chunks: int = 0) -> dict:
    """What the latency term is made of: the longest CTA path in cycles and its steps per kind,
    the mean CTA path, the CTA rounds per SM, per chunk for the chunk chains, and in_flight."""
    ctas = max(1, rec["ctas"])
    info = dict(path_cycles=path_cycles(rec, gpu, "max"), mean_path_cycles=path_cycles(rec, gpu, "sum") / ctas,
                steps={k: rec[f"path_max_{k}"] for k in PATH_KINDS}, ctas_per_sm=ctas_per_sm,
                rounds=math.ceil(ctas / gpu.sms) / max(1, ctas_per_sm))
    if chunks and rec["kernel"] in CHAIN_KERNELS:
        info["cycles_per_chunk"] = info["path_cycles"] / chunks
    info.update(in_flight(rec, gpu, ctas_per_sm))
    return info


def default_ctas_per_sm(rec: dict, gpu: Gpu) -> int:
    """Occupancy without a compile report: threads and dynamic shared memory only (an upper bound)."""
    threads = math.prod(rec.get("block", [32]))
    return occupancy(gpu, threads, 0, rec.get("shared_mem", 0), tmem_cols_per_cta(rec))["ctas_per_sm"]


def tmem_cols_per_cta(rec: dict) -> int:
    """Tensor-memory columns a CTA of the launch allocates (the counter sums them over CTAs)."""
    return -(-rec.get("tmem_cols", 0) // max(1, rec.get("ctas", 1)))


def schedulers(warps: list, n: int = 4) -> list:
    """The instructions each of an SM's ``n`` schedulers issues for one CTA: warp w on w mod n, as
    the hardware places them; ``warps`` the instructions each warp of the CTA issues."""
    per = [0.0] * n
    for w, x in enumerate(warps):
        per[w % n] += x
    return per


def issue_cycles(rec: dict, gpu: Gpu, warps: list) -> float:
    """Cycles the busiest scheduler of an SM issues for one launch: ``warps`` the instructions each
    warp of a CTA issues (per CTA, kdacupy/cli/issue.py), one instruction per clock per scheduler,
    ceil(CTAs / SMs) CTAs on the SM over the launch."""
    return math.ceil(max(1, rec.get("ctas", 1)) / gpu.sms) * max(schedulers(warps, gpu.schedulers))


def chain_issue_cycles(rec: dict, gpu: Gpu, warps: list, ctas_per_sm: int, chunks: int, mean_chunks: float) -> float:
    """The issue of the longest chunk chain: its busiest scheduler's instructions per chunk (the mean
    CTA's over its ``mean_chunks``) over ``chunks`` chunks, shared with the chains of the other
    CTAs resident on the SM, whose warps take the same schedulers."""
    if not chunks or not mean_chunks:
        return 0.0
    busiest = max(schedulers(warps, gpu.schedulers))
    return resident_ctas(gpu, rec.get("ctas", 1), ctas_per_sm) * busiest / mean_chunks * chunks


def times(rec: dict, gpu: Gpu, ctas_per_sm: int | None = None, issue: list | None = None, chunks: int = 0,
          mean_chunks: float = 0.0) -> dict:
    """Seconds each resource needs for one launch record's counts: HBM (bytes read and written
    once, an ideal L2, at the sustained bandwidth), shared memory (wavefronts, and wgmma's B operand,
    tcgen05.mma's A and B and the bulk copies' writes at a wavefront per 128 bytes), tensor cores (wgmma
    and tcgen05.mma at the datasheet rate, mma.sync at its own), SFU (.approx warp instructions), per-SM resources over the SMs the
    CTAs occupy (a last partial wave counts whole); the dependent path (latency_cycles) at
    ``ctas_per_sm`` resident CTAs (default: default_ctas_per_sm); with ``issue`` (per warp of a
    CTA, the instructions it issues) the busiest scheduler's issue (issue_cycles), and a chunk
    chain's path at least its busiest scheduler's issue over the longest chain (``chunks`` chunks;
    ``mean_chunks`` a CTA's mean)."""
    ctas = max(1, rec.get("ctas", 1))
    out = resource_times(rec, gpu, math.ceil(ctas / gpu.sms) * gpu.sms / ctas)  # >= 1: SMs idle in the last wave
    r = default_ctas_per_sm(rec, gpu) if ctas_per_sm is None else ctas_per_sm
    if has_path(rec):
        out["latency"] = latency_cycles(rec, gpu, r) / (gpu.clock_ghz * 1e9)
    if issue:
        out["issue"] = issue_cycles(rec, gpu, issue) / (gpu.clock_ghz * 1e9)
        if "latency" in out and rec.get("kernel") in CHAIN_KERNELS:
            chain = chain_issue_cycles(rec, gpu, issue, r, chunks, mean_chunks) / (gpu.clock_ghz * 1e9)
            out["latency"] = max(out["latency"], chain)
    return out


def resource_times(rec: dict, gpu: Gpu, waves: float = 1.0) -> dict:
    """HBM, shared memory, tensor cores and SFU for a launch record's counts (see ``times``); ``waves``
    >= 1 stretches the per-SM ones for the SMs a last partial wave leaves idle."""
    per_sm = gpu.sms * gpu.clock_ghz * 1e9 / waves
    return {
        "hbm": (rec["dram_read_bytes"] + rec["dram_write_bytes"]) / gpu.hbm_bytes_per_s,
        "smem": (rec["smem_wavefronts"] + (rec.get("wgmma_smem_bytes", 0) + rec.get("bulk_copy_bytes", 0)
                                           + rec.get("tcgen05_smem_bytes", 0)) / gpu.smem_bytes_per_clk) / per_sm,
        "tensor": (rec["mma"] * MMA_FLOP / gpu.mma_sync_tflops
                   + (rec.get("wgmma_smem_bytes", 0) * WGMMA_FLOP_PER_B_BYTE + rec.get("tcgen05_flop", 0))
                   / gpu.bf16_tflops) / (1e12 / waves),
        "sfu": rec["sfu"] * 32 / (per_sm * gpu.sfu_per_clk),
    }


def fused_times(rec: dict, gpu: Gpu, issue: list | None, chain_s: float) -> dict:
    """Seconds per resource of the fused forward's one persistent launch (kernels/kda_forward_fused.cu):
    every SM busy for the whole launch, so HBM, shared memory, tensor cores and SFU with one wave; issue:
    every warp instruction of the launch over all the schedulers (the producers take their items from a
    counter and the ring holds them back to the consumers' pace, so the work spreads over the SMs);
    latency: ``chain_s``, the consumers' chains (kdacupy/cli/profile.py's consumer_chain_s)."""
    out = dict(resource_times(rec, gpu), latency=chain_s)
    if issue:
        out["issue"] = sum(issue) * rec.get("ctas", 1) / (gpu.sms * gpu.schedulers) / (gpu.clock_ghz * 1e9)
    return out


def bound(t: dict) -> tuple[str, float]:
    """The binding resource and its time."""
    name = max(t, key=t.get)
    return name, t[name]
