"""The communication engines behind one small interface: an mpi4py communicator, CuPy's NCCL
communicator, or a ``torch.distributed`` process group (its own backend: NCCL for CUDA tensors,
gloo for CPU tensors). MPI, NCCL and torch.distributed are imported here only, and only when such
a communicator is used.

Every collective is blocking on the host: context parallelism needs the
ranks' token counts on the host to plan the pieces, so it synchronises once
per call by nature (unlike ``kda_forward``).

``agree`` is the small collective that keeps a failure on one rank from
hanging the others: each rank contributes None or its failure, every rank gets
all of them (kdacupy/distributed/agree.py runs one after each local step).
"""
from __future__ import annotations

import pickle
import warnings

import numpy as np

_OBJ_BYTES = 1 << 16  # fixed size of a pickled object in allgather_obj (NCCL needs equal sizes)
STATUS_BYTES = 1 << 12  # fixed size of one rank's status in agree
_STATUS_TEXT = 1500  # characters of a failure message that travel (the rest is cut)
_warned_host_staging = False


def pack(obj, nbytes: int) -> bytes:
    """``obj`` pickled into exactly ``nbytes`` bytes (its length first), for equal-size collectives."""
    raw = pickle.dumps(obj, protocol=4)
    if len(raw) + 8 > nbytes:
        raise ValueError(f"allgather_obj: object of {len(raw)} bytes exceeds {nbytes - 8}")
    return np.int64(len(raw)).tobytes() + raw + bytes(nbytes - 8 - len(raw))


def cut_status(failure):
    """A status as it travels: None, or ``(kind, message)`` with the message cut to a fixed size."""
    if failure is None:
        return None
    kind, msg = failure
    return (str(kind)[:100], msg if len(msg) <= _STATUS_TEXT else msg[:_STATUS_TEXT] + " [...]")


def unpack(row):
    """The object ``pack`` put into ``row`` (a uint8 array)."""
    n = int(np.frombuffer(row[:8].tobytes(), np.int64)[0])
    return pickle.loads(row[8:8 + n].tobytes())


def _cupy():
    import cupy
    return cupy


def _is_mpi(comm) -> bool:
    mod = type(comm).__module__ or ""
    return mod.startswith("mpi4py") and hasattr(comm, "Allgather")


def _is_nccl(comm) -> bool:
    return type(comm).__name__ == "NcclCommunicator" and "nccl" in (type(comm).__module__ or "")


NCCL_NEEDS_DEVICE = ("an mpi4py communicator for NumPy arrays (NCCL moves device memory only)",
                     "cupy.cuda.nccl.NcclCommunicator")


def _is_torch_group(comm) -> bool:
    return any(c.__name__ == "ProcessGroup" and (c.__module__ or "").startswith("torch")
               for c in type(comm).__mro__)


def wrap(comm, device: bool):
    """The engine for ``comm``; ``device``: this rank's arrays are CuPy arrays.

    Raises only for an object that is no communicator at all (there is no one to
    tell). A communicator that does not suit this rank's arrays (NCCL with NumPy
    arrays) is still wrapped: the caller reports that through the engine
    (``requires_device``), so every rank raises instead of some waiting."""
    if _is_mpi(comm):
        return MpiComm(comm, device)
    if _is_nccl(comm):
        return NcclComm(comm)
    if _is_torch_group(comm):
        return TorchComm(comm, device)
    raise TypeError(f"comm: expected an mpi4py communicator (e.g. mpi4py.MPI.COMM_WORLD), a "
                    f"cupy.cuda.nccl.NcclCommunicator or a torch.distributed ProcessGroup, got "
                    f"{type(comm).__module__}.{type(comm).__name__}")


class _Engine:
    rank: int
    size: int
    requires_device = False  # True for NCCL: it moves device buffers only

    def agree(self, failure) -> list:
        """Every rank's status, in rank order: ``failure`` is None (this rank's step
        went well) or ``(exception type name, message)``; the message is cut to a
        fixed size so the collective is small and never fails itself."""
        return self.allgather_obj(cut_status(failure), STATUS_BYTES)

    def allgather_obj(self, obj, nbytes: int = _OBJ_BYTES) -> list:
        """Every rank's ``obj`` (picklable, at most ``nbytes`` - 8 bytes pickled; the
        same ``nbytes`` on every rank), in rank order."""
        buf = np.frombuffer(pack(obj, nbytes), np.uint8).copy()
        return [unpack(row) for row in self._allgather_host_bytes(buf)]


