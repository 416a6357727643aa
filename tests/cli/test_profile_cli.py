"""python -m kdacupy.profile: a slice of the heads scaled to the shape reproduces the full
emulation's counts, forward and backward; the roofline's arithmetic, its latency term and bytes
in flight, the issue term; the tables, --pass, --json and --show (with a device run's medians,
forward and backward)."""
import importlib.util
import json

import pytest

from kdacupy.cli import profile, roofline
from kdacupy.jit import sass_cfg
from kdacupy.emulate.profile import PATH_KINDS
from kdacupy.cli.shapes import Shape
from kdacupy.cli.shapes import make_inputs as profile_inputs

profile_backward_inputs = profile.backward_inputs

pytestmark = pytest.mark.emulate  # the emulation runs the kernels (tests/conftest.py)

H200 = roofline.GPUS["h200"]
# Variants tests/emulate's checked suite builds too ("log-gate-no-beta", "fixed-gva-sigmoid").
# Log gates with no beta: every array's per-head part is whole sectors, and |gc| stays far below
# the pair form's threshold, so each head's CTAs do the same work.
LOG_NO_BETA = dict(gate="log", beta=None, A_log=None, dt_bias=None, lower_bound=None, beta_sigmoid=False)
GVA = Shape("gva-H2-HV4", 37, 2, HV=4, K=64, V=128)
VARLEN = Shape("varlen-H2", 53, 2, HV=4, K=64, V=128, lens=(20, 0, 33))


