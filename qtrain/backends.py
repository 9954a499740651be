"""Which compiled backends this process can use, and why not when it cannot.

The extensions are imported lazily (importing qtrain must work without a
build) and never raise from here: :func:`status` reports each backend with the
real import error, for ``qtrain doctor`` and the run log; :func:`ext_cpu` /
:func:`ext_cuda` return the module or raise a :class:`QtrainError` that says
how to build it. Nothing falls back silently: ``qtrain.ops.dispatch`` records
every time "auto" had to use the reference instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from types import ModuleType
from typing import Any

from qtrain.errors import QtrainError

BUILD_HINT = "build it with `make build` (runs `pip install --no-build-isolation --no-deps -e .`)"

# backend name -> module name
MODULES: dict[str, str] = {"ext-cpu": "qtrain._ext", "ext-cuda": "qtrain._ext_cuda"}

_lock = threading.Lock()
_cache: dict[str, tuple[ModuleType | None, str | None]] = {}


def _torch_cuda_reason() -> str | None:
    """Why the CUDA extension cannot exist for this torch, or None if it can."""
    import torch

    if not torch.version.cuda:
        return f"not built: torch {torch.__version__} has no CUDA"
    return None


def _load(backend: str) -> tuple[ModuleType | None, str | None]:
    """(module, None) or (None, reason); cached per process."""
    with _lock:
        if backend in _cache:
            return _cache[backend]
        name = MODULES[backend]
        module: ModuleType | None = None
        error: str | None = None
        reason = _torch_cuda_reason() if backend == "ext-cuda" else None
        if reason is not None:
            error = reason
        else:
            try:
                import torch  # noqa: F401  (the extension links against libtorch)

                if importlib.util.find_spec(name) is None:
                    error = f"not built: no module {name}; {BUILD_HINT}"
                else:
                    module = importlib.import_module(name)
            except Exception as exc:  # a broken build (ABI, undefined symbol) must not crash qtrain
                error = f"import of {name} failed: {type(exc).__name__}: {exc}"
        _cache[backend] = (module, error)
        return module, error


def refresh() -> None:
    """Forget cached import results (after a rebuild in the same process)."""
    with _lock:
        _cache.clear()


def available(backend: str) -> bool:
    """True if the backend's extension imports."""
    if backend not in MODULES:
        return False
    return _load(backend)[0] is not None


def error(backend: str) -> str | None:
    """Why the backend's extension does not import (None when it does)."""
    if backend not in MODULES:
        return f"unknown backend {backend!r}"
    return _load(backend)[1]


def status() -> dict[str, dict[str, Any]]:
    """Every compiled backend: built or not, where, ISA / threads, and the error text.

    Example: ``{"ext-cpu": {"built": True, "path": ".../_ext...so", "isa": "avx512f",
    "threads": 2, "error": None, ...}, "ext-cuda": {"built": False, "error": "not built:
    torch 2.13.0+cpu has no CUDA", ...}}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for backend, name in MODULES.items():
        module, error = _load(backend)
        entry: dict[str, Any] = {
            "built": module is not None,
            "module": name,
            "path": getattr(module, "__file__", None) if module is not None else None,
            "error": error,
        }
        if module is not None and hasattr(module, "info"):
            try:
                info = dict(module.info())
            except Exception as exc:
                entry["error"] = f"{name}.info() failed: {type(exc).__name__}: {exc}"
            else:
                entry.update({k: v for k, v in info.items() if k not in entry})
                entry["note"] = _version_note(info.get("torch_built_against"))
        out[backend] = entry
    return out


def _version_note(built_against: object) -> str | None:
    """Say so when the extension was compiled against another torch than the one running."""
    import torch

    running = torch.__version__.split("+")[0]
    if isinstance(built_against, str) and built_against != running:
        return f"compiled against torch {built_against}, running {running}: rebuild (make build)"
    return None


def _require(backend: str) -> ModuleType:
    module, error = _load(backend)
    if module is None:
        msg = f"backend {backend!r} is not available: {error}"
        if BUILD_HINT not in msg and "has no CUDA" not in msg:
            msg += f"; {BUILD_HINT}"
        raise QtrainError(msg)
    return module


def ext_cpu() -> ModuleType:
    """The CPU extension module, or QtrainError saying it is not built and how to build it."""
    return _require("ext-cpu")


def ext_cuda() -> ModuleType:
    """The CUDA extension module, or QtrainError saying why it is not there."""
    return _require("ext-cuda")
