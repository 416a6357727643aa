"""Tuning files and the run-time choice of tile configuration, without a GPU:
the device's name and SM count are monkeypatched, and the user and shipped
directories are temporary ones."""
import ast
import copy
import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

import kdacupy.ops.forward.tuning as tuning
from kdacupy.ops.forward.tuning import TILE_SPACE, TileConfig, bucket_of, describe_selection, heuristic, select_tiles
from kdacupy.validation import validate

from ..inputs import make_inputs

H200 = "NVIDIA H200"


def problem(K=64, V=64, lens=None, device=True, state_precision="bf16", **sizes):
    """A validated Problem from tiny NumPy inputs (T=20, H=HV=1); ``sizes``
    (T, H, HV, N, B) then replace the sizes, so large shapes cost nothing."""
    x, opts = make_inputs(B=1, T=20, H=1, K=K, V=V, cu_seqlens=lens)
    kw = dict(scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, qk_l2norm=True,
              beta_sigmoid=False, allow_neg_eigval=False, gate="log", A_log=None, dt_bias=None, lower_bound=None,
              state_layout="kv", state_dtype=None, state_precision=state_precision, out=None, backend="emulate")
    kw.update(opts)
    p, _ = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)
    return dataclasses.replace(p, device=device, **sizes)


def kimi(H, kind):
    """The Kimi benchmark shapes as Problems (T = 8192, K = V = 128)."""
    if kind == "fixed":
        return problem(K=128, V=128, T=8192, H=H, HV=H)
    return problem(K=128, V=128, lens=[3, 5], T=8192, H=H, HV=H, N=6 if kind == "varlen6" else 8)


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """A fake H200 (132 SMs), an empty user dir and an empty shipped dir."""
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    user.mkdir()
    shipped.mkdir()
    monkeypatch.setenv("KDACUPY_TUNING_DIR", str(user))
    monkeypatch.setattr(tuning, "shipped_dir", lambda: shipped)
    monkeypatch.setattr(tuning, "device_facts", lambda: (0, H200, 132))
    tuning.clear_cache()
    yield user, shipped
    tuning.clear_cache()


def entry(p, cfg, t=1.0, sm=132, runner_up=None):
    ru = None if runner_up is None else (runner_up, 1.25 * t)
    return tuning.Entry(bucket_of(p, sm), cfg, t, ru, None if ru is None else 0.25)


def write(path, entries, gpu=H200, sm=132):
    path.write_text(tuning.dump_table(gpu, sm, 13000, "0.1.0", "2025-01-31", entries))
    return path


def valid_doc(V=64):
    p = problem(V=V)
    text = tuning.dump_table(H200, 132, 13000, "0.1.0", "2025-01-31",
                             [entry(p, TileConfig(16, 3), 0.5, runner_up=TileConfig(32, 2))])
    return yaml.safe_load(text), p


def select_warns(p):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = describe_selection(p)
    return got, [str(x.message) for x in w]


# ---------------------------------------------------------------------------
# schema


def test_valid_file_round_trips_and_is_selected(dirs):
    user, _ = dirs
    doc, p = valid_doc()
    path = user / "NVIDIA-H200.yaml"
    path.write_text(yaml.safe_dump(doc))
    (cfg, source), msgs = select_warns(p)
    assert (cfg, source, msgs) == (TileConfig(16, 3), str(path), [])
    table = tuning.load_table(path)
    e = table.entries[tuning.bucket_key(bucket_of(p, 132))]
    assert (table.gpu, table.sm_count, table.cuda, table.kdacupy, table.date) == (H200, 132, 13000, "0.1.0",
                                                                                  "2025-01-31")
    assert (e.time_ms, e.runner_up, e.margin) == (0.5, (TileConfig(32, 2), 0.625), 0.25)


def test_unquoted_date_and_string_cuda_version_are_accepted(dirs):
    doc, p = valid_doc()
    text = yaml.safe_dump(doc).replace("'2025-01-31'", "2025-01-31").replace("cuda: 13000", "cuda: '13.0'")
    assert "date: 2025-01-31" in text
    table = tuning.parse_table(yaml.safe_load(text))
    assert table.date == "2025-01-31" and table.cuda == "13.0"


def _set(path, value):
    def f(doc):
        d = doc
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return f


def _del(path):
    def f(doc):
        d = doc
        for k in path[:-1]:
            d = d[k]
        del d[path[-1]]
    return f


