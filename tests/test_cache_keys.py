"""Every cache of calls keys on everything its result depends on, declared once and held here:

- the decode fast path (kdacupy/ops/decode/fastpath.py): kda_decode's ``arrays`` and ``options``
  are its parameters, in the declared order (kdacupy.decode.ARRAY_NAMES, OPTION_NAMES); and, field by
  field, a call that differs from a cached one in one option gets the uncached result;
- the torch face's decode cache and the faces' engine-call keys (``front_key``): every parameter of
  the call but the declared exclusions is in its key;
- context parallelism's call signature (kdacupy/distributed/call.py): every field of the Problem
  the ranks specialise on, but the declared exclusions;
- the cubin cache: the arch, NVRTC's version and options, and the rendered source (headers inlined);
- the emulation's builds: every header the emulation includes is in the key's file list.
A missing field would let two calls that differ only there share an entry."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import kdacupy
from kdacupy import decode

ROOT = Path(__file__).resolve().parents[1]


def _function(module_path, name):
    tree = ast.parse((ROOT / module_path).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _params(fn_node):
    a = fn_node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return set(names)


def _tuple_names(node):
    return [e.id for e in node.elts]


def _assigned(fn_node, var):
    return next(n.value for n in ast.walk(fn_node) if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == var for t in n.targets))


def _names_in(node, fn_node, depth=2):
    """The names a key expression reads, through the local variables it is built from."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
            if depth:
                try:
                    out |= _names_in(_assigned(fn_node, n.id), fn_node, depth - 1)
                except StopIteration:
                    pass
    return out


def _call(fn_node, callee):
    return next(n for n in ast.walk(fn_node) if isinstance(n, ast.Call)
                and (getattr(n.func, "id", None) == callee or getattr(n.func, "attr", None) == callee))


# ---------------------------------------------------------------------------
# declarations


def test_kda_decodes_fast_path_key_is_every_parameter_in_the_declared_order():
    fn = _function("kdacupy/decode.py", "kda_decode")
    assert _tuple_names(_assigned(fn, "arrays")) == list(decode.ARRAY_NAMES)
    assert _tuple_names(_assigned(fn, "options")) == list(decode.OPTION_NAMES)
    assert _params(fn) == set(decode.ARRAY_NAMES) | set(decode.OPTION_NAMES)
    assert list(inspect.signature(kdacupy.kda_decode).parameters)[-1] == "unknown"  # refused, not keyed


#: (module, function, the key's call, parameters the result does not depend on, and why)
FRONT_KEYS = [
    ("kdacupy/torch/api.py", "kda_decode", "front_key", {"unknown": "refused"}),
    ("kdacupy/compat/fla.py", "fused_recurrent_kda_fwd", "front_key",
     {"out": "written from the result", "kwargs": "refused", "inplace_final_state": "the key is made only with it"}),
    ("kdacupy/compat/vllm.py", "fused_recurrent_kda_fwd", "_front", {"out": "written from the result"}),
    ("kdacupy/compat/vllm.py", "fused_recurrent_kda", "_front", {"out": "written from the result", "kwargs": "refused"}),
    ("kdacupy/compat/sglang.py", "fused_sigmoid_gating_delta_rule_update", "front_key",
     {"disable_state_update": "the key is made only without it", "intermediate_states_buffer": "likewise",
      "intermediate_state_indices": "likewise", "cache_steps": "likewise", "retrieve_parent_token": "likewise"}),
]


@pytest.mark.parametrize("path,name,callee,excluded", FRONT_KEYS, ids=[f"{p}:{n}" for p, n, _, _ in FRONT_KEYS])
def test_an_engine_calls_key_holds_every_parameter(path, name, callee, excluded):
    fn = _function(path, name)
    keyed = _names_in(_call(fn, callee), fn)
    missing = _params(fn) - keyed - set(excluded) - {"unknown", "kwargs"}
    assert not missing, f"{path}:{name}: parameters not in its key: {sorted(missing)}"
    if callee == "_front":  # vLLM's helper: its front_key call takes every one of its own parameters
        helper = _function(path, "_front")
        assert _params(helper) - _names_in(_call(helper, "front_key"), helper) == set()


def test_the_torch_decode_caches_key_holds_every_parameter():
    """kdacupy.torch.kda_decode's cached(): the tensors it passes and every option in ``opts``."""
    fn = _function("kdacupy/torch/api.py", "kda_decode")
    opts = {k.arg for k in _assigned(fn, "opts").keywords}
    repeated = _call(fn, "repeated")
    keyed = opts | {n.id for n in repeated.args if isinstance(n, ast.Name)}
    assert _params(fn) - keyed - {"unknown"} == set(), sorted(_params(fn) - keyed)


#: Problem fields context parallelism's signature does not compare, and why
CP_NOT_COMPARED = {"T": "each rank's slice has its own length", "N": "from cu_seqlens, which is compared",
                   "varlen": "from cu_seqlens, which is compared",
                   "state_in_dtype": "initial_state's shape and dtype are compared",
                   "state_out_dtype": "compared with output_final_state (self.state_out)"}


def test_the_context_parallel_signature_holds_every_problem_field():
    from kdacupy.validation.problem import Problem
    fn = _function("kdacupy/distributed/call.py", "signature")
    read = {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "p"}
    fields = {f.name for f in dataclasses.fields(Problem)}
    assert fields - read == set(CP_NOT_COMPARED), sorted(fields - read)


