"""Compile reports for the budget tests, made once per test run and in parallel.

Every (kernel source, arch) pair a budget test needs is compiled once, by the
first test that asks: it compiles its module's list at once on all CPUs
(NVRTC releases the GIL inside its ctypes calls, nvdisasm is a subprocess), so
on two cores the budgets cost half the wall time they cost one after the other.
The list holds only the pairs of the points this run selects (``running``): the
default run's sample of each matrix (tests/sweeps.py), every point with --sweeps.

The SASS mix (nvdisasm, ~0.35 s a cubin on top of a ~0.55 s compile) is taken
on ``SASS_ARCH`` for every variant and on the other arches for the first
variant of each kernel only: the counts the tests hold (HMMA, LDSM per chunk;
LDL/STL zero) come from the source's loop structure and measure the same on
sm_80, sm_90a and sm_100a (``python -m kdacupy.compile --sass``), while the
register and spill report, which does differ by arch, is checked on every arch.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from kdacupy.jit.nvrtc import ARCHS, compile_variant, nvrtc_compile

from ..sweeps import kept

try:
    from cuda.pathfinder import find_nvidia_binary_utility
    HAVE_NVDISASM = find_nvidia_binary_utility("nvdisasm") is not None
except Exception:  # noqa: BLE001
    HAVE_NVDISASM = False

#: the arch whose binaries are disassembled for every variant (Hopper: the tuned target)
SASS_ARCH = "sm_90a"

_done: dict = {}


class Source:
    """A rendered kernel that is not a registered variant (the scan kernel), compiled as it is."""

    def __init__(self, label: str, source: str):
        self._label, self.source = label, source

    def label(self) -> str:
        return self._label


def _compile(job):
    var, arch, sass = job
    if isinstance(var, Source):
        return nvrtc_compile(var.source, arch)
    return compile_variant(var, arch, sass=sass)


def compile_all(jobs) -> None:
    """Compile every ``(variant, arch, sass)`` not compiled yet, in parallel."""
    todo = [(v, a, s and HAVE_NVDISASM) for v, a, s in jobs if (v.label(), a) not in _done]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for (v, a, _), res in zip(todo, pool.map(_compile, todo)):
            _done[(v.label(), a)] = res


def compile_for(jobs, pairs) -> None:
    """``compile_all`` of the ``jobs`` whose (variant, arch) is one of ``pairs``, the points this run selects."""
    want = {(v.label(), a) for v, a in pairs}
    compile_all([job for job in jobs if (job[0].label(), job[1]) in want])


def running(request, test: str) -> list[dict]:
    """The parameters of each point of ``test``, a function of ``request``'s module, that this run selects (after
    the sweep's deselection, -m, -k and node ids): the batch builds what they check, no more."""
    return [item.callspec.params for item in request.session.items
            if item.module is request.module and item.originalname == test and hasattr(item, "callspec")]


def every_arch(params, at: int = 0) -> list:
    """``params`` (a sample whose variants need not all be kept: ``cover=False``), checked that its kept points
    still build on every arch (argument ``at``): ValueError naming the archs missed."""
    if missed := set(ARCHS) - {values[at] for values in kept(params)}:
        raise ValueError(f"the sample leaves out arch(es) {sorted(missed)}")
    return params


def report(var, arch):
    """The report of one pair (compiled now if no batch asked for it)."""
    if (var.label(), arch) not in _done:
        compile_all([(var, arch, arch == SASS_ARCH)])
    return _done[(var.label(), arch)]


def matrix(variants, archs):
    """Jobs for every variant on every arch: SASS on SASS_ARCH, and for the first variant everywhere."""
    return [(v, a, a == SASS_ARCH or i == 0) for i, v in enumerate(variants) for a in archs]
