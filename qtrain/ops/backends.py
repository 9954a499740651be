"""Which compiled backends this process can use, and why not when it cannot.

The compiled backends are the kernels of one op library, ``qtrain._ext``:
importing it registers the torch custom ops ``torch.ops.qtrain.*`` with their
CPU kernels ("ext-cpu") and, in a CUDA build, their CUDA kernels ("ext-cuda");
the dispatcher then routes each call by its tensors' device. The library is
imported lazily (importing qtrain must work without a build) and never raises
from here: :func:`status` reports each backend with the real reason it is
missing, for ``qtrain doctor`` and the run log; :func:`ext_cpu` /
:func:`ext_cuda` return the module or raise a :class:`QtrainError` that says
how to build it. Nothing falls back silently: ``qtrain.ops.dispatch`` records
every time "auto" had to use the reference instead.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from qtrain.errors import QtrainError

BUILD_HINT = "build it with `make build` (runs `pip install --no-build-isolation --no-deps -e .`)"

BACKENDS = ("ext-cpu", "ext-cuda")
# the op library; tests point it at a missing or broken module
MODULE = "qtrain._ext"

_lock = threading.Lock()
_cache: dict[str, tuple[ModuleType | None, str | None]] = {}


def _import_library() -> tuple[ModuleType | None, str | None]:
    """(the library, None) or (None, why not); its ops' fake kernels and the autograd of
    the differentiable ones (qtrain/ops/autograd.py) registered once."""
    try:
        import torch  # noqa: F401  (the library links against libtorch)

        if importlib.util.find_spec(MODULE) is None:
            return None, f"not built: no module {MODULE}; {BUILD_HINT}"
        module = importlib.import_module(MODULE)
        from qtrain.ops import autograd, fakes

        fakes.register()
        autograd.register_autograd()
    except Exception as exc:  # a broken build (ABI, undefined symbol) must not crash qtrain
        return None, f"import of {MODULE} failed: {type(exc).__name__}: {exc}"
    return module, None


def _cuda_reason(module: ModuleType) -> str | None:
    """Why the library has no CUDA kernels, or None when it has them."""
    import torch

    if not torch.version.cuda:
        return f"not built: torch {torch.__version__} has no CUDA"
    if not _info(module).get("cuda_kernels"):
        return f"not built: {MODULE} was built without CUDA kernels (nvcc missing at build time?)"
    return None


def _info(module: ModuleType) -> dict[str, Any]:
    try:
        return dict(module.info())
    except Exception:  # reported by status(); here it only means "no CUDA kernels known"
        return {}


def _load(backend: str) -> tuple[ModuleType | None, str | None]:
    """(the library, None) if ``backend``'s kernels are there, else (None, reason); cached."""
    with _lock:
        if backend not in _cache:
            if MODULE not in _cache:
                _cache[MODULE] = _import_library()
            module, error = _cache[MODULE]
            if module is not None and backend == "ext-cuda":
                error = _cuda_reason(module)
                module = module if error is None else None
            _cache[backend] = (module, error)
        return _cache[backend]


def refresh() -> None:
    """Forget cached import results (after a rebuild in the same process)."""
    with _lock:
        _cache.clear()


def available(backend: str) -> bool:
    """True if the library imports with ``backend``'s kernels."""
    if backend not in BACKENDS:
        return False
    return _load(backend)[0] is not None


def error(backend: str) -> str | None:
    """Why ``backend``'s kernels are not there (None when they are)."""
    if backend not in BACKENDS:
        return f"unknown backend {backend!r}"
    return _load(backend)[1]