B0 = ("buckets", 0)
INVALID = {
    "schema 2": _set(("schema",), 2),
    "schema as text": _set(("schema",), "1"),
    "schema true": _set(("schema",), True),
    "no gpu": _del(("gpu",)),
    "empty gpu": _set(("gpu",), " "),
    "unknown top-level key": _set(("extra",), 1),
    "sm_count 0": _set(("sm_count",), 0),
    "cuda a list": _set(("cuda",), [13]),
    "kdacupy a number": _set(("kdacupy",), 0.1),
    "date a number": _set(("date",), 20250131),
    "buckets a mapping": _set(("buckets",), {"a": 1}),
    "bucket without config": _del((*B0, "config")),
    "bucket unknown key": _set((*B0, "note"), "x"),
    "BV not in space": _set((*B0, "config", "BV"), 48),
    "stages 1 (not tuned)": _set((*B0, "config", "stages"), 1),
    "BV as text": _set((*B0, "config", "BV"), "16"),
    "BV as bool": _set((*B0, "config", "stages"), True),
    "BV above V": _set((*B0, "config", "BV"), 128),
    "config extra key": _set((*B0, "config", "warps"), 4),
    "match K 96": _set((*B0, "match", "K"), 96),
    "match dtype int8": _set((*B0, "match", "dtype"), "int8"),
    "match state fp16": _set((*B0, "match", "state_precision"), "fp16"),
    "match parallelism <3": _set((*B0, "match", "parallelism"), "<3"),
    "match seqlen 1000": _set((*B0, "match", "seqlen"), 1000),
    "match varlen yes": _set((*B0, "match", "varlen"), "yes"),
    "match missing field": _del((*B0, "match", "seqlen")),
    "match extra field": _set((*B0, "match", "H"), 64),
    "time negative": _set((*B0, "time_ms"), -1.0),
    "time nan": _set((*B0, "time_ms"), float("nan")),
    "time text": _set((*B0, "time_ms"), "fast"),
    "runner-up bad config": _set((*B0, "runner_up", "config", "BV"), 256),
    "runner-up without time": _del((*B0, "runner_up", "time_ms")),
    "margin negative": _set((*B0, "margin"), -0.1),
    "margin without runner-up": _set((*B0, "runner_up"), None),
    "duplicate bucket": lambda doc: doc["buckets"].append(copy.deepcopy(doc["buckets"][0])),
}


@pytest.mark.parametrize("name", list(INVALID))
def test_invalid_content_is_ignored_with_one_warning(dirs, name):
    user, _ = dirs
    doc, p = valid_doc()
    INVALID[name](doc)
    path = user / "NVIDIA-H200.yaml"
    path.write_text(yaml.safe_dump(doc))
    (cfg, source), msgs = select_warns(p)
    assert (cfg, source) == (heuristic(p, 132), "heuristic (untuned)")
    assert len(msgs) == 1 and str(path) in msgs[0] and "schema-1" in msgs[0], msgs


@pytest.mark.parametrize("text", ["[1, 2, 3]\n", "", "just a string\n", "schema: 1\n"])
def test_wrong_shape_documents_are_ignored(dirs, text):
    user, _ = dirs
    (user / "NVIDIA-H200.yaml").write_text(text)
    p = problem()
    (cfg, source), msgs = select_warns(p)
    assert source == "heuristic (untuned)" and len(msgs) == 1


def test_corrupt_yaml_and_unsafe_tags_are_ignored(dirs, tmp_path):
    user, shipped = dirs
    marker = tmp_path / "ran"
    (user / "NVIDIA-H200.yaml").write_text("schema: 1\nbuckets: [\n  - {match: \n")
    (shipped / "NVIDIA-H200.yaml").write_text(f"!!python/object/apply:os.system ['touch {marker}']\n")
    p = problem()
    (cfg, source), msgs = select_warns(p)
    assert (cfg, source) == (heuristic(p, 132), "heuristic (untuned)")
    assert len(msgs) == 2 and all("not valid YAML" in m for m in msgs), msgs
    assert not marker.exists()  # yaml.safe_load only


def test_unreadable_file_is_ignored(dirs):
    user, _ = dirs
    (user / "NVIDIA-H200.yaml").mkdir()  # a directory where the file should be: open() fails
    p = problem()
    (cfg, source), msgs = select_warns(p)
    assert source == "heuristic (untuned)"
    assert len(msgs) == 1 and "unreadable" in msgs[0]


