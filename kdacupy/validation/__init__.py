"""Argument checking for the public calls (docs/design.md section 1), one
module per concern: ``arrays`` (the error and array conversion), ``memory``
(devices, backend, ``out``, the kernels' row layouts), ``shapes``, ``options``
(beta, gate, scale), ``seqlens``, ``state``, ``keywords`` (foreign spellings),
``pool`` (the state pool of ``kda_decode`` and of ``kda_forward``), ``head_dims``
(which head dims each path takes), and
``problem`` (``validate``: all of them in order, the validated ``Problem``).

Errors name the argument, what was expected and what was received. Values of
device arrays are never read (that would synchronise the host).
"""
from .arrays import as_array, capturing, cupy_module, fail, is_device
from .keywords import check_keywords
from .memory import check_kernel_layout
from .problem import Problem, validate

__all__ = ["Problem", "validate", "as_array", "capturing", "cupy_module", "fail", "is_device", "check_keywords",
           "check_kernel_layout"]