def status() -> dict[str, dict[str, Any]]:
    """Every compiled backend: built or not, where, ISA / threads or CUDA devices, the error.

    Example: ``{"ext-cpu": {"built": True, "path": ".../_ext...so", "isa": "avx512f",
    "threads": 2, "error": None, ...}, "ext-cuda": {"built": False, "error": "not built:
    torch 2.13.0+cpu has no CUDA", ...}}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for backend in BACKENDS:
        module, error = _load(backend)
        entry: dict[str, Any] = {
            "built": module is not None,
            "module": MODULE,
            "path": getattr(module, "__file__", None) if module is not None else None,
            "error": error,
        }
        if module is not None:
            describe = module.info if backend == "ext-cpu" else module.cuda_info
            try:
                info = dict(describe())
            except Exception as exc:
                entry["error"] = (
                    f"{MODULE} {describe.__name__}() failed: {type(exc).__name__}: {exc}"
                )
            else:
                entry.update({k: v for k, v in info.items() if k not in entry})
                entry["note"] = _version_note(info.get("torch_built_against"))
        out[backend] = entry
    return out


# the dispatch keys an op of the library registers: its front (argument checks), its
# kernels per device, and its fake kernel (qtrain/ops/fakes.py registers it as Meta)
KERNEL_KEYS = {"front": "BackendSelect", "cpu": "CPU", "cuda": "CUDA", "fake": "Meta"}


def op_kernels() -> dict[str, list[str]]:
    """Each op of the loaded library with what it registers (front, cpu, cuda, fake).

    Empty when the library is not built. Example: ``{"qspmm": ["front", "cpu", "fake"]}``.
    """
    import torch

    if not available("ext-cpu"):
        return {}
    from qtrain.ops import fakes

    return {
        name: [
            part
            for part, key in KERNEL_KEYS.items()
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"qtrain::{name}", key)
        ]
        for name in sorted(fakes.defined_ops())
    }


def library_problems() -> list[str]:
    """What the loaded library lacks: an op without its front, a CPU kernel, a fake kernel
    or (in a CUDA build) a CUDA kernel, and ops it should define but does not."""
    from qtrain.ops import fakes

    kernels = op_kernels()
    if not kernels:
        return []
    needed = ["front", "cpu", "fake", *(["cuda"] if available("ext-cuda") else [])]
    problems = [f"op {name} is not defined" for name in sorted(fakes.FAKES.keys() - kernels)]
    problems += [f"op {name} has no fake kernel" for name in sorted(kernels.keys() - fakes.FAKES)]
    for name, parts in kernels.items():
        missing = [part for part in needed if part not in parts]
        if missing and name in fakes.FAKES:
            problems.append(f"op {name} has no {', no '.join(missing)}")
    return problems


def _version_note(built_against: object) -> str | None:
    """Say so when the library was compiled against another torch than the one running."""
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
    """The op library (its CPU kernels are there), or QtrainError saying how to build it."""
    return _require("ext-cpu")


def ext_cuda() -> ModuleType:
    """The op library with its CUDA kernels, or QtrainError saying why they are not there."""
    return _require("ext-cuda")


# One call per backend that must raise ValueError, made before any device is touched, so
# it runs on machines without a GPU too. On an H100 machine an extension built with a
# compiler other than torch's died with SIGSEGV on every C++ exception; an import check
# cannot see that, only a raise can. The CPU probe is an op whose front refuses its
# argument (through the dispatcher, as every user call goes); the CUDA probe raises from
# code nvcc compiled, whose host compiler may be another one.
ERROR_PROBES: dict[str, str] = {
    "ext-cpu": "import torch, qtrain._ext; torch.ops.qtrain.quantize_symmetric(torch.ones(3), 9)",
    "ext-cuda": "import qtrain._ext as m; m.cuda_raise_value_error()",
}
_PROBE = """
import sys
try:
    exec(sys.argv[1])
except ValueError:
    sys.exit(0)
except BaseException as exc:
    print(f"{type(exc).__name__}: {exc}"[:300])
    sys.exit(3)
