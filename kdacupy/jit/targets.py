"""The NVRTC target the runtime builds a kernel variant for on a device (docs/design.md
section 4, item 3).

- compute capability 9.0: ``sm_90a``, always: Hopper's arch-specific instructions (wgmma,
  setmaxnreg) exist only there, and the compile report's sm_90a lines then describe the
  binary the runtime loads;
- 10.x: ``sm_10Xa`` for a variant that uses an arch-specific instruction, the generic
  ``sm_10X`` otherwise (an "a" binary runs on that one compute capability only);
- anything else: ``sm_<cc>``.

Which variants use an arch-specific instruction is a property of the kernel family: a family
declares it with :func:`declare_arch_specific` (a predicate on the variant's ``#define``s).
The tcgen05 recurrences do (kdacupy/ops/forward/kernels.py): on 10.x they build sm_100a, the rest sm_100.
"""
from __future__ import annotations

from typing import Callable

_ARCH_SPECIFIC: dict[str, Callable[[dict], bool]] = {}


def declare_arch_specific(kernel: str, uses: Callable[[dict], bool]) -> None:
    """``kernels/<kernel>.cu`` variants whose config satisfies ``uses`` need an arch-specific target."""
    _ARCH_SPECIFIC[kernel] = uses


def forget_arch_specific(kernel: str) -> None:
    _ARCH_SPECIFIC.pop(kernel, None)


def uses_arch_specific(kernel: str, config: dict) -> bool:
    uses = _ARCH_SPECIFIC.get(kernel)
    return bool(uses and uses(config))


def runtime_arch(cc: str, arch_specific: bool = False) -> str:
    """The target for compute capability ``cc`` given as digits ("90" for 9.0, "100" for 10.0)."""
    if not cc.isdigit() or len(cc) < 2:
        raise ValueError(f"compute capability {cc!r}: expected its digits, e.g. '90' for 9.0")
    if cc == "90" or (cc[:-1] == "10" and arch_specific):
        return f"sm_{cc}a"
    return f"sm_{cc}"


def cc_digits(text: str) -> str:
    """'9.0' or '90' -> '90'."""
    major, _, minor = text.partition(".")
    digits = major + minor if minor else major
    if not digits.isdigit() or (minor and len(minor) != 1) or len(digits) < 2:
        raise ValueError(f"compute capability {text!r}: expected MAJOR.MINOR, e.g. 9.0")
    return digits


def describe(arch: str) -> str:
    """Which runtime builds ``arch``, in words (for the compile report's header)."""
    digits = arch.removeprefix("sm_").removesuffix("a")
    cc = f"{digits[:-1]}.{digits[-1]}"
    if runtime_arch(digits, arch.endswith("a")) != arch:
        return f"not a runtime target (the runtime builds {runtime_arch(digits)} on compute capability {cc})"
    if arch.endswith("a") and digits != "90":
        return f"the runtime's target on compute capability {cc} for variants with arch-specific instructions"
    if digits[:-1] == "10":
        return f"the runtime's target on compute capability {cc} for variants without arch-specific instructions"
    return f"the runtime's target on compute capability {cc}"


def device_cc() -> str:
    """The current CUDA device's compute capability digits, capped at the highest NVRTC
    targets (as CuPy's own builds do)."""
    from cupy.cuda import compiler

    return compiler._get_arch()


def target(kernel: str, config: dict) -> str:
    """The target the runtime builds this variant for on the current device."""
    return runtime_arch(device_cc(), uses_arch_specific(kernel, config))
