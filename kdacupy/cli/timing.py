"""GPU timing helpers for bench and tune: CUDA-event timing, copy bandwidth,
device facts, finite checks, freeing memory, and the git commit of a run.
CuPy and torch are imported inside the functions."""
from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from .. import env
from ..numerics.dtypes import BF16

NO_GPU = ("{prog}: no CUDA GPU is available (CuPy found none); timing needs a GPU.{hint}")


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


def no_gpu_message(prog: str, hint: str = "") -> str:
    return NO_GPU.format(prog=prog, hint=hint)


def device_info() -> dict:
    import cupy

    from .. import __version__
    from ..ops.forward.tuning import device_facts, model_name

    dev, name, sm = device_facts()
    props = cupy.cuda.runtime.getDeviceProperties(dev)
    rt = cupy.cuda.runtime.runtimeGetVersion()
    return dict(name=name, model=model_name(name), sm_count=sm, device_id=dev,
                compute_capability=f"{props['major']}.{props['minor']}", l2_bytes=int(props.get("l2CacheSize", 0)),
                memory_bytes=int(props.get("totalGlobalMem", 0)), cupy=cupy.__version__, cuda_runtime=rt,
                cuda_driver=cupy.cuda.runtime.driverGetVersion(), kdacupy=__version__,
                python=platform.python_version())


def time_calls(calls, warmup: int, iters: int, clock: str = "cupy") -> tuple[float, float]:
    """(median, min) milliseconds of one call, one CUDA event pair per call on
    the current stream (CuPy's, or torch's with ``clock="torch"``); ``calls``
    alternate (input sets that rotate)."""
    n = len(calls)
    for i in range(warmup):
        calls[i % n]()
    if clock == "torch":
        import torch

        ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        stream = torch.cuda.current_stream()
    else:
        import cupy

        ev = cupy.cuda.Event
        stream = cupy.cuda.get_current_stream()
    starts, ends = [ev() for _ in range(iters)], [ev() for _ in range(iters)]
    for i in range(iters):
        starts[i].record(stream)
        calls[i % n]()
        ends[i].record(stream)
    ends[-1].synchronize()
    if clock == "torch":
        ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        import cupy

        ms = [cupy.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends)]
    return float(np.median(ms)), float(np.min(ms))


def _clock(clock):
    """(event factory, current stream, elapsed ms of an event pair) for CuPy or torch."""
    if clock == "torch":
        import torch

        return (lambda: torch.cuda.Event(enable_timing=True)), torch.cuda.current_stream(), \
            (lambda s, e: s.elapsed_time(e))
    import cupy

    return cupy.cuda.Event, cupy.cuda.get_current_stream(), cupy.cuda.get_elapsed_time


def time_steps(call, steps: int, repeats: int, clock: str = "cupy") -> tuple[float, float]:
    """(median, min) milliseconds per call with ``steps`` back-to-back calls between
    one event pair (``repeats`` pairs): a stream of calls as an engine issues them,
    so the time is the device's when it is the bottleneck and the host's (launch
    path) when that is. Warm the call up first."""
    ev, stream, elapsed = _clock(clock)
    pairs = [(ev(), ev()) for _ in range(repeats)]
    for start, end in pairs:
        start.record(stream)
        for _ in range(steps):
            call()
        end.record(stream)
    pairs[-1][1].synchronize()
    ms = [elapsed(s, e) / steps for s, e in pairs]
    return float(np.median(ms)), float(np.min(ms))


def time_graph(call, steps: int, repeats: int, clock: str = "cupy") -> tuple[float, float]:
    """(median, min) milliseconds per call, ``steps`` calls captured into one CUDA
    graph (CuPy's, or torch's with ``clock="torch"``) and the graph replayed
    ``repeats`` times between event pairs: the device time of the calls without
    the host's launch path. Warm the call up (compiled, memory allocated) first."""
    if clock == "torch":
        import torch

        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.cuda.graph(graph, stream=side):
                for _ in range(steps):
                    call()
        torch.cuda.current_stream().wait_stream(side)
        replay = graph.replay
    else:
        import cupy

        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                for _ in range(steps):
                    call()
            finally:
                graph = stream.end_capture()
        replay = lambda: graph.launch(cupy.cuda.get_current_stream())  # noqa: E731
    replay()  # the first launch uploads the graph
    med, mn = time_steps(replay, 1, repeats, clock)
    return med / steps, mn / steps


def host_us_per_call(call, calls: int = 200) -> float:
    """Wall-clock microseconds per call of ``calls`` back-to-back calls (no
    synchronisation inside: fewer calls than the launch queue holds, so this is
    the host's cost of a call, launch included, not the device's)."""
    import time

    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t0) / calls * 1e6


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), median."""
    import cupy

    a = cupy.empty(nbytes, dtype=np.uint8)
    a.fill(1)
    b = cupy.empty_like(a)
    med, _ = time_calls([lambda src=a, dst=b: dst.data.copy_from_device_async(src.data, nbytes)], 3, iters)
    del a, b
    cupy.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / (med * 1e-3) / 1e9


def finite(x) -> bool:
    """No NaN/Inf in a bf16/fp16/fp32 CuPy array (through its bits: no float cast needed)."""
    import cupy

    if x.dtype.itemsize == 2:
        bits = x.view(cupy.uint16)
        mask = 0x7F80 if x.dtype == BF16 else 0x7C00
        return not bool(((bits & mask) == mask).any())
    return bool(cupy.isfinite(x).all())


def git_commit() -> str | None:
    here = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return env.get("KDACUPY_COMMIT")


def git_dirty() -> bool | None:
    here = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                             capture_output=True, text=True, timeout=10)
        return bool(out.stdout.strip()) if out.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def free_memory():
    try:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    except Exception:  # noqa: BLE001
        pass
    if "torch" in sys.modules:
        try:
            sys.modules["torch"].cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
