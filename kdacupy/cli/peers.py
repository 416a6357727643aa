"""FLA's ``chunk_kda`` as a peer for ``python -m kdacupy.bench``: the call on
kdacupy's inputs, agreement with kdacupy's outputs, and its timing. torch and
fla are imported inside the functions."""
from __future__ import annotations

import importlib.util
import inspect
import os

import numpy as np

from . import timing
from ..numerics.dtypes import BF16


def fla_importable() -> str | None:
    """None when torch and fla can be imported, else why not."""
    for mod in ("torch", "fla"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
    return None


def to_torch(x):
    """A CuPy array as a torch tensor, zero-copy through DLPack (bf16 through
    its bits, so it does not depend on DLPack's bfloat16 support)."""
    import torch

    if x.dtype == BF16:
        import cupy

        return torch.from_dlpack(x.view(cupy.int16)).view(torch.bfloat16)
    return torch.from_dlpack(x)


def signature_params(fn) -> set:
    try:
        return set(inspect.signature(fn).parameters)  # follows functools.wraps (FLA's decorators)
    except (TypeError, ValueError):
        return set()


def layout_keyword(params) -> str | None:
    """chunk_kda's keyword for the [V, K] state layout: ``state_v_first``, else
    the older ``transpose_state_layout``, else None (FLA's [K, V] default). Only
    a named parameter counts: chunk_kda takes **kwargs, where an unknown keyword
    would vanish silently."""
    return next((k for k in ("state_v_first", "transpose_state_layout") if k in params), None)


class FLA:
    """FLA's ``chunk_kda`` on kdacupy's inputs.

    The call follows fla/ops/kda/chunk.py in fla-org/flash-linear-attention
    (``chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state,
    use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
    allow_neg_eigval, safe_gate, lower_bound, ..., state_v_first, cu_seqlens,
    cu_seqlens_cpu, ..., **kwargs)`` with ``A_log`` and ``dt_bias`` ([HV * K])
    read from kwargs; it asserts ``initial_state.dtype == torch.float32``;
    ``transpose_state_layout`` is the older, now deprecated, name of
    ``state_v_first``). Which of the two layout keywords exists is read from
    the installed signature; with neither, FLA gets the state in its default
    [K, V] layout. ``FLA_FLASH_KDA=0`` is set before fla is imported, so the
    dispatcher (fla/ops/backends/__init__.py) skips the FlashKDA backend
    (fla/ops/kda/backends/flashkda.py) and FLA's own Triton kernels run.
    """

    def __init__(self):
        os.environ["FLA_FLASH_KDA"] = "0"
        import fla
        import torch
        from fla.ops.kda import chunk_kda

        self.torch, self.fn = torch, chunk_kda
        self.version = getattr(fla, "__version__", "unknown")
        self.params = signature_params(chunk_kda)
        self.layout_kw = layout_keyword(self.params)

    def kwargs(self, arrays, options, state_dtype):
        torch = self.torch
        h0 = to_torch(options["initial_state"])  # [N, HV, V, K] bf16
        if self.layout_kw is None:
            h0 = h0.transpose(-1, -2)  # FLA's default [N, HV, K, V]
        kw = dict(q=to_torch(arrays["q"]), k=to_torch(arrays["k"]), v=to_torch(arrays["v"]),
                  g=to_torch(arrays["g"]), beta=to_torch(arrays["beta"]), scale=arrays["q"].shape[-1] ** -0.5,
                  initial_state=h0.to(state_dtype).contiguous(), output_final_state=True,
                  use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  safe_gate=True, lower_bound=options["lower_bound"], A_log=to_torch(options["A_log"]),
                  dt_bias=to_torch(options["dt_bias"]).reshape(-1))
        if self.layout_kw is not None:
            kw[self.layout_kw] = True
        cu = options.get("cu_seqlens")
        if cu is not None:
            kw["cu_seqlens"] = to_torch(cu).to(torch.long)
            if "cu_seqlens_cpu" in self.params:  # spares FLA a device-to-host copy per call
                import cupy

                kw["cu_seqlens_cpu"] = torch.from_numpy(cupy.asnumpy(cu).astype(np.int64))
        return kw

    def call(self, kw):
        with self.torch.inference_mode():
            return self.fn(**kw)

    def backend(self, kw) -> str:
        """Which backend FLA's dispatcher picks for this call (best effort)."""
        try:
            from fla.ops.backends import BackendRegistry

            BackendRegistry.ensure_initialized("kda")
            reg = BackendRegistry._registries.get("kda")
            with self.torch.inference_mode():
                for be in (reg._backends.values() if reg is not None else ()):
                    if be.can_use() and be.verify("chunk_kda", **kw)[0] and hasattr(be, "chunk_kda"):
                        return be.backend_type
            return "triton (chunk_kda default)"
        except Exception as e:  # noqa: BLE001
            return f"unknown ({type(e).__name__})"

    def final_state_vk(self, s):
        """FLA's final state as [N, HV, V, K]."""
        return s if self.layout_kw is not None else s.transpose(-1, -2)


def rms_ratio_torch(x, ref) -> float:
    x, ref = x.float(), ref.float()
    return float((x - ref).norm() / ref.norm())


def run_fla(fla: FLA, sets, o, s, warmup, iters) -> dict:
    """FLA on the same input sets: agreement with kdacupy's (o, s), then timing."""
    res = dict(version=fla.version, layout_keyword=fla.layout_kw, inference_mode=True)
    kw = None
    for state_dtype in (fla.torch.bfloat16, fla.torch.float32):
        kw = fla.kwargs(*sets[0], state_dtype)
        try:
            fo, fs = fla.call(kw)[:2]
            res["state_dtype"] = str(state_dtype).replace("torch.", "")
            break
        except Exception as e:  # noqa: BLE001
            if state_dtype == fla.torch.float32:
                raise
            res["bf16_state_rejected"] = f"{type(e).__name__}: {e}"[:300]
    res["backend"] = fla.backend(kw)
    res["rms_ratio_o"] = rms_ratio_torch(to_torch(o), fo)
    res["rms_ratio_state"] = rms_ratio_torch(to_torch(s), fla.final_state_vk(fs))
    kws = [kw] + [fla.kwargs(a, opt, kw["initial_state"].dtype) for a, opt in sets[1:]]
    res["median_ms"], res["min_ms"] = timing.time_calls([lambda k=k: fla.call(k) for k in kws], warmup, iters, "torch")
    return res