def slice_and_full(shape, **options):
    full, info_full = profile.forward_records(shape, None, H200.sms, **options)
    part, info = profile.forward_records(shape, 2, H200.sms, **options)
    assert (info["heads_emulated"], info["scale"], info_full["scale"]) == (2, shape.hv // 2, 1)
    assert info["tiles"] == info_full["tiles"]
    assert [r["kernel"] for r in part] == [r["kernel"] for r in full] == ["kda_prepare", "kda_recurrence"]
    return part, full


@pytest.mark.parametrize("shape", [GVA, VARLEN], ids=lambda s: s.name)
def test_a_scaled_slice_reproduces_the_full_emulation(shape, monkeypatch):
    monkeypatch.setattr(profile, "make_inputs", lambda s: no_beta(*profile_inputs(s)))
    for a, b in zip(*slice_and_full(shape, **LOG_NO_BETA)):
        diff = {k: (a[k], b[k]) for k in profile.counts_of(b) if a[k] != b[k]}
        assert not diff, f"{b['kernel']}: scaled slice != full emulation: {diff}"
        assert a["grid"] == b["grid"]


def test_with_kimi_options_only_the_narrow_per_head_arrays_differ():
    """beta [T, HV] (2 bytes per head) and A_log [HV]: the documented difference, under 2%."""
    shape = Shape("kimi-like-H4", 40, 4, K=64, V=64)
    part, full = slice_and_full(shape, lower_bound=-1.0)  # -1: never the pair form
    for a, b in zip(part, full):
        for k in profile.counts_of(b):
            if "sectors" in k or k.startswith(("dram", "inflight")):
                assert a[k] == pytest.approx(b[k], rel=0.02), (b["kernel"], k)
            else:
                assert a[k] == b[k], (b["kernel"], k)

def no_beta(arrays, options):
    arrays = dict(arrays, beta=None)
    return arrays, options


# The backward's slices, with the variants tests/emulate/test_backward_emulate.py builds: its K = V = 128
# case (log gate, no beta, no l2norm) and its grouped sigmoid case (K = V = 64, l2norm, beta logits with
# allow_neg_eigval); the backward's tiles, BV = 64, 3 stages, there and here.
BWD_LOG = dict(LOG_NO_BETA, qk_l2norm=False)
del BWD_LOG["beta"]  # an input: backward_without_beta drops it
BWD_GVA = Shape("bwd-gva-H2-HV4", 40, 2, HV=4, K=128, V=128)


def backward_without_beta(shape):
    arrays, fwd, bwd = profile_backward_inputs(shape)
    return dict(arrays, beta=None), fwd, bwd


def backward_slice_and_full(shape, kernels, **options):
    full, info_full = profile.backward_records(shape, None, H200.sms, **options)
    part, info = profile.backward_records(shape, 2, H200.sms, **options)
    assert (info["heads_emulated"], info["scale"], info_full["scale"]) == (2, shape.hv // 2, 1)
    assert info["tiles"] == info_full["tiles"] == dict(BV=64, stages=3)
    assert [r["kernel"] for r in part] == [r["kernel"] for r in full] == kernels
    return part, full


# The backward's slices against their full emulations are a sweep (tests/sweeps.py: ~22 s of the cold run, the
# full K = V = 128 backward emulated twice): the default run checks the forward's slices so and runs the
# backward's slice in test_cli_tables_json_and_show
@pytest.mark.sweep
def test_a_scaled_backward_slice_reproduces_the_full_emulation(monkeypatch):
    """Grouped heads (the per-chunk kernel's grid is over query heads), a ragged tail."""
    monkeypatch.setattr(profile, "backward_inputs", backward_without_beta)
    kernels = ["kda_prepare", "kda_recurrence", "kda_bwd_chain", "kda_bwd_chunk"]
    for a, b in zip(*backward_slice_and_full(BWD_GVA, kernels, **BWD_LOG)):
        diff = {k: (a[k], b[k]) for k in profile.counts_of(b) if a[k] != b[k]}
        assert not diff, f"{b['kernel']}: scaled slice != full emulation: {diff}"
        assert a["grid"] == b["grid"]


@pytest.mark.sweep
def test_backward_with_kimi_options_only_the_narrow_per_head_arrays_differ():
    """beta, dbeta, A_log, dA_log and the per-chunk partial sums of dA_log: under 2% of each kernel's
    sectors and DRAM bytes, or a sector or two (dA_log's 4 bytes per head, in kda_bwd_reduce's 1 KB);
    kda_bwd_reduce's grid (one CTA per value head) scales on its x axis."""
    shape = Shape("kimi-like-H4", 40, 4, K=64, V=64)
    kernels = ["kda_prepare", "kda_recurrence", "kda_bwd_chain", "kda_bwd_chunk", "kda_bwd_reduce"]
    part, full = backward_slice_and_full(shape, kernels, lower_bound=-1.0, allow_neg_eigval=True)
    for a, b in zip(part, full):
        assert a["grid"] == b["grid"], b["kernel"]
        for k in profile.counts_of(b):
            if "sectors" in k:
                assert a[k] == pytest.approx(b[k], rel=0.02, abs=2), (b["kernel"], k)
            elif k.startswith(("dram", "inflight")):
                assert a[k] == pytest.approx(b[k], rel=0.02, abs=64), (b["kernel"], k)
            else:
                assert a[k] == b[k], (b["kernel"], k)

def test_the_slice_keeps_whole_query_head_groups():
    s, hv = profile.slice_shape(Shape("gva", 64, 2, HV=8), 1)
    assert (s.H, s.hv, hv) == (1, 4, 4)
    s, hv = profile.slice_shape(Shape("x", 64, 96), 2)
    assert (s.H, s.hv, hv) == (2, 2, 2)


def test_occupancy_from_registers_shared_memory_and_threads():
    # 128 threads x 128 regs = 16 K regs per CTA: 4 per SM; 26.7 KB smem would allow 8
    occ = roofline.occupancy(H200, 128, 128, 26688)
    assert (occ["ctas_per_sm"], occ["warps_per_sm"], occ["limited_by"]) == (4, 16, "registers")
    # registers are allocated per warp in units of 256: 143 regs -> 144 per thread
    occ = roofline.occupancy(H200, 64, 143, 34432)
    assert (occ["ctas_per_sm"], occ["limited_by"]) == (6, "shared memory")  # 228 KB / (34432 + 1024)
    assert roofline.occupancy(H200, 1024, 32, 0)["ctas_per_sm"] == 2  # 64 warps per SM


def test_roofline_times():
    rec = dict(kernel="kda_recurrence", ctas=264, dram_read_bytes=4.8e9, dram_write_bytes=0,
               smem_wavefronts=132 * 1.83e9, mma=H200.mma_sync_tflops * 1e12 / roofline.MMA_FLOP,
               sfu=132 * 1.83e9 * 16 / 32)
    t = roofline.times(rec, H200)
    assert t["hbm"] == pytest.approx(1e-3 / 0.9) and t["smem"] == pytest.approx(1.0)  # 90% of the datasheet's HBM
    assert t["tensor"] == pytest.approx(1.0) and t["sfu"] == pytest.approx(1.0)
    assert "latency" not in t  # a record without the path counters
    # 133 CTAs on 132 SMs: a second wave for one CTA, so per-SM resources take 2 x 132 / 133 as long
    t2 = roofline.times(dict(rec, ctas=133), H200)
    assert t2["smem"] == pytest.approx(2 * 132 / 133)
    assert roofline.bound(t) == ("smem", t["smem"]) or roofline.bound(t)[1] == pytest.approx(1.0)


def path_record(ctas, longest, mean, load_bytes, peak, kernel="kda_prepare"):
    """A synthetic record: the longest CTA path's steps, each CTA's mean steps, its global load
    bytes and the most it had in flight."""
    rec = dict(kernel=kernel, ctas=ctas, block=[128, 1, 1], shared_mem=0, gmem_load_sectors=ctas * load_bytes // 32,
               inflight_peak_bytes=peak, dram_read_bytes=0, dram_write_bytes=0, smem_wavefronts=0, mma=0, sfu=0)
    for k in PATH_KINDS:
        rec[f"path_max_{k}"] = longest.get(k, 0)
        rec[f"path_sum_{k}"] = ctas * mean.get(k, 0)
    return rec


def test_the_latency_term_and_the_bytes_in_flight_by_hand():
    # 1320 CTAs, 5 resident per SM: ceil(1320 / 132) / 5 = 2 rounds of the mean path
    rec = path_record(1320, dict(issue=100, dram=2, mma=10), dict(issue=50, dram=1, mma=10), 8192, 8192)
    assert roofline.path_cycles(rec, H200) == 100 + 2 * 700 + 10 * 24  # 1740
    assert roofline.path_cycles(rec, H200, "sum") / 1320 == 50 + 700 + 240  # 990
    assert roofline.times(rec, H200, ctas_per_sm=5)["latency"] == pytest.approx(2 * 990 / 1.83e9)
    assert roofline.times(rec, H200, ctas_per_sm=1)["latency"] == pytest.approx(10 * 990 / 1.83e9)
    fl = roofline.in_flight(rec, H200, 5)
    assert fl["resident"] == 5 and fl["mean_bytes"] == pytest.approx(5 * 8192 * 700 / 990)
    assert fl["peak_bytes"] == 5 * 8192
    assert fl["need_bytes"] == pytest.approx(0.9 * 4.8e12 / 132 * 700 / 1.83e9)  # 12.2 KB: Little's law
    assert not fl["latency_bound_on_loads"]
    assert roofline.in_flight(rec, H200, 1)["latency_bound_on_loads"]  # 5.8 KB of 13.6
    # a B200 prices the same steps at its DRAM latency: 9 rounds of 1150 / 5 beat the longest 2060
    b200 = roofline.GPUS["b200"]
    assert roofline.times(rec, b200, 5)["latency"] == pytest.approx(9 / 5 * (50 + 860 + 240) / 1.86e9)


def test_a_small_grid_waits_for_its_longest_cta_and_needs_more_in_flight():
    """8 chunk-serial CTAs: each SM holds at most one, so the latency term is the longest CTA and
    the 8 busy SMs would each need an eighth of the bandwidth's bytes in flight."""
    rec = path_record(8, dict(issue=400, dram=17, mma=11), dict(issue=300, dram=16, mma=11), 16 * 14848, 37888,
                      kernel="kda_recurrence")
    longest = 400 + 17 * 700 + 11 * 24
    assert roofline.times(rec, H200, 6)["latency"] == pytest.approx(longest / 1.83e9)
    info = roofline.path_info(rec, H200, 6, chunks=16)
    assert info["cycles_per_chunk"] == pytest.approx(longest / 16) and info["steps"]["dram"] == 17
    assert info["rounds"] == pytest.approx(1 / 6) and info["resident"] == 1
    assert info["need_bytes"] == pytest.approx(0.9 * 4.8e12 / 8 * 700 / 1.83e9) and info["latency_bound_on_loads"]
    assert "cycles_per_chunk" not in roofline.path_info(dict(rec, kernel="kda_prepare"), H200, 6, chunks=16)


def test_the_issue_term_by_hand():
    """Warp w on scheduler w mod 4, one instruction a clock each; ceil(CTAs / SMs) CTAs on an SM;
    a chunk chain's path at least its busiest scheduler's issue over the longest chain, shared with
    the chains resident beside it."""
    rec = path_record(264, dict(issue=100), dict(issue=100), 0, 0, kernel="kda_prepare")
    warps = [1000.0, 600.0, 600.0, 600.0, 500.0]  # 5 warps: warp 4 shares scheduler 0 with warp 0
    assert roofline.issue_cycles(rec, H200, warps) == 2 * 1500  # 264 CTAs: 2 on each of 132 SMs
    assert roofline.times(rec, H200, 4, issue=warps)["issue"] == pytest.approx(3000 / 1.83e9)
    assert "issue" not in roofline.times(rec, H200, 4)
    chain = path_record(128, dict(issue=10, dram=1), dict(issue=10, dram=1), 0, 0, kernel="kda_recurrence")
    per_cta = [512 * 700.0, 512 * 500.0, 512 * 500.0, 512 * 500.0]  # 512 chunks a CTA on average
    t = roofline.times(chain, H200, 3, issue=per_cta, chunks=1024, mean_chunks=512)
    assert t["issue"] == pytest.approx(512 * 700 / 1.83e9)  # 128 CTAs: one an SM
    assert t["latency"] == pytest.approx(1024 * 700 / 1.83e9)  # the longest chain: 1024 chunks of 700
    assert roofline.chain_issue_cycles(dict(chain, ctas=264), H200, per_cta, 3, 1024, 512) == 2 * 1024 * 700
    assert roofline.times(dict(chain, kernel="kda_prepare"), H200, 3, issue=per_cta, chunks=1024,
                          mean_chunks=512)["latency"] == pytest.approx(roofline.times(chain, H200, 3)["latency"])


def with_neg_eigval(shape):  # the beta mode of test_backward_emulate.py's grouped sigmoid case: its variants
    arrays, fwd, bwd = profile_backward_inputs(shape)
    return arrays, fwd, dict(bwd, allow_neg_eigval=True)


def test_cli_tables_json_and_show(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(profile, "backward_inputs", with_neg_eigval)
    issue_term = sass_cfg.nvdisasm() is not None and importlib.util.find_spec("scipy") is not None
    out = tmp_path / "p.json"
    assert profile.main(["--shape", "T=40,H=2,K=64,V=64", "--pass", "both", "--json", str(out), "--hotspots", "2",
                         "--fused", "off"]) == 0
    text = capsys.readouterr()
    assert "kda_prepare" in text.out and "kda_recurrence" in text.out and "roofline h200" in text.out
    assert "lat. us" in text.out and "path h200" in text.out and "global loads in flight per SM" in text.out
    assert "kda_bwd_chain" in text.out and "kda_bwd_chunk" in text.out and "kda_bwd_reduce" in text.out
    assert "emulating 1 of 2 value heads" in text.err and "2/2 T=40,H=2,K=64,V=64 backward" in text.err
    doc = json.loads(out.read_text())
    run, bwd = doc["runs"]
    assert (run["kind"], bwd["kind"]) == ("forward", "backward") and bwd["shape"] == run["shape"]
    assert run["scale"] == 2 and run["hbm_floor_s"] > 0 and run["predicted_s"] > 0
    prep, rec = run["kernels"]
    assert prep["counts"]["ctas"] == 3 * 2 and rec["counts"]["mma"] == 0  # on sm_90a the wgmma recurrence:
    assert run["tiles"]["mma"] == "wgmma" and rec["counts"]["wgmma"] > 0 and rec["counts"]["bulk_copy_bytes"] > 0
    assert 0 < prep["sector_efficiency"] <= 1 and rec["bound"] in rec["times"]
    assert [r["kernel"] for r in bwd["kernels"]] == ["kda_prepare", "kda_recurrence", "kda_bwd_chain", "kda_bwd_chunk",
                                                      "kda_bwd_reduce"]
    chain = bwd["kernels"][2]  # kda_bwd_chain: 3 chunks (T = 40), one CTA per SM
    lat = chain["latency"]
    assert lat["cycles_per_chunk"] == pytest.approx(lat["path_cycles"] / 3) and lat["steps"]["dram"] >= 1
    path_s = lat["path_cycles"] / H200.clock_ghz / 1e9  # or, where longer, the chain's issue
    assert chain["times"]["latency"] == pytest.approx(path_s) or issue_term and chain["times"]["latency"] > path_s
    assert "cycles_per_chunk" not in bwd["kernels"][3]["latency"]  # kda_bwd_chunk: token-parallel
    assert all(r["times"]["latency"] > 0 and r["latency"]["need_bytes"] > 0 for r in run["kernels"] + bwd["kernels"])
    assert bwd["hbm_floor_s"] > run["hbm_floor_s"] and bwd["predicted_s"] > 0  # do, dq, dk, ... besides the inputs
    if issue_term:  # every kernel's instructions per warp, from its SASS on sm_90a
        for r in run["kernels"] + bwd["kernels"]:
            i = r["issue"]
            assert i["arch"] == "sm_90a" and i["static"] > 0 and len(i["warps"]) == -(-r["block"][0] // 32)
            assert r["times"]["issue"] > 0 and 0 <= i["misfit"] < 0.5 and i["opcodes"] and i["lines"]
            assert i["per"] == ("chunk" if r["kernel"] in roofline.CHAIN_KERNELS else "CTA")
        assert "issue (SASS sm_90a)" in text.out and "issue us" in text.out
    assert profile.main(["--show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "Predicted forward times on NVIDIA H200 SXM" in shown and "T=40,H=2,K=64,V=64" in shown
    latency_ms = sum(r["times"]["latency"] for r in run["kernels"]) * 1e3
    assert "latency ms" in shown and f"{latency_ms:.3f}" in shown and "cycles/chunk" in shown and "KB/SM" in shown
    both_ms = (run["predicted_s"] + bwd["predicted_s"]) * 1e3
    assert "Predicted backward and forward + backward times" in shown and f"{both_ms:.3f}" in shown
    assert profile.main(["--show", str(tmp_path / "missing.json")]) == 2
    bench = tmp_path / "bench.json"  # a device run's medians, set next to the prediction
    predicted_ms = run["predicted_s"] * 1e3
    bench.write_text(json.dumps(dict(shapes=[dict(shape=dict(name=run["name"]), kdacupy=dict(median_ms=3 * predicted_ms))])))
    assert profile.main(["--show", str(out), "--measured", str(bench)]) == 0
    shown = capsys.readouterr().out
    assert "meas/pred" in shown and f"{3 * predicted_ms:.3f}" in shown and " 3.00 " in shown
    bench.write_text(json.dumps(dict(shapes=[dict(shape=dict(name=run["name"]), kdacupy=dict(  # --shapes backward's
        forward=dict(median_ms=2 * predicted_ms), backward=dict(median_ms=4 * bwd["predicted_s"] * 1e3),
        forward_backward=dict(median_ms=5 * both_ms)))])))
    assert profile.main(["--show", str(out), "--measured", str(bench)]) == 0
    shown = capsys.readouterr().out
    assert " 2.00 " in shown and " 4.00 " in shown and " 5.00 " in shown
    assert profile.main(["--show", str(out), "--measured", str(tmp_path / "no-bench.json")]) == 0  # no GPU run yet
    shown = capsys.readouterr().out
    assert "measured: none" in shown and "Predicted forward times" in shown


def test_a_scaled_split_slice_reproduces_the_full_emulation(monkeypatch):
    """--segments N profiles the split forward (prepare, the maps in one launch, the scan, the forward):
    a slice of the heads, scaled, counts what all of them do, launch by launch."""
    monkeypatch.setattr(profile, "make_inputs", lambda s: no_beta(*profile_inputs(s)))
    shape = Shape("gva-H2-HV4-long", 70, 2, HV=4, K=64, V=64)
    full, info_full = profile.forward_records(shape, None, H200.sms, segments=2, **LOG_NO_BETA)
    part, info = profile.forward_records(shape, 2, H200.sms, segments=2, **LOG_NO_BETA)
    assert info["segments"] == info_full["segments"] == 2
    assert [r["kernel"] for r in part] == [r["kernel"] for r in full] == [
        "kda_prepare", "kda_recurrence", "kda_seqpar_scan", "kda_recurrence"]
    for a, b in zip(part, full):
        diff = {k: (a[k], b[k]) for k in profile.counts_of(b) if a[k] != b[k]}
        # the split's own segment table (cu_seqlens of the segments) is read whole by every head, and
        # scaled with them: its two sectors are the one difference the slice may show
        for k in ("dram_bytes", "dram_read_bytes"):
            if k in diff and abs(diff[k][0] - diff[k][1]) <= 2 * 32 * (shape.hv // 2):
                del diff[k]
        assert not diff, f"{b['kernel']}: scaled slice != full emulation: {diff}"
    serial, info1 = profile.forward_records(shape, 2, H200.sms, segments=1, **LOG_NO_BETA)
    assert info1["segments"] == 1 and [r["kernel"] for r in serial] == ["kda_prepare", "kda_recurrence"]


def test_the_default_segments_are_the_default_calls():
    """Without --segments the profile takes what kda_forward(sequence_parallel=None) takes on that GPU
    and target: on the H200 (sm_90a, the wgmma runs) 4 segments at T = 8192, H = 12 (the issue-aware
    profile's fastest, docs/design.md section 7.2), serial at H = 64; with mma.sync's runs (no target)
    serial at T = 8192, H = 12 and split for a 64K-token sequence of 12 heads."""
    from kdacupy.seqpar import auto_segments

    for shape in (Shape("h12", 8192, 12), Shape("h12-long", 65536, 12), Shape("h64", 8192, 64)):
        for arch in (None, H200.arch):
            want = auto_segments(profile.shape_problem(shape), H200.sms, arch)[0]
            assert profile.default_segments(shape, H200.sms, arch) == want
    assert H200.arch == "sm_90a"
    assert profile.default_segments(Shape("h12", 8192, 12), H200.sms, H200.arch) == 4
    assert profile.default_segments(Shape("h64", 8192, 64), H200.sms, H200.arch) == 1
    assert profile.default_segments(Shape("h12", 8192, 12), H200.sms) == 1
    assert profile.default_segments(Shape("h12-long", 65536, 12), H200.sms) > 1


def test_blackwell_prices_mma_sync_at_the_assumed_per_sm_rate_not_tcgen05s():
    """The datasheets' Blackwell rates are tcgen05's: mma.sync is priced at Hopper's assumed 2048 FLOP per
    clock per SM (docs/design.md section 11.1), so its tensor term is four times the datasheet's there."""
    for key in ("h100", "h200", "b200", "gb200"):
        gpu = roofline.GPUS[key]
        assert gpu.mma_sync_tflops == pytest.approx(2048 * gpu.sms * gpu.clock_ghz / 1e3, abs=0.05)
    b200, gb200 = roofline.GPUS["b200"], roofline.GPUS["gb200"]
    assert b200.mma_sync_tflops < b200.bf16_tflops / 3.9 and gb200.arch == b200.arch == "sm_100a"
    assert gb200.bf16_tflops == 2500.0 and gb200.hbm_tb_s == 8.0 and gb200.sms == 148
    # the clock each datasheet rate implies: 8192 dense bf16 FLOP per clock per SM
    assert gb200.bf16_tflops * 1e12 / (gb200.sms * 8192) / 1e9 == pytest.approx(gb200.clock_ghz, abs=0.01)
    rec = dict(kernel="kda_recurrence", mma=10 ** 6, ctas=b200.sms, dram_read_bytes=0, dram_write_bytes=0,
               smem_wavefronts=0, sfu=0)
    assert roofline.times(rec, b200, 1)["tensor"] == pytest.approx(10 ** 6 * roofline.MMA_FLOP / 563.8e12)


def test_the_fused_forward_is_one_launch_priced_by_its_issue_and_its_consumers_chains(tmp_path, capsys):
    """--fused on (and the default call on the H200 at one sequence: fused.pays): one kda_forward_fused row,
    its HBM from the ring's bytes held in L2 (the workspace never counted), its issue every warp's over all
    the schedulers, its latency the consumers' chains as the two-launch recurrence at their tiles."""
    out = tmp_path / "f.json"
    assert profile.main(["--shape", "T=40,H=2,K=64,V=64", "--json", str(out), "--fused", "on"]) == 0
    run = json.loads(out.read_text())["runs"][0]
    (row,) = run["kernels"]
    assert row["kernel"] == "kda_forward_fused" and run["fused"] and run["tiles"] == dict(BV=64, stages=3, mma="wgmma")
    assert "latency" in row["times"] and row["times"]["latency"] > 0 and row["time_s"] == max(row["times"].values())
    two, one = tmp_path / "t.json", tmp_path / "o.json"  # 25 chunks: more than the ring's 8 slots a head
    assert profile.main(["--shape", "T=400,H=2,K=64,V=64", "--json", str(two), "--fused", "off"]) == 0
    assert profile.main(["--shape", "T=400,H=2,K=64,V=64", "--json", str(one), "--fused", "on"]) == 0
    prep, rec = json.loads(two.read_text())["runs"][0]["kernels"]
    (row,) = json.loads(one.read_text())["runs"][0]["kernels"]
    for k in ("dram_write_bytes", "dram_read_bytes"):  # the workspace's round trip, gone into the ring
        assert row["counts"][k] < prep["counts"][k] + rec["counts"][k]
    default = tmp_path / "d.json"
    assert profile.main(["--shape", "T=40,H=2,K=64,V=64", "--json", str(default)]) == 0
    assert [r["kernel"] for r in json.loads(default.read_text())["runs"][0]["kernels"]] == ["kda_forward_fused"]