class MpiComm(_Engine):
    """mpi4py. Host arrays go straight through; device arrays go through
    CUDA-aware MPI when the library says it is, else through host copies
    (with one warning per process)."""

    def __init__(self, comm, device: bool):
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.device = device
        self.cuda_aware = device and _mpi_cuda_aware(MPI)

    def _allgather_host_bytes(self, buf):
        out = np.empty((self.size, buf.size), buf.dtype)
        self.comm.Allgather(buf, out)
        return out

    def _staged(self, x, fn):
        global _warned_host_staging
        if not self.device:
            return fn(np, x)
        cp = _cupy()
        cp.cuda.get_current_stream().synchronize()  # MPI does not order itself after CuPy's stream
        if self.cuda_aware:
            return fn(cp, x)
        if not _warned_host_staging:
            warnings.warn("kdacupy.distributed: this MPI is not CUDA-aware; device buffers are staged "
                          "through host memory", RuntimeWarning, stacklevel=4)
            _warned_host_staging = True
        return cp.asarray(fn(np, cp.asnumpy(x)))

    def allgather(self, x):
        def run(xp, a):
            a = xp.ascontiguousarray(a)
            out = xp.empty((self.size, *a.shape), a.dtype)
            self.comm.Allgather(a, out)
            return out
        return self._staged(x, run)

    def allreduce_sum(self, x):
        def run(xp, a):
            a = xp.ascontiguousarray(a)
            out = xp.empty_like(a)
            self.comm.Allreduce(a, out, op=self._mpi.SUM)
            return out
        return self._staged(x, run)


def _mpi_cuda_aware(MPI) -> bool:
    query = getattr(MPI, "Query_cuda_support", None)
    try:
        return bool(query()) if query else False
    except Exception:  # noqa: BLE001  (an MPI without the MPIX extension)
        return False


class NcclComm(_Engine):
    """CuPy's NCCL communicator: device buffers on CuPy's current stream."""

    requires_device = True

    _TYPES = {np.dtype(np.float32): "NCCL_FLOAT32", np.dtype(np.uint8): "NCCL_UINT8",
              np.dtype(np.int64): "NCCL_INT64"}

    def __init__(self, comm):
        from cupy.cuda import nccl

        self._nccl = nccl
        self.comm = comm
        self.rank = comm.rank_id()
        self.size = comm.size()

    def _dtype(self, a):
        name = self._TYPES.get(a.dtype)
        if name is None:
            raise TypeError(f"NCCL collective: unsupported dtype {a.dtype}")
        return getattr(self._nccl, name)

    def allgather(self, x):
        cp = _cupy()
        a = cp.ascontiguousarray(x)
        out = cp.empty((self.size, *a.shape), a.dtype)
        stream = cp.cuda.get_current_stream().ptr
        self.comm.allGather(a.data.ptr, out.data.ptr, a.size, self._dtype(a), stream)
        return out

    def allreduce_sum(self, x):
        cp = _cupy()
        a = cp.ascontiguousarray(x)
        out = cp.empty_like(a)
        stream = cp.cuda.get_current_stream().ptr
        self.comm.allReduce(a.data.ptr, out.data.ptr, a.size, self._dtype(a), self._nccl.NCCL_SUM, stream)
        return out

    def _allgather_host_bytes(self, buf):
        cp = _cupy()
        return cp.asnumpy(self.allgather(cp.asarray(buf)))


class TorchComm(_Engine):
    """A ``torch.distributed`` process group, on its own backend: arrays travel as tensors
    viewing their memory (NumPy through ``torch.from_numpy``, CuPy through DLPack on the
    current stream, which kdacupy.torch makes torch's), gathered by ``dist.all_gather`` into
    the rows of one tensor. A group without a CPU backend (NCCL alone) takes device arrays
    only, as CuPy's NCCL communicator does; its small host collectives (the agreements) go
    through the current CUDA device."""

    def __init__(self, group, device: bool):
        import torch
        import torch.distributed as dist

        self._torch, self._dist, self.group = torch, dist, group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        backend = str(dist.get_backend(group)).lower()
        self.host = "gloo" in backend or "mpi" in backend or backend.startswith("cpu")
        self.requires_device = not self.host

    def _tensor(self, x):
        if isinstance(x, np.ndarray):
            return self._torch.from_numpy(np.ascontiguousarray(x))
        return self._torch.from_dlpack(_cupy().ascontiguousarray(x))

    def _back(self, t, like):
        if isinstance(like, np.ndarray):
            return t.numpy()
        return _cupy().from_dlpack(t)

    def _gather(self, t):
        out = t.new_empty((self.size, *t.shape))
        self._dist.all_gather(list(out.unbind(0)), t, group=self.group)
        return out

    def allgather(self, x):
        return self._back(self._gather(self._tensor(x)), x)

    def allreduce_sum(self, x):
        t = self._tensor(x).clone()
        self._dist.all_reduce(t, op=self._dist.ReduceOp.SUM, group=self.group)
        return self._back(t, x)

    def _allgather_host_bytes(self, buf):
        t = self._torch.from_numpy(buf)
        if not self.host:
            t = t.to(f"cuda:{self._torch.cuda.current_device()}")
        return self._gather(t).cpu().numpy()
