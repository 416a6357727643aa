"""The input options a kernel that reads q, k, g and beta is compiled for (kda_prepare,
kda_bwd_chunk, kda_decode): q/k/v's dtype, g's, beta's, the gate, beta's mode and q/k l2norm.

One place reads them from a validated problem, renders their ``#define``s and their label, and
enumerates every combination the library builds, so the three kernels' variants agree.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..jit.enums import BETA_CODE, DTYPE_CODE, GATE_CODE
from ..numerics.dtypes import BF16, F16, F32, dtype_name

#: the dtypes of q, k and v the kernels are built for
DTYPES = (BF16, F16, F32)


def input_options(p) -> tuple:
    """(dtype, g_dtype, beta_dtype, gate, beta_mode, l2norm) of a validated problem; beta's dtype
    is any valid one (q's) when beta_mode == "none"."""
    return p.dtype, p.g_dtype, p.beta_dtype or p.dtype, p.gate, p.beta_mode, p.qk_l2norm


def input_config(var) -> dict:
    """The ``#define``s of a variant's input options."""
    return dict(KDA_DT=DTYPE_CODE[var.dtype], KDA_G_DT=DTYPE_CODE[var.g_dtype],
                KDA_BETA_DT=DTYPE_CODE[var.beta_dtype], KDA_GATE=GATE_CODE[var.gate],
                KDA_BETA_MODE=BETA_CODE[var.beta_mode], KDA_L2NORM=int(var.l2norm))


def input_label(var) -> str:
    return (f"dt={dtype_name(var.dtype)} g={dtype_name(var.g_dtype)} "
            f"beta={var.beta_mode}:{dtype_name(var.beta_dtype)} gate={var.gate} l2norm={int(var.l2norm)}")


@dataclass(frozen=True)
class InputVariant:
    """A kernel of head dim K compiled for one set of input options; a subclass names its
    ``kernel`` and adds its layout's ``#define``s (``layout_config``)."""
    kernel: ClassVar[str]
    K: int
    dtype: np.dtype
    g_dtype: np.dtype
    beta_dtype: np.dtype  # any valid dtype when beta_mode == "none"
    gate: str
    beta_mode: str
    l2norm: bool

    def config(self) -> dict:
        return dict(KDA_K=self.K, **input_config(self), **self.layout_config())

    def layout_config(self) -> dict:
        raise NotImplementedError

    def label(self) -> str:
        return f"{self.kernel} K={self.K} {input_label(self)}"


def input_option_space(dtypes=DTYPES):
    """Every (dtype, g_dtype, beta_dtype, gate, beta_mode, l2norm) the library builds: g and beta
    in q's dtype or fp32 (beta in q's alone when there is none)."""
    for dt, gate, l2 in itertools.product(dtypes, GATE_CODE, (False, True)):
        for gdt in dict.fromkeys((dt, F32)):
            for beta_mode in BETA_CODE:
                for bdt in ((dt,) if beta_mode == "none" else dict.fromkeys((dt, F32))):
                    yield dt, gdt, bdt, gate, beta_mode, l2
