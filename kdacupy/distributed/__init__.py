"""Context parallelism across processes and GPUs (docs/design.md section 7.3).

``kda_forward_cp`` and ``kda_backward_cp`` run ``kda_forward`` and ``kda_backward`` on each
rank's slice of the tokens; the ranks exchange fp32 state maps through an mpi4py
communicator, CuPy's NCCL communicator or a ``torch.distributed`` process group. This
package is the only place that imports MPI, NCCL or torch.distributed, and only when a
communicator of that kind is passed in. Frameworks that run their own collectives
(kdacupy.jax inside ``shard_map``) run the same local steps (``Shard``).
"""
from .agree import ContextParallelError
from .backward_cp import kda_backward_cp
from .cp import kda_forward_cp

__all__ = ["kda_forward_cp", "kda_backward_cp", "ContextParallelError"]
