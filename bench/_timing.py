"""How the benchmarks time their candidates: torch's ``Timer``, round robin, median and IQR.

Why: each script had its own ``perf_counter`` loop and reported a bare median, so a
figure came with no sign of how much it moved, and a loop that forgot to synchronize an
accelerator would time kernel launches. Here every call is timed by a
``torch.utils.benchmark.Timer`` (whose clock synchronizes the accelerator, where there is
one, before and after); the candidates take turns, one call each per round with the order
rotated every round, so load from other jobs on a shared machine falls on all of them
alike; and each result carries the interquartile range of its times next to the median
(both from ``torch.utils.benchmark.Measurement``).

One timed call per measurement: ``Timer.timeit(n)`` first makes ``max(n // 100, 2)``
untimed calls, so ``timeit(1)`` would call a candidate three times per measurement (three
training epochs where an epoch is the candidate, and three times the kernel counts a
benchmark records). The measurement here is the single timed pass that ``timeit``,
``blocked_autorange`` and ``adaptive_autorange`` are all built on (``Timer._timeit``);
warm-up is the caller's ``warmup`` rounds. ``timeit`` turns the garbage collector off
while it times; the setup ``gc.enable()`` (run before the clock starts) turns it back on,
as ``timeit``'s documentation suggests, so a call pays for its collections as it would in
a training loop, and as it did in the loops this module replaced (a caller that had the
collector off finds it off again afterwards).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch.utils.benchmark import Measurement, TaskSpec, Timer

Call = Callable[[], object]
# what each call runs inside, entered before its clock starts and left after it stops
Around = Callable[[str], AbstractContextManager[object]]
# called after each timed round with its index (from 0) and each candidate's seconds
OnRound = Callable[[int, dict[str, float]], None]

STMT = "fn()"
SETUP = "gc.enable()"  # untimed; timeit disables the collector while timing


@dataclass(frozen=True)
class Timing:
    """One candidate's timed calls: their median and interquartile range, in seconds."""

    median_s: float
    iqr_s: float
    times_s: list[float]

    @classmethod
    def of(cls, times_s: Sequence[float], label: str | None = None) -> Timing:
        """The median and IQR of ``times_s`` (seconds per call), as ``Measurement`` has them
        (quartiles by linear interpolation; one time gives an IQR of 0)."""
        if not times_s:
            raise ValueError("no times to summarize")
        spec = TaskSpec(stmt=STMT, setup=SETUP, label=label, num_threads=torch.get_num_threads())
        m = Measurement(number_per_run=1, raw_times=list(times_s), task_spec=spec)
        return cls(median_s=m.median, iqr_s=m.iqr, times_s=list(m.times))

    @property
    def median_ms(self) -> float:
        return self.median_s * 1e3

    @property
    def iqr_ms(self) -> float:
        return self.iqr_s * 1e3

    def ms(self, spec: str = ".1f") -> str:
        """``"20.4 ± 0.6"``: the median and the IQR in milliseconds."""
        return f"{self.median_ms:{spec}} ± {self.iqr_ms:{spec}}"


def _one(timer: Timer) -> float:
    """Seconds of one timed call (the collector on during it, as it was afterwards)."""
    was_on = gc.isenabled()
    try:
        return timer._timeit(1)
    finally:
        if not was_on:
            gc.disable()


def _timer(name: str, fn: Call) -> Timer:
    return Timer(
        stmt=STMT,
        setup=SETUP,
        globals={"fn": fn, "gc": gc},
        label=name,
        num_threads=torch.get_num_threads(),
    )


def interleaved(
    candidates: Mapping[str, Call],
    repeat: int,
    warmup: int = 0,
    *,
    around: Around | None = None,
    on_round: OnRound | None = None,
) -> dict[str, Timing]:
    """Each candidate's timing over ``repeat`` rounds, after ``warmup`` untimed rounds.

    A round calls every candidate once; timed round ``i`` starts at the ``i``-th
    candidate (mod their number) and goes on in order, wrapping around, so over a
    multiple of their number of rounds each one runs first, second, ... equally often
    (warm-up rounds keep the given order). ``around(name)``, when given, wraps every call
    (warm-up ones too) outside the timed part, e.g. to enter a patch session.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if not candidates:
        raise ValueError("no candidates to time")
    names = list(candidates)
    timers = {name: _timer(name, fn) for name, fn in candidates.items()}
    times: dict[str, list[float]] = {name: [] for name in names}

    def call(name: str) -> float:
        with around(name) if around is not None else contextlib.nullcontext():
            return _one(timers[name])

    for _ in range(warmup):
        for name in names:
            call(name)
    for i in range(repeat):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(call(name))
        if on_round is not None:
            on_round(i, {name: times[name][-1] for name in names})
    return {name: Timing.of(times[name], name) for name in names}


def timed(fn: Call, repeat: int, warmup: int = 0, *, around: Around | None = None) -> Timing:
    """One candidate's timing: ``repeat`` timed calls after ``warmup`` untimed ones."""
    return interleaved({"fn": fn}, repeat, warmup, around=around)["fn"]


def once(fn: Call) -> float:
    """Seconds of one call of ``fn``, by a ``Timer`` (for loops that time as they go)."""
    return _one(_timer("fn", fn))
