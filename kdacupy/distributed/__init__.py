"""Context parallelism across processes and GPUs (docs/design.md section 7.3).

``kda_forward_cp`` runs ``kda_forward`` on each rank's slice of the tokens; the
ranks exchange fp32 state maps through an mpi4py communicator or CuPy's NCCL
communicator. This package is the only place that imports MPI or NCCL, and
only when a communicator of that kind is passed in.
"""
from .cp import ContextParallelError, kda_forward_cp

__all__ = ["kda_forward_cp", "ContextParallelError"]
