"""Choosing a backend per call, and recording what was chosen.

Every quantized primitive has the pure-PyTorch reference and possibly compiled
kernels ("ext-cpu", "ext-cuda"). ``backend="auto"`` takes the compiled kernel
for the tensor's device when one exists and is built; when it has to use the
reference instead, the reason goes into :data:`COUNTER`'s ``fallbacks`` so the
run log and ``qtrain doctor`` can say so: nothing falls back silently. Every
call is counted as (primitive, backend), which is how a run (or a test) proves
which kernels actually ran. :func:`call` also marks each call's span for
``torch.profiler`` (``qtrain::<primitive>[<backend>]``): that is how
``qtrain profile`` times kernels without estimating.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Collection, Iterator

import torch

from qtrain.ops import backends

BACKENDS = ("auto", "reference", "ext-cpu", "ext-cuda")
_DEVICE_BACKEND = {"cpu": "ext-cpu", "cuda": "ext-cuda"}


class KernelCounter:
    """Process-wide, thread-safe call counts per (primitive, backend) plus fallback reasons."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}
        self._fallbacks: dict[str, int] = {}  # reason -> times; insertion order = first seen

    def record(self, primitive: str, backend: str, calls: int = 1) -> None:
        """Count ``calls`` calls of ``primitive`` served by ``backend``."""
        with self._lock:
            per = self._counts.setdefault(primitive, {})
            per[backend] = per.get(backend, 0) + calls

    def record_fallback(self, reason: str) -> None:
        """Note that "auto" used the reference; each distinct reason is kept once, with a count."""
        with self._lock:
            self._fallbacks[reason] = self._fallbacks.get(reason, 0) + 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """A copy of the counts, e.g. ``{"quantize": {"ext-cpu": 3}}``."""
        with self._lock:
            return {p: dict(per) for p, per in self._counts.items()}

    @property
    def fallbacks(self) -> list[str]:
        """Distinct human-readable fallback reasons, in the order first seen."""
        with self._lock:
            return list(self._fallbacks)

    def fallback_counts(self) -> dict[str, int]:
        """How many calls each fallback reason covered."""
        with self._lock:
            return dict(self._fallbacks)

    def reset(self) -> None:
        """Forget all counts and fallbacks (start of a run, or of a test)."""
        with self._lock:
            self._counts.clear()
            self._fallbacks.clear()

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Calls made inside are not the run's (a calibration's trial steps before
        training): the counts and fallbacks are put back as they were on the way out."""
        with self._lock:
            counts = {p: dict(per) for p, per in self._counts.items()}
            fallbacks = dict(self._fallbacks)
        try:
            yield
        finally:
            with self._lock:
                self._counts, self._fallbacks = counts, fallbacks


COUNTER = KernelCounter()

# The torch.profiler scope of every kernel call: ``qtrain::<primitive>[<backend>]``.
SCOPE_PREFIX = "qtrain::"


def scope_name(primitive: str, backend: str) -> str:
    """The ``record_function`` name of a ``primitive`` call served by ``backend``."""
    return f"{SCOPE_PREFIX}{primitive}[{backend}]"


@contextlib.contextmanager
def call(primitive: str, backend: str) -> Iterator[None]:
    """Mark a call of ``primitive`` on ``backend`` for torch.profiler and count it once it
    has returned (a call its arguments refused ran no kernel). The mark only while a
    profiler records: it costs about 7 us a call otherwise spent on nothing, a tenth of
    a millisecond per step on a graph like Cora."""
    profiling = torch.autograd._profiler_enabled()
    with (
        torch.profiler.record_function(scope_name(primitive, backend))
        if profiling
        else contextlib.nullcontext()
    ):
        yield
    COUNTER.record(primitive, backend)


def snapshot() -> dict[str, dict[str, int]]:
    """Counts of the process-wide counter."""
    return COUNTER.snapshot()


def fallbacks() -> list[str]:
    """Fallback reasons of the process-wide counter."""
    return COUNTER.fallbacks


def reset() -> None:
    """Reset the process-wide counter."""
    COUNTER.reset()


def check_backend(backend: object) -> str:
    """Return ``backend`` if it is a known name, else raise ValueError listing the allowed ones."""
    if backend not in BACKENDS:
        allowed = ", ".join(repr(b) for b in BACKENDS)
        raise ValueError(f"backend must be one of {allowed}, got {backend!r}")
    return str(backend)


def resolve(
    primitive: str,
    x: torch.Tensor,
    backend: str = "auto",
    kernels: Collection[str] = (),
) -> str:
    """The backend that will run ``primitive`` on ``x``'s device.

    ``kernels`` names the compiled backends that implement the primitive. An
    explicit compiled backend must match the device, implement the primitive
    and be built (QtrainError naming the build command otherwise). "auto"
    prefers the device's compiled kernel and records a fallback when it must
    use the reference although the primitive has compiled kernels.
    """
    backend = check_backend(backend)
    device_backend = _DEVICE_BACKEND.get(x.device.type)
    if backend == "reference":
        return backend
    if backend != "auto":
        if backend != device_backend:
            raise ValueError(
                f"{primitive}: backend {backend!r} cannot run on a {x.device.type} tensor"
            )
        if backend not in kernels:
            have = ", ".join(repr(b) for b in ("reference", *sorted(kernels)))
            raise ValueError(f"{primitive}: no {backend!r} kernel; available: {have}")
        if backend == "ext-cpu":
            backends.ext_cpu()
        else:
            backends.ext_cuda()
        return backend
    if device_backend is not None and device_backend in kernels:
        if backends.available(device_backend):
            return device_backend
        COUNTER.record_fallback(
            f"{primitive}: {device_backend} unavailable ({backends.error(device_backend)}); "
            "used the reference"
        )
        return "reference"
    if kernels:
        COUNTER.record_fallback(
            f"{primitive}: no compiled kernel for {x.device.type} tensors "
            f"(only {', '.join(sorted(kernels))}); used the reference"
        )
    return "reference"
