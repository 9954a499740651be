"""What the GPU benchmarks share: timing, the device's copy bandwidth, a result row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from _timing import Timing, timed

_bandwidth: dict[int, float] = {}  # measured once per process and size


def median_ms(fn: Callable[[], object], repeats: int = 10, warmup: int = 3) -> Timing:
    """fn()'s timing after warm-up calls: ``repeats`` calls, each timed by
    ``torch.utils.benchmark.Timer``, whose clock synchronizes the device before and after it
    (``.median_ms``, ``.iqr_ms``; ``row`` takes it as it is)."""
    return timed(fn, repeats, warmup)


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    """The device's memory bandwidth: bytes read + written by a large device copy, per second."""
    if nbytes not in _bandwidth:
        src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").fill_(1.0)
        dst = torch.empty_like(src)
        ms = median_ms(lambda: dst.copy_(src)).median_ms
        _bandwidth[nbytes] = 2 * nbytes / ms / 1e6
        del src, dst
        torch.cuda.empty_cache()
    return _bandwidth[nbytes]


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def row(
    case: str,
    shape: Any,
    ms: Timing | float,
    baseline: str | None,
    baseline_ms: Timing | float | None,
    nbytes: int | None = None,
    bandwidth: float | None = None,
) -> dict[str, Any]:
    """One result: time (the median, and its IQR where ``ms`` is a ``Timing``), ratio of the
    medians against the baseline, and GB/s over ``nbytes`` (the bytes the kernel must move)
    as a share of ``bandwidth``."""
    ms, iqr = (ms.median_ms, ms.iqr_ms) if isinstance(ms, Timing) else (ms, None)
    baseline_iqr = None
    if isinstance(baseline_ms, Timing):
        baseline_ms, baseline_iqr = baseline_ms.median_ms, baseline_ms.iqr_ms
    gbps = nbytes / ms / 1e6 if nbytes is not None else None
    return {
        "case": case,
        "shape": shape,
        "ms": round(ms, 4),
        "iqr_ms": _round(iqr),
        "baseline": baseline,
        "baseline_ms": _round(baseline_ms),
        "baseline_iqr_ms": _round(baseline_iqr),
        "ratio": None if baseline_ms is None else round(baseline_ms / ms, 3),
        "gbps": None if gbps is None else round(gbps, 1),
        "bw_fraction": None if gbps is None or not bandwidth else round(gbps / bandwidth, 3),
    }