def test_foreign_file_is_ignored(dirs):
    user, shipped = dirs
    p = problem()
    write(user / "NVIDIA-H200.yaml", [entry(p, TileConfig(16, 3))], gpu="NVIDIA H100 80GB HBM3")
    write(shipped / "NVIDIA-H200.yaml", [entry(p, TileConfig(64, 3))])
    (cfg, source), msgs = select_warns(p)
    assert (cfg, source) == (TileConfig(64, 3), str(shipped / "NVIDIA-H200.yaml"))
    assert len(msgs) == 1 and "NVIDIA H100 80GB HBM3" in msgs[0]


def test_one_warning_per_file_per_process(dirs):
    user, _ = dirs
    (user / "NVIDIA-H200.yaml").write_text("{{{")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for T in (40, 4000, 40000):  # three buckets: three lookups
            select_tiles(problem(T=T))
    assert len(w) == 1


def test_missing_files_fall_back_silently(dirs):
    p = problem()
    (cfg, source), msgs = select_warns(p)
    assert (cfg, source, msgs) == (heuristic(p, 132), "heuristic (untuned)", [])


def test_dump_table_refuses_what_the_loader_would_reject():
    p = problem(V=64)
    with pytest.raises(tuning.TuningFileError, match="exceeds V"):
        tuning.dump_table(H200, 132, 13000, "0.1.0", "2025-01-31", [entry(p, TileConfig(128, 2))])
    with pytest.raises(tuning.TuningFileError, match="tile space"):
        tuning.dump_table(H200, 132, 13000, "0.1.0", "2025-01-31", [entry(p, TileConfig(32, 1))])


# ---------------------------------------------------------------------------
# lookup order


def test_user_dir_beats_shipped_beats_heuristic(dirs):
    user, shipped = dirs
    a, b, c = problem(T=40), problem(T=4000), problem(T=40000)
    ufile = write(user / "NVIDIA-H200.yaml", [entry(a, TileConfig(16, 3))])
    sfile = write(shipped / "NVIDIA-H200.yaml", [entry(a, TileConfig(64, 3)), entry(b, TileConfig(32, 3))])
    assert describe_selection(a) == (TileConfig(16, 3), str(ufile))  # in both: the user's
    assert describe_selection(b) == (TileConfig(32, 3), str(sfile))  # missing in the user file: falls through
    assert describe_selection(c) == (heuristic(c, 132), "heuristic (untuned)")
    assert select_tiles(a) == TileConfig(16, 3)


