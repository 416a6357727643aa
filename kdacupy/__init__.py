"""kdacupy: Kimi Delta Attention kernels for CuPy, compiled at run time with NVRTC."""
from .api import kda_forward
from .backward import KDAGradients, kda_backward
from .decode import kda_decode, prepared_decode
from .saved import KDASaved, saved_nbytes

__version__ = "0.1.0"
__all__ = ["kda_forward", "kda_backward", "KDAGradients", "KDASaved", "saved_nbytes", "kda_decode", "prepared_decode", "__version__"]