print("it returned without raising")
sys.exit(4)
"""


def check_error_path(backend: str, probe: str | None = None, timeout: float = 120) -> str | None:
    """None if an op of ``backend`` that must raise ValueError does so; else what happened.

    The call runs in a child process, so a build that crashes on every C++
    exception is reported (with the compilers involved) instead of killing
    the caller. ``probe`` replaces the backend's call (tests use it).
    """
    code = probe if probe is not None else ERROR_PROBES[backend]
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, code],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"{MODULE}: an op that must raise did not return within {timeout:.0f} s"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return (
            f"{MODULE} ({backend}) crashed ({name}) when an op raised an error, so any bad argument "
            f"would kill the process; {_crash_cause(backend)}"
        )
    detail = (done.stdout.strip() or done.stderr.strip() or "no output").splitlines()[-1]
    return f"{MODULE} ({backend}): an op that must raise ValueError did not ({detail})"


def _crash_cause(backend: str) -> str:
    """Why a build dies on a raise, as far as can be seen, and what to do about it."""
    module, _ = _load(backend)
    path = getattr(module, "__file__", None)
    if path is not None and _carries_own_cxx_runtime(path):
        return (
            "it carries its own copy of the C++ runtime (libstdc++ linked in statically, "
            "because its compiler has no libstdc++.so), and that copy's streams crash on the "
            f"locale torch's runtime set up when an error message is formatted; "
            f"{_compilers(backend)}; rebuild with a compiler that has libstdc++.so "
            "(`make build` picks /usr/bin/g++ itself when the configured one has none)"
        )
    return (
        f"{_compilers(backend)}; rebuild it with the compiler torch was built with or the "
        "system's (e.g. CXX=/usr/bin/g++ make build)"
    )


def _carries_own_cxx_runtime(path: str) -> bool:
    """:func:`cxx_runtime_owner` is ``path`` itself, asked in a child process: loading such
    a library beside torch's runtime can abort the process that loads it."""
    code = (
        "import sys; from qtrain.ops.backends import cxx_runtime_owner as o; print(o(sys.argv[1]))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, path],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    owner = (done.stdout.strip().splitlines() or [""])[0]
    return bool(owner) and os.path.realpath(owner) == os.path.realpath(path)


def _compilers(backend: str) -> str:
    """Which compiler built the extension and which built torch, as far as they are known."""
    import torch

    module, _ = _load(backend)
    built = _info(module).get("compiler") if module is not None else None
    torch_line = next(
        (
            line.strip(" -")
            for line in torch.__config__.show().splitlines()
            if line.strip(" -").startswith(("GCC", "clang", "MSVC"))
        ),
        "unknown",
    )
    runtime = ", ".join(runtime_libraries()) or "not readable here"
    return (
        f"built with {built or 'an unknown compiler'}, torch built with {torch_line}, "
        f"C++ runtime loaded: {runtime}"
    )


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def cxx_runtime_owner(path: str) -> str | None:
    """The file whose ``__cxa_throw`` the shared library at ``path`` throws with (None:
    unknown, or it throws nothing).

    A healthy build names libstdc++.so.6, the runtime torch catches with; a build
    whose compiler had only libstdc++.a names itself. Such a library crashed on
    every raise on the H100 machine (its /opt/gcc has no libstdc++.so).
    """
    try:
        # dlsym through the library's own handle looks in it first, then in what it needs
        address = ctypes.cast(ctypes.CDLL(path)["__cxa_throw"], ctypes.c_void_p).value
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not address or not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)


def runtime_libraries() -> list[str]:
    """The C++ runtime libraries this process has mapped (libstdc++, libgcc_s, libgomp).

    A build that dies on every raise most likely unwinds with a runtime other than
    the one its compiler targets (the H100 machine's /opt/gcc against the system's
    libstdc++); naming the files loaded is where finding that out starts.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:  # not Linux
        return []
    wanted = ("libstdc++", "libgcc_s", "libgomp")
    return sorted(path for path in paths if any(name in Path(path).name for name in wanted))


def main() -> int:
    """``python -m qtrain.ops`` (run by ``make build``): every built backend raises
    properly when an op is given a bad argument; status 1 naming the cause otherwise."""
    failed = False
    for backend in BACKENDS:
        if not available(backend):
            continue
        problem = check_error_path(backend)
        failed |= problem is not None
        print(f"{MODULE} ({backend}): {problem or 'built, and an op that must raise does raise'}")
    return 1 if failed else 0
