"""The fused forward (kernels/kda_forward_fused.cu, kdacupy/ops/forward/fused.py): kda_prepare and the
wgmma or tcgen05 recurrence as the two roles of one co-resident launch, the workspace a ring of chunk blocks
a value head. Its output and final state are the two-launch forward's of the same family bit for bit (which
the suites hold to the precision model), and the ring's flags end exactly where the protocol says: every slot's ready flag
at the last chunk it held, its consumed count at what every consumer released (the slots no sequence
uses included), every item taken once, no overrun. Varlen with a zero-length sequence, ragged tails and
a ring two slots deep (every slot refilled many times), fixed-length batches under racecheck. Each point
builds its own fused variant (2-3 s of the cold run), so the default run takes a sample: each family
once (tcgen05's varlen ring at a row a thread, wgmma's fixed length under racecheck) and the bf16 state's
pair-form prepare; the rest is a sweep (tests/sweeps.py)."""
import numpy as np
import pytest

import kdacupy.ops.forward.fused as fused
from kdacupy.cli.shapes import validated
from kdacupy.ops.forward import kernels
from kdacupy.ops.forward.tuning import TileConfig

from ..inputs import make_inputs
from ..sweeps import sample

pytestmark = pytest.mark.emulate

CHUNK = 16


def forward(x, opts, fuse, stages=2, producers=None, mma="wgmma", BV=64):
    p, a = validated(x, opts, "emulate")
    return p, kernels.forward(p, a, TileConfig(BV, stages, mma), fused=fuse, producers=producers)