def test_the_cubin_key_holds_the_arch_the_compiler_and_its_options():
    from kdacupy.jit import cubin_cache
    from kdacupy.jit.render import render
    src = render("kda_decode", {})
    keys = {cubin_cache.key(src, arch) for arch in ("sm_80", "sm_90a", "sm_100a")}
    assert len(keys) == 3
    assert cubin_cache.key(src + "\n", "sm_90a") != cubin_cache.key(src, "sm_90a")
    assert '#include "' not in src  # the headers' text is in the source, so in the key
    body = inspect.getsource(cubin_cache.key)
    for part in ("nvrtc_version()", "arch", "NVRTC_OPTIONS", "CUPY_ADDED_OPTIONS", "source"):
        assert part in body, part


def test_the_nvrtc_report_cache_keys_every_input_of_a_build(tmp_path, monkeypatch):
    """NVRTC's cached builds (the compile report, the SASS, the runtime's cubins): the same source, target and
    options read the file back, identical; another target, option or source compiles apart."""
    pytest.importorskip("cuda.pathfinder", reason="NVRTC (pip's nvidia-cuda-nvrtc) is not installed")
    from kdacupy.jit import nvrtc
    from kdacupy.jit.render import render
    monkeypatch.setenv("KDACUPY_CACHE_DIR", str(tmp_path))
    src = render("kda_bwd_reduce", {"KDA_K": 64})
    first = nvrtc.nvrtc_compile(src, "sm_80")
    assert first.ok and len(list((tmp_path / "nvrtc").iterdir())) == 1
    again = nvrtc.nvrtc_compile(src, "sm_80")
    assert (again.cubin, again.log, again.regs, again.spill_stores, again.static_smem) == (
        first.cubin, first.log, first.regs, first.spill_stores, first.static_smem)
    nvrtc.nvrtc_compile(src, "sm_90a")
    nvrtc.nvrtc_compile(src, "sm_80", ("-lineinfo",))
    nvrtc.nvrtc_compile(src + "\n", "sm_80")
    assert len(list((tmp_path / "nvrtc").iterdir())) == 4
    body = inspect.getsource(nvrtc.nvrtc_compile)
    for part in ("nvrtc_version()", "opts", "source"):
        assert part in body, part
    bad = nvrtc.nvrtc_compile(src.replace("extern", "extern_typo", 1), "sm_80")  # failures are not kept
    assert not bad.ok and len(list((tmp_path / "nvrtc").iterdir())) == 4


def test_the_emulation_build_key_holds_every_header_it_includes():
    from kdacupy.emulate import build
    here = ROOT / "kdacupy" / "emulate"
    listed = set(build.HEADERS) | set(build.CHECK_FILES)
    files = {p.name for p in here.iterdir() if p.suffix in (".h", ".cpp")}
    assert files <= listed, f"emulation files not in the build key: {sorted(files - listed)}"
    included = {m for p in here.glob("*.h") for m in re.findall(r'#include "([^"]+)"', p.read_text())}
    assert included <= listed


def test_converted_parameter_dtypes_are_declared_once():
    """The gate parameters converted to float32 (and so keyed by version in the decode cache): one
    tuple that every place that converts or keys them reads, no dtype list of their own."""
    for f in ("api.py", "eager.py", "decode_cache.py", "states.py"):
        text = (ROOT / "kdacupy" / "torch" / f).read_text()
        assert "CONVERTED_PARAM_DTYPES" in text and "torch.float16" not in text, f


# ---------------------------------------------------------------------------
# field by field: a call differing from a cached one in one option gets the uncached result


def _decode_call(**change):
    from tests.decode_inputs import make_decode
    x, opts, pool = make_decode(N=2, T=1, H=1, K=64, V=64, seed=3, gate="sigmoid")
    opts.update(change.pop("opts", {}))
    kw = dict(x, **opts, state_pool=pool, backend="emulate")
    kw.update(change)
    return kw


CHANGES = {
    "scale": dict(scale=0.3),
    "qk_l2norm": dict(qk_l2norm=False),
    "beta_sigmoid": dict(beta_sigmoid=False),
    "lower_bound": dict(lower_bound=-2.0),
    "state_layout": dict(state_layout="kv"),
    "update_pool": dict(update_pool=False),
    "null_slot": dict(null_slot=1),
    "state_indices": dict(state_indices=np.array([3, 1], np.int32)),
}


@pytest.mark.emulate
@pytest.mark.parametrize("field", CHANGES)
def test_a_call_differing_in_one_field_gets_the_uncached_result(field):
    from kdacupy.ops.decode import fastpath
    fastpath.clear()
    base = _decode_call()
    kdacupy.kda_decode(**base)  # cached now
    kdacupy.kda_decode(**_decode_call())  # and hit
    changed = _decode_call(**CHANGES[field])
    got_pool = changed["state_pool"]
    got = kdacupy.kda_decode(**changed)
    fastpath.clear()
    fresh = _decode_call(**CHANGES[field])
    want = kdacupy.kda_decode(**fresh)
    assert np.array_equal(got.view(np.uint16) if got.dtype.itemsize == 2 else got, want.view(np.uint16)
                          if want.dtype.itemsize == 2 else want)
    assert np.array_equal(got_pool, fresh["state_pool"])


#: options the field test does not change, and why (each still in the key: the declaration test)
NOT_CHANGED = {"backend": "one backend per test", "allow_neg_eigval": "another kernel variant (the gate's build)",
               "gate": "another kernel variant"}


def test_every_option_of_kda_decode_is_changed_by_a_field_test_or_said_why_not():
    assert set(decode.OPTION_NAMES) == (set(CHANGES) & set(decode.OPTION_NAMES)) | set(NOT_CHANGED)
