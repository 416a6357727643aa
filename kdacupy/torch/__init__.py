"""kdacupy for PyTorch (extra ``[torch]``): ``kda`` (autograd, ``torch.compile``) and ``kda_decode``.

Importing it registers the custom ops ``torch.ops.kdacupy.forward``,
``forward_pool``, ``backward`` and ``decode`` (kdacupy/torch/ops.py) and the
forward's autograd (kdacupy/torch/autograd.py). CUDA tensors run kdacupy's CUDA
kernels on torch's current stream, zero-copy through DLPack; CPU tensors run the
NumPy backends (float64 tensors on the float64 reference), so everything,
``torch.autograd.gradcheck`` included, runs without a GPU. This package is the
only part of kdacupy that imports torch.
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as e:
    raise ImportError("kdacupy.torch needs PyTorch (>= 2.4): pip install 'kdacupy[torch]'") from e

from .api import kda, kda_decode  # noqa: E402

__all__ = ["kda", "kda_decode"]