def used_slots(p, lens):
    """Per sequence, its workspace slots (the kernels' first_slot: varlen n + bos / 16)."""
    if lens is None:
        per = -(-p.T // CHUNK)
        return [range(n * per, (n + 1) * per) for n in range(p.B)]
    bos = np.concatenate([[0], np.cumsum(lens)])
    return [range(n + bos[n] // CHUNK, n + bos[n] // CHUNK + -(-int(lens[n]) // CHUNK)) for n in range(len(lens))]


def expected_flags(p, lens, producers, BV):
    """ready, consumed a head's slots, the item counter and the error word after the launch."""
    R, G, ncons = fused.RING_SLOTS, fused.GROUP, p.V // BV
    seqs = used_slots(p, lens)
    used = [s for r in seqs for s in r]
    walked = range(0, max(used) + 1)  # every slot up to the last sequence's: used or released as passed
    ready = [max([s + 1 for s in used if s % R == r], default=0) for r in range(R)]
    consumed = [ncons * sum(1 for s in walked if s % R == r) for r in range(R)]
    nslots = kernels.slots(p)[0]
    items = -(-nslots // G) * p.HV
    return np.array(ready * p.HV + consumed * p.HV + [items + producers, 0], np.uint32)


def identical(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


CASES = {  # name: (lens or None, batch, stages, ring slots, slots an item, producers, check mode, mma, BV)
    "varlen-ring2": ([37, 0, 50, 9, 131], 1, 2, 2, 3, 3, None, "wgmma", 64),
    "fixed-racecheck": (None, 2, 2, 16, 4, 1, "all", "wgmma", 64),
    # tcgen05's consumers (sm_100a): a row a thread (BV = 128), and half rows (BV = 64, two consumers a head)
    "tcgen05-varlen-ring2": ([37, 0, 50, 9, 131], 1, 2, 2, 3, 3, None, "tcgen05", 128),
    "tcgen05-halves-racecheck": (None, 2, 3, 4, 2, 2, "all", "tcgen05", 64),
}


# the default run: varlen on tcgen05 (its two-launch build test_forward_tcgen05.py's), racecheck on wgmma
# (cover=False: the axis is the cases themselves)
@pytest.mark.parametrize("name", sample(list(CASES), lambda n: n in ("tcgen05-varlen-ring2", "fixed-racecheck"),
                                        cover=False))
def test_fused_forward_is_the_two_launch_forward_bit_for_bit(monkeypatch, name):
    lens, B, stages, R, G, producers, check, mma, BV = CASES[name]
    x, opts = make_inputs(B=B, T=70, H=1, HV=2, K=64, V=128, state=np.float32, cu_seqlens=lens)
    opts["output_final_state"] = True
    _, plain = forward(x, opts, False, stages, mma=mma, BV=BV)
    monkeypatch.setattr(fused, "RING_SLOTS", R)
    monkeypatch.setattr(fused, "GROUP", G)
    if check:
        monkeypatch.setenv("KDACUPY_EMULATE_CHECK", check)
    seen = {}
    scratch = fused.scratch

    def keep(*args):
        seen["ring"], seen["flags"], a = scratch(*args)
        return seen["ring"], seen["flags"], a

    monkeypatch.setattr(fused, "scratch", keep)
    p, one = forward(x, opts, True, stages, producers, mma, BV)
    identical(one, plain)
    np.testing.assert_array_equal(seen["flags"], expected_flags(p, lens, producers, BV))


def test_the_fused_forward_takes_what_it_serves_only():
    x, opts = make_inputs(T=40, H=1, HV=2, K=64, V=128)
    p, a = validated(x, opts, "emulate")
    with pytest.raises(ValueError, match="fused forward: not for tiles"):
        kernels.forward(p, a, TileConfig(128, 2, "wgmma"), fused=True)
    with pytest.raises(ValueError, match="leave no room for a producer"):
        kernels.forward(p, a, TileConfig(64, 2, "wgmma"), fused=True, producers=0)


# the default run: the bf16 state, whose fused prepare has gate rows of its own (KDA_G_PAIRS); the fp32 state's
# are the plain launch's, which the two-launch suites run (cover=False: that one value is the sweep)
@pytest.mark.parametrize("precision", sample(["bf16", "fp32"], lambda p: p == "bf16", cover=False))
def test_the_fused_prepare_build_on_the_pair_form_and_its_gate_rows(precision):
    """With the bf16 state the fused launch builds kda_prepare with its gate sums as 8-byte channel pairs
    (KDA_G_PAIRS: rows of 2 mod 4 floats, kernels/kda_prepare.cu; the fp32 state keeps the plain launch's
    odd rows): the same bits as the two launches, on chunks whose decay takes the pair form (which reads
    those rows by column; the other cases here run the factored form)."""
    from kdacupy.numerics.precision import chunk_decay, gate_f32, pair_form_chunks

    from ..cases import case_inputs

    x, opts = case_inputs("pair-form-extreme-decay", precision)
    g2 = gate_f32(np.asarray(x["g"], np.float64), "log", None, None, None)
    gc, _, gr = chunk_decay(g2[0, :32].reshape(2, 16, *g2.shape[2:]).swapaxes(1, 2))
    assert pair_form_chunks(gc, gr).all()
    assert kernels.fused_variant(validated(x, opts, "emulate")[0], TileConfig(64, 2, "wgmma")).prepare.g_pairs == (precision == "bf16")
    identical(forward(x, opts, True)[1], forward(x, opts, False)[1])


# ---- the split forward's last segments in the final launch (kdacupy/ops/seqpar/split.py) ----------------------

#: name: (batch, tokens, value dim, segments, stages, ring slots, slots an item, producers, check mode)
SPLIT_CASES = {
    # two sequences (their last segments between the others), ragged tails, a shallow ring refilled many times,
    # items longer than a segment's remainder; V = K: the maps run merged on one warpgroup, so the maps' launch
    # makes the other segments (no prepare launch); under racecheck
    "two-sequences-maps-racecheck": (2, 150, 64, 3, 2, 3, 3, 2, "all"),
    # V = 2 K: separate M and B maps, so a prepare launch makes the other segments (its grid whole)
    "two-sequences-prepare": (2, 150, 128, 3, 3, 3, 3, 2, None),
    # one sequence: the prepare's grid trimmed at the last segment
    "one-sequence": (1, 120, 128, 2, 3, 4, 2, 1, None),
}


def split_run(monkeypatch, x, opts, n, stages, fuse):
    monkeypatch.setattr(kernels, "select_tiles", lambda p, **kw: TileConfig(64, stages, "wgmma"))
    monkeypatch.setenv("KDACUPY_FORWARD_FUSED", "on" if fuse else "off")
    import kdacupy

    return kdacupy.kda_forward(**x, **opts, sequence_parallel=n, backend="emulate")


def split_expected_flags(B, T, n, R, G, producers, HV, ncons):
    """ready, consumed a stream's slots (a last segment's value head), the item counter, the error word."""
    c = -(-T // CHUNK)
    last = c - (n - 1) * c // n  # chunks of a last segment (split.segment_cu_seqlens)
    ready = [max([s + 1 for s in range(last) if s % R == r], default=0) for r in range(R)]
    consumed = [ncons * sum(1 for s in range(last) if s % R == r) for r in range(R)]
    items = fused.split_groups(T, n, G) * B * HV
    return np.array(ready * B * HV + consumed * B * HV + [items + producers, 0], np.uint32)


# the default run: two sequences both ways (the maps' launch making the other segments under racecheck, whose
# waits and barriers are the mutants' to find; the prepare launch skipping the last ones); one sequence is a
# sweep (cover=False: the axis is the cases)
@pytest.mark.parametrize("name", sample(list(SPLIT_CASES), lambda n: n.startswith("two-"), cover=False))
def test_the_split_makes_its_last_segments_in_the_final_launch(monkeypatch, name):
    """The split forward with its final launch fused: the segments but the last read the workspace, the last
    ones a ring the producers fill; the workspace written by the maps' launch's producers where the maps run
    merged (no prepare launch), else by a prepare launch that skips the last segments. Bit for bit the split's
    plain launches (whose suites hold them to the precision model); the last segments' slots unwritten; the
    ring's and the maps' flags end where their protocols say."""
    from kdacupy.ops.seqpar import split

    B, T, V, n, stages, R, G, producers, check = SPLIT_CASES[name]
    x, opts = make_inputs(B=B, T=T, H=1, HV=2, K=64, V=V, state=np.float32)
    opts["output_final_state"] = True
    plain = split_run(monkeypatch, x, opts, n, stages, False)
    monkeypatch.setattr(fused, "RING_SLOTS", R)
    monkeypatch.setattr(fused, "GROUP", G)
    monkeypatch.setattr(fused, "EMULATED_PRODUCERS", producers)
    if check:
        monkeypatch.setenv("KDACUPY_EMULATE_CHECK", check)
    seen = {}
    split_scratch, launch_prepare = fused.split_scratch, kernels.launch_prepare

    def poisoned(p, *args, **kw):
        ws, ring, flags, map_flags, a = split_scratch(p, *args, **kw)
        ws.fill(0xA5)
        seen.update(ws=ws, flags=flags, map_flags=map_flags, p=p)
        return ws, ring, flags, map_flags, a

    monkeypatch.setattr(fused, "split_scratch", poisoned)
    monkeypatch.setattr(kernels, "launch_prepare", lambda *a, **kw: seen.update(prepare=True) or launch_prepare(*a, **kw))
    identical(split_run(monkeypatch, x, opts, n, stages, True), plain)
    p, maps = seen["p"], V == 64
    assert seen.get("prepare", False) != maps and (seen["map_flags"] is not None) == maps
    np.testing.assert_array_equal(seen["flags"], split_expected_flags(B, T, n, R, G, producers, p.HV, p.V // 64))
    # the workspace: a block per slot and head; the last segments' slots untouched, every other written (and with
    # the maps' launch, flagged: 1 a slot it wrote, 0 elsewhere; its counter at every item and producer)
    cu = split.segment_cu_seqlens(np.arange(B + 1) * T, n)
    nslots = kernels.slots(p)[0]
    blocks = seen["ws"].reshape(p.HV, nslots, -1)
    written = np.zeros(nslots, bool)
    for s in range(B * n):
        first = s + cu[s] // CHUNK
        chunks = range(first, first + -(-int(cu[s + 1] - cu[s]) // CHUNK))
        untouched = [bool((blocks[:, c] == 0xA5).all()) for c in chunks]
        assert untouched == [s % n == n - 1] * len(chunks), f"segment {s}"
        written[list(chunks)] = s % n != n - 1
    if maps:
        items = fused.split_map_groups(T, n, G) * B * (n - 1) * p.HV
        want = np.concatenate([np.tile(written.astype(np.uint32), p.HV), [items + producers, 0]])
        np.testing.assert_array_equal(seen["map_flags"], want)


def test_the_split_fuses_its_last_segments_where_the_model_says():
    """fused.split_pays (the H200's issue-aware model): the serving shape T = 8192, H = 12 in 4 segments on
    132 SMs (96 chains, 36 SMs free for the last segments' prepare); not where the chains fill the SMs, not
    off sm_90a, not for varlen calls; split_groups and split_map_groups count a last segment's items and the
    longest other one's as the boundaries do."""
    from kdacupy.cli.shapes import Shape
    from kdacupy.cli.profile import shape_problem
    from kdacupy.ops.seqpar import split

    few = shape_problem(Shape("h12", 8192, 12))
    assert fused.split_pays(few, 4, 132, "sm_90a")
    assert not fused.split_pays(few, 4, 132, "sm_100a") and not fused.split_pays(few, 4, None, "sm_90a")
    assert not fused.split_pays(few, 6, 132, "sm_90a")  # 144 chains on 132 SMs
    assert not fused.split_pays(shape_problem(Shape("h64", 8192, 64)), 2, 132, "sm_90a")
    assert not fused.split_pays(shape_problem(Shape("v", 8192, 12, lens=(4096, 4096))), 4, 132, "sm_90a")
    for T, n, G in [(8192, 4, 4), (150, 3, 3), (17, 2, 4), (1000, 7, 2), (70, 3, 1)]:
        cu = split.segment_cu_seqlens(np.array([0, T]), n)
        groups = [-(-(-(-int(cu[s + 1] - cu[s]) // CHUNK)) // G) for s in range(n)]
        assert fused.split_groups(T, n, G) == groups[-1] and fused.split_map_groups(T, n, G) == max(groups[:-1])


def test_the_split_counts_its_producers_and_refuses_no_room_for_one():
    """On the GPU the split's launches take every block the device holds beside their chains as producers
    (fused.split_producers, from the loader's resident count); none left is an error naming the chains, not a
    launch that could never finish (its consumers wait on producers)."""
    import dataclasses

    x, opts = make_inputs(T=40, H=1, HV=2, K=64, V=64)
    p = dataclasses.replace(validated(x, opts, "emulate")[0], device=True)
    var = kernels.fused_variant(p, TileConfig(64, 2, "wgmma"), split=True)

    class Run:  # a loader that answers the resident count only
        def get(self, *args):
            return None

        def resident_blocks(self, fn, threads, smem):
            assert threads == fused.THREADS and smem == var.smem
            return 10

    assert fused.split_producers(Run(), p, var, 7) == 3
    with pytest.raises(ValueError, match="split's 10 consumer blocks leave no room for a producer"):
        fused.split_producers(Run(), p, var, 10)