def test_user_dir_default_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv("KDACUPY_TUNING_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tuning.user_dir() == tmp_path / ".cache" / "kdacupy" / "tuning"
    monkeypatch.setenv("KDACUPY_TUNING_DIR", str(tmp_path / "x"))
    assert tuning.user_dir() == tmp_path / "x"
    monkeypatch.setenv("KDACUPY_TUNING_DIR", "")
    assert tuning.user_dir() == tmp_path / ".cache" / "kdacupy" / "tuning"


def test_shipped_dir_is_the_package_tuning_dir():
    assert tuning.shipped_dir() == Path(tuning.__file__).resolve().parents[3] / "tuning"


def test_files_are_parsed_once_per_process(dirs):
    user, _ = dirs
    a, b = problem(T=40), problem(T=4000)
    path = write(user / "NVIDIA-H200.yaml", [entry(a, TileConfig(16, 3)), entry(b, TileConfig(32, 3))])
    assert select_tiles(a) == TileConfig(16, 3)
    path.unlink()  # the parsed table stays: the second bucket still finds it
    assert describe_selection(b) == (TileConfig(32, 3), str(path))
    tuning.clear_cache()
    assert describe_selection(b) == (heuristic(b, 132), "heuristic (untuned)")


def test_model_name():
    assert tuning.model_name("NVIDIA H200") == "NVIDIA-H200"
    assert tuning.model_name("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert tuning.model_name("NVIDIA GH200 480GB") == "NVIDIA-GH200-480GB"


def test_file_name_follows_the_device_name(dirs, monkeypatch):
    user, _ = dirs
    monkeypatch.setattr(tuning, "device_facts", lambda: (1, "NVIDIA H100 80GB HBM3", 132))
    p = problem()
    path = write(user / "NVIDIA-H100-80GB-HBM3.yaml", [entry(p, TileConfig(16, 2))], gpu="NVIDIA H100 80GB HBM3")
    assert describe_selection(p) == (TileConfig(16, 2), str(path))


def test_cpu_problems_use_the_heuristic_without_device_facts(dirs, monkeypatch):
    user, _ = dirs
    p = problem(device=False)
    write(user / "NVIDIA-H200.yaml", [entry(p, TileConfig(16, 3))])

    def boom():
        raise AssertionError("device facts asked for a CPU problem")

    monkeypatch.setattr(tuning, "device_facts", boom)
    assert describe_selection(p) == (heuristic(p, tuning.DEFAULT_SM_COUNT), "heuristic (untuned)")


def test_tuning_module_does_not_import_cupy_at_import_time():
    tree = ast.parse(Path(tuning.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top for a in n.names} | {n.module for n in top if isinstance(n, ast.ImportFrom)}
    assert not any(str(x).startswith("cupy") for x in names)


# ---------------------------------------------------------------------------
# buckets


@pytest.mark.parametrize("rows,cls", [(1, "<0.25"), (32, "<0.25"), (33, "<0.5"), (65, "<0.5"), (66, "<1"),
                                      (131, "<1"), (132, "<2"), (263, "<2"), (264, ">=2"), (10000, ">=2")])
def test_parallelism_classes(rows, cls):
    p = problem(N=rows, B=rows)
    assert bucket_of(p, 132)["parallelism"] == cls
    assert bucket_of(dataclasses.replace(p, N=1, HV=rows), 132)["parallelism"] == cls  # N * HV


@pytest.mark.parametrize("T,cls", [(0, "<=1024"), (1024, "<=1024"), (1025, "<=8192"), (8192, "<=8192"),
                                   (8193, ">8192"), (65536, ">8192")])
def test_length_classes_fixed(T, cls):
    assert bucket_of(problem(T=T), 132)["seqlen"] == cls


def test_length_classes_varlen_use_mean_length_from_shapes():
    p = problem(lens=[5, 0, 7])
    assert p.varlen and p.N == 3
    assert bucket_of(dataclasses.replace(p, T=3 * 1024), 132)["seqlen"] == "<=1024"
    assert bucket_of(dataclasses.replace(p, T=3 * 1024 + 3), 132)["seqlen"] == "<=8192"
    assert bucket_of(dataclasses.replace(p, T=3 * 8193), 132)["seqlen"] == ">8192"


def test_bucket_fields_and_fixed_vs_varlen():
    fixed, var = problem(T=20), problem(lens=[12, 8])
    assert bucket_of(fixed, 132) == dict(K=64, V=64, dtype="bfloat16", state_precision="bf16", varlen=False,
                                         parallelism="<0.25", seqlen="<=1024")
    assert bucket_of(var, 132)["varlen"] is True
    assert bucket_of(problem(state_precision="fp32"), 132)["state_precision"] == "fp32"
    assert bucket_of(problem(K=128, V=64), 132)["K"] == 128


def test_the_documented_kimi_buckets():
    """The table in tuning/README.md (132 SMs)."""
    got = {(H, kind): bucket_of(kimi(H, kind), 132) for H in (96, 64) for kind in ("fixed", "varlen6", "varlen8")}
    assert {k: (b["varlen"], b["parallelism"], b["seqlen"]) for k, b in got.items()} == {
        (96, "fixed"): (False, "<1", "<=8192"), (64, "fixed"): (False, "<0.5", "<=8192"),
        (96, "varlen6"): (True, ">=2", "<=8192"), (64, "varlen6"): (True, ">=2", "<=8192"),
        (96, "varlen8"): (True, ">=2", "<=1024"), (64, "varlen8"): (True, ">=2", "<=1024")}


def test_exact_match_only(dirs):
    user, _ = dirs
    p = problem(T=8192, K=128, V=128)
    path = write(user / "NVIDIA-H200.yaml", [entry(p, TileConfig(16, 3))])
    assert describe_selection(p)[1] == str(path)
    for q in (dataclasses.replace(p, T=8193), dataclasses.replace(p, HV=40), problem(T=8192, K=128, V=64),
              problem(T=8192, K=128, V=128, state_precision="fp32")):
        assert describe_selection(q)[1] == "heuristic (untuned)"


# ---------------------------------------------------------------------------
# heuristic


def test_heuristic_documented_choices():
    """Largest BV in (128, 64, 32) with N * HV * V / BV >= 2 * SMs, else 32; 2 stages."""
    assert heuristic(kimi(96, "fixed"), 132) == TileConfig(32, 2)  # 96 x 4 = 384 CTAs
    assert heuristic(kimi(64, "fixed"), 132) == TileConfig(32, 2)  # 256 < 264: still the smallest
    assert heuristic(kimi(96, "varlen6"), 132) == TileConfig(128, 2)  # 576 rows
    assert heuristic(kimi(64, "varlen6"), 132) == TileConfig(128, 2)  # 384 rows
    assert heuristic(kimi(64, "varlen8"), 132) == TileConfig(128, 2)  # 512 rows
    mid = problem(K=128, V=128, N=200, B=200)
    assert heuristic(mid, 132) == TileConfig(64, 2)  # 200 < 264 <= 400
    few = problem(K=128, V=128, T=65536, H=12, HV=12)
    assert heuristic(few, 132) == TileConfig(32, 2)
    small_v = problem(V=64, N=1000, B=1000)
    assert heuristic(small_v, 132) == TileConfig(64, 2)  # BV never exceeds V
    assert heuristic(problem(V=64), 132) == TileConfig(32, 2)
    for p in (kimi(96, "fixed"), mid, small_v):
        c = heuristic(p, 132)
        assert c in TILE_SPACE and c.BV <= p.V and c.stages == 2


@pytest.mark.parametrize("V", [64, 128, 256])
def test_heuristic_depends_only_on_the_bucket(V):
    """Its thresholds (CTAs >= 2 x SMs) fall on the parallelism class bounds, so
    one bucket gets one heuristic choice: a tuned file replaces it bucket for bucket."""
    seen, base = {}, problem(K=128, V=V)
    for rows in range(1, 700):
        p = dataclasses.replace(base, N=rows, B=rows)
        seen.setdefault(tuning.bucket_key(bucket_of(p, 132)), set()).add(heuristic(p, 132))
    assert all(len(v) == 1 for v in seen.values()), seen
    assert len(seen) == 5


def test_describe_selection_source_for_the_heuristic(dirs):
    for p in (kimi(96, "fixed"), kimi(64, "varlen8"), problem(T=40)):
        assert describe_selection(p) == (heuristic(p, 132), "heuristic (untuned)")


def test_candidates_respect_V():
    assert tuning.candidates(64) == [t for t in TILE_SPACE if t.BV <= 64] and len(tuning.candidates(64)) == 6
    assert len(tuning.candidates(128)) == 8 and len(tuning.candidates(256)) == 8
    assert all(np.isin([t.stages for t in TILE_SPACE], [2, 3]))


# ---------------------------------------------------------------------------
# the MMA family (mma: sync | wgmma)


def test_heuristic_on_sm_90a_picks_wgmma_for_the_forward():
    """sm_90a: wgmma where it serves (K <= 128, V >= 64), BV = 128 from half a CTA per SM on,
    else 64, 3 stages; other targets and the other callers (arch None) keep mma.sync."""
    w = lambda bv: TileConfig(bv, 3, "wgmma")  # noqa: E731
    assert heuristic(kimi(96, "fixed"), 132, "sm_90a") == w(128)  # 96 CTAs >= 66
    assert heuristic(kimi(64, "fixed"), 132, "sm_90a") == w(64)  # 64 < 66
    assert heuristic(kimi(96, "varlen6"), 132, "sm_90a") == w(128)
    assert heuristic(problem(K=128, V=128, T=65536, H=12, HV=12), 132, "sm_90a") == w(64)
    assert heuristic(problem(V=64, N=1000, B=1000), 132, "sm_90a") == w(64)  # BV never exceeds V
    k256 = problem(K=256, V=128)
    assert heuristic(k256, 132, "sm_90a") == heuristic(k256, 132) and heuristic(k256, 132).mma == "sync"
    for arch in ("sm_80", None):
        assert heuristic(kimi(96, "fixed"), 132, arch) == TileConfig(32, 2)


@pytest.mark.parametrize("V", [64, 128, 256])
def test_the_sm_90a_heuristic_depends_only_on_the_bucket(V):
    seen, base = {}, problem(K=128, V=V)
    for rows in range(1, 700):
        p = dataclasses.replace(base, N=rows, B=rows)
        seen.setdefault(tuning.bucket_key(bucket_of(p, 132)), set()).add(heuristic(p, 132, "sm_90a"))
    assert all(len(v) == 1 for v in seen.values()), seen
    seen = {}
    for rows in range(1, 700):  # and sm_100a's, on its 148 SMs
        p = dataclasses.replace(base, N=rows, B=rows)
        seen.setdefault(tuning.bucket_key(bucket_of(p, 148)), set()).add(heuristic(p, 148, "sm_100a"))
    assert all(len(v) == 1 for v in seen.values()), seen


def test_candidates_on_sm_90a_add_the_wgmma_ones():
    assert tuning.candidates(128, "sm_90a", 128) == tuning.candidates(128) + list(tuning.WGMMA_SPACE)
    assert tuning.candidates(64, "sm_90a") == tuning.candidates(64) + [TileConfig(64, 2, "wgmma"),
                                                                       TileConfig(64, 3, "wgmma")]
    assert tuning.candidates(128, "sm_90a", 256) == tuning.candidates(128, "sm_80", 128) == tuning.candidates(128)
    with pytest.raises(ValueError, match="wgmma"):
        TileConfig(32, 2, "wgmma")
    with pytest.raises(ValueError, match="mma"):
        TileConfig(32, 2, "tcgen05")
    assert tuning.candidates(128, "sm_100a", 128) == tuning.candidates(128) + list(tuning.TCGEN05_SPACE)
    assert tuning.candidates(128, "sm_100a", 256) == tuning.candidates(128)


def test_a_wgmma_entry_round_trips_and_bad_ones_are_refused(tmp_path):
    p = problem(K=128, V=128)
    text = tuning.dump_table(H200, 132, 13000, "0.1.0", "2025-01-31",
                             [entry(p, TileConfig(64, 3, "wgmma"), runner_up=TileConfig(32, 2))])
    assert "mma: wgmma" in text and text.count("mma:") == 1  # mma.sync configs are written as before
    table = tuning.parse_table(yaml.safe_load(text))
    (e,) = table.entries.values()
    assert e.config == TileConfig(64, 3, "wgmma") and e.runner_up[0] == TileConfig(32, 2)
    for bad, why in [({"mma": "hmma"}, "mma must be"), ({"mma": "wgmma", "BV": 32}, "tile space"),
                     ({"mma": "wgmma", "stages": 1}, "tile space"), ({"mma": "tcgen05", "BV": 32}, "tile space")]:
        doc = yaml.safe_load(text)
        doc["buckets"][0]["config"].update(bad)
        with pytest.raises(tuning.TuningFileError, match=why):
            tuning.parse_table(doc)
    doc = yaml.safe_load(text)
    doc["buckets"][0]["match"]["K"] = 256
    with pytest.raises(tuning.TuningFileError, match="K <= 128"):
        tuning.parse_table(doc)


def test_only_the_forward_gets_wgmma_from_a_file_or_the_heuristic(dirs, monkeypatch):
    import kdacupy.ops.forward.kernels as kernels

    user, _ = dirs
    monkeypatch.setattr(tuning, "device_arch", lambda: "sm_90a")
    p, q = kimi(96, "fixed"), kimi(64, "fixed")
    assert kernels.select_tiles(p) == TileConfig(128, 3, "wgmma")  # the forward: the sm_90a heuristic
    assert select_tiles(p) == TileConfig(32, 2)  # the other callers: mma.sync's
    write(user / "NVIDIA-H200.yaml", [entry(q, TileConfig(128, 2, "wgmma"))])
    tuning.clear_cache()
    assert kernels.select_tiles(q) == TileConfig(128, 2, "wgmma")
    assert select_tiles(q) == TileConfig(128, 2)  # the file's BV and stages on mma.sync


def test_only_the_forward_gets_tcgen05_on_sm_100a(dirs, monkeypatch):
    """sm_100a: the forward's heuristic runs tcgen05 at mma.sync's tiles (here on the fixture's 132 SMs: BV =
    128 at H = 96, 64 at H = 64), a file's tcgen05 tile too; the other callers get mma.sync at the same BV."""
    import kdacupy.ops.forward.kernels as kernels

    user, _ = dirs
    monkeypatch.setattr(tuning, "device_arch", lambda: "sm_100a")
    p, q = kimi(96, "fixed"), kimi(64, "fixed")
    assert kernels.select_tiles(p) == TileConfig(128, 3, "tcgen05")
    assert kernels.select_tiles(q) == TileConfig(64, 3, "tcgen05")
    assert select_tiles(p) == TileConfig(32, 2)  # the other callers: mma.sync's rule
    write(user / "NVIDIA-H200.yaml", [entry(q, TileConfig(128, 2, "tcgen05"))])
    tuning.clear_cache()
    assert kernels.select_tiles(q) == TileConfig(128, 2, "tcgen05")
    assert select_tiles(q) == TileConfig(128, 2)  # the file's BV and stages on mma.sync


def test_a_files_wgmma_tile_on_a_problem_its_variants_cannot_take_runs_on_mma_sync_and_says_so(dirs):
    """A bucket holds its tile's sizes and every size that runs on them: a wgmma tile tuned for
    K = V = 128 is handed to K = 96 (the any-size variants, mma.sync only); it runs there on mma.sync at
    its BV and stages, and the source says why, where K = V = 128 keeps wgmma."""
    user, _ = dirs
    exact, odd = problem(K=128, V=128), problem(K=96, V=100)
    assert bucket_of(exact, 132) == bucket_of(odd, 132)
    path = write(user / "NVIDIA-H200.yaml", [entry(exact, TileConfig(128, 3, "wgmma"))])
    assert describe_selection(exact, wgmma=True) == (TileConfig(128, 3, "wgmma"), str(path))
    tiles, source = describe_selection(odd, wgmma=True)
    assert tiles == TileConfig(128, 3) and source == f"{path} (its wgmma tile on mma.sync: K=96, V=100 run the " \
                                                     f"variants of mma.sync)"
    assert describe_selection(exact) == (TileConfig(128, 3), str(path))  # a caller without wgmma


def test_a_tile_the_recurrence_cannot_run_is_refused_before_any_build(monkeypatch):
    """BV wider than the value dim its variant is built for: refused naming the tiles, the problem and
    why (the kernel's static_assert would otherwise fail the build); the same tile on a problem that
    holds it runs, bit for bit the model."""
    import kdacupy
    from kdacupy.ops.forward import kernels
    from kdacupy.ops.forward.kernels import unfit
    assert unfit(problem(V=64), TileConfig(128, 2)) and not unfit(problem(V=100), TileConfig(128, 2))
    assert unfit(problem(V=64), TileConfig(128, 3, "wgmma"))
    x, opts = make_inputs(T=20, H=1, K=64, V=64)
    monkeypatch.setattr(kernels, "select_tiles", lambda p: TileConfig(128, 2))
    built = []
    for name in ("recurrence_variant", "launch_prepare"):
        monkeypatch.setattr(kernels, name, lambda *a, **k: built.append(a) or pytest.fail("built"))
    with pytest.raises(ValueError, match=r"^tiles: TileConfig\(BV=128, stages=2, mma='sync'\) cannot run the "
                                         r"recurrence of K=64, V=64: BV=128 must divide the value dim of its "
                                         r"variant, 64 \(V=64\)"):
        kdacupy.kda_forward(**x, **opts, backend="emulate")
    assert not built


@pytest.mark.parametrize("H, BV", [(12, 64), (64, 64), (73, 64), (74, 128), (96, 128)])
def test_sm100a_forward_fills_the_sms_once(H, BV):
    """sm_100a's forward: BV = 64 while N * HV * V / 64 CTAs are fewer than 148 SMs, else one CTA a chain
    (BV = 128), on tcgen05 where it serves (K <= 128), mma.sync at K = 256; three stages. sm_80 keeps the
    rule of two CTAs an SM; off the tiles, the same."""
    p = kimi(H, "fixed")
    assert heuristic(p, 148, "sm_100a") == TileConfig(BV, 3, "tcgen05")
    wide = problem(K=256, V=128, T=8192, H=H, HV=H)
    assert heuristic(wide, 148, "sm_100a") == TileConfig(BV, 3)  # K = 256: mma.sync
    assert heuristic(p, 148, "sm_80") == heuristic(p, 148) and heuristic(p, 148).stages == 2
    assert heuristic(problem(K=64, V=64, T=8192, H=512, HV=512), 148, "sm_100a") == TileConfig(64, 3, "tcgen05")  # BV <= V
    off = problem(K=60, V=100, T=8192, H=64, HV=64)
    assert heuristic(off, 148, "sm_100a") == heuristic(off, 148)
