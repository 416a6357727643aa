"""kdacupy for PyTorch (extra ``[torch]``): ``kda`` (autograd, ``torch.compile``), ``kda_decode``
and ``kda_cp`` (context parallelism on a torch.distributed process group, kdacupy/torch/cp.py).

Importing it registers the custom ops ``torch.ops.kdacupy.forward``,
``forward_pool``, ``backward`` and ``decode`` (kdacupy/torch/ops.py), ``forward_cp`` and
``backward_cp`` (kdacupy/torch/cp.py) and the forwards' autograd. CUDA tensors run kdacupy's CUDA
kernels on torch's current stream, zero-copy through DLPack; CPU tensors run the
NumPy backends (float64 tensors on the float64 reference), so everything,
``torch.autograd.gradcheck`` included, runs without a GPU. This package is the
only part of kdacupy that imports torch (kdacupy.distributed imports torch.distributed alone,
when given a process group).
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as e:
    raise ImportError("kdacupy.torch needs PyTorch (>= 2.4): pip install 'kdacupy[torch]'") from e

from .api import kda, kda_decode  # noqa: E402
from .cp import kda_cp  # noqa: E402

__all__ = ["kda", "kda_decode", "kda_cp"]
