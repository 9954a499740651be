"""What the GPU benchmarks share: CUDA-event timing, the device's copy bandwidth, a result row."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

_bandwidth: dict[int, float] = {}  # measured once per process and size


def median_ms(fn: Callable[[], object], repeats: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of fn() on the current stream, by CUDA events, after warm-up calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    """The device's memory bandwidth: bytes read + written by a large device copy, per second."""
    if nbytes not in _bandwidth:
        src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").fill_(1.0)
        dst = torch.empty_like(src)
        ms = median_ms(lambda: dst.copy_(src))
        _bandwidth[nbytes] = 2 * nbytes / ms / 1e6
        del src, dst
        torch.cuda.empty_cache()
    return _bandwidth[nbytes]


def row(
    case: str,
    shape: Any,
    ms: float,
    baseline: str | None,
    baseline_ms: float | None,
    nbytes: int | None = None,
    bandwidth: float | None = None,
) -> dict[str, Any]:
    """One result: time, ratio against the baseline, and GB/s over ``nbytes`` (the bytes the
    kernel must move) as a share of ``bandwidth``."""
    gbps = nbytes / ms / 1e6 if nbytes is not None else None
    return {
        "case": case,
        "shape": shape,
        "ms": round(ms, 4),
        "baseline": baseline,
        "baseline_ms": None if baseline_ms is None else round(baseline_ms, 4),
        "ratio": None if baseline_ms is None else round(baseline_ms / ms, 3),
        "gbps": None if gbps is None else round(gbps, 1),
        "bw_fraction": None if gbps is None or not bandwidth else round(gbps / bandwidth, 3),
    }
