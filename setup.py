"""Build qtrain's op library against the torch found in the environment.

Metadata lives in pyproject.toml; this file declares the extension
``qtrain._ext``: the torch custom ops ``torch.ops.qtrain.*`` (see ext/README.md),
and puts ``qtrain_dgl_hook.pth`` in site-packages (see ``HOOK_PTH``).

* Always: ``ext/module.cpp`` (pybind11: build facts, ISA choice), the op fronts
  ``ext/ops/*.cpp`` (schemas and argument checks) and the CPU kernels
  ``ext/cpu/*.cpp``; OpenMP, -O3, -ffp-contract=off (no FMA contraction, so
  results match the pure-PyTorch reference bit for bit), ISA variants chosen at
  run time inside the code.
* With CUDA (torch has CUDA, nvcc is found): also the CUDA kernels
  ``ext/cuda/*.cu`` and their host files ``ext/cuda/*.cpp``, in the same library,
  so one import registers every kernel of every op.

Build in place with ``pip install --no-build-isolation --no-deps -e .`` (what
``make build`` runs). Environment:

* ``QTRAIN_EXT_JOBS`` or ``MAX_JOBS``: parallel compile jobs (ninja).
* ``QTRAIN_BUILD_CUDA``: ``auto`` (default), ``0`` (never), ``1`` (fail if impossible).
* ``TORCH_CUDA_ARCH_LIST``: GPU architectures (default ``8.0;9.0+PTX``).

Without a GPU build of torch, ``make cuda-check`` (``ext/cuda_check.py``) still
compiles every CUDA source, without linking; ``make cuda-build`` builds the whole
library against PyPI's CUDA torch.
"""

from __future__ import annotations

import glob
import os
import shlex
import subprocess
import sys
import sysconfig
from collections.abc import MutableMapping
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))
EXT_DIR = "ext"
SYSTEM_COMPILERS = ("/usr/bin/gcc", "/usr/bin/g++")
CUDA_ARCHS = "8.0;9.0+PTX"  # ext/cuda_check.py compiles the same two (make cuda-check)

# Installed at the root of site-packages by both a wheel and an editable install, so
# that a plain `import dgl` gets qtrain._compat's adaptations (see qtrain_dgl_hook.py).
# Python runs a .pth line that starts with "import" at start-up, in file-name order:
# "qtrain..." comes after "__editable__...", whose finder an editable install needs
# to find qtrain_dgl_hook.
HOOK_PTH = "qtrain_dgl_hook.pth"
HOOK_LINE = "import qtrain_dgl_hook; qtrain_dgl_hook.install()\n"

try:
    import torch
    from torch.utils import cpp_extension
except ImportError as exc:  # pragma: no cover - torch is required to build
    raise SystemExit(
        "qtrain: building the extension needs torch importable in this environment "
        "(install torch first, then run pip with --no-build-isolation): " + str(exc)
    ) from exc


def _log(msg: str) -> None:
    print(f"qtrain setup: {msg}", file=sys.stderr)


def _jobs() -> None:
    """Let QTRAIN_EXT_JOBS set MAX_JOBS, which torch's ninja builder reads."""
    jobs = os.environ.get("QTRAIN_EXT_JOBS")
    if jobs and not os.environ.get("MAX_JOBS"):
        os.environ["MAX_JOBS"] = jobs
    if os.environ.get("MAX_JOBS"):
        _log(f"parallel compile jobs: {os.environ['MAX_JOBS']}")


def shared_cxx_runtime(compiler: list[str]) -> bool | None:
    """Whether ``compiler`` links the C++ runtime as the shared libstdc++.so (None: unknown).

    A compiler without libstdc++.so links libstdc++.a into the extension: the
    library then carries its own copy of the exception runtime (``__cxa_throw``
    and the rest, bound inside it), and an exception an op throws is caught by
    torch's runtime with the other copy's state. The process dies on every raise:
    this is what the H100 machine's ``/opt/gcc`` (GCC 13.3, set as CC / CXX there,
    no libstdc++.so) did.
    """
    try:
        found = subprocess.run(
            [*compiler, "-print-file-name=libstdc++.so"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    # a compiler that cannot find the file prints the bare name back
    return os.path.isabs(found) and os.path.exists(found)


def choose_compilers(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Keep the configured C++ compiler if it links the shared C++ runtime, else switch
    ``CC`` / ``CXX`` (nvcc's host compiler too) to the system's; returns what was done."""
    configured = environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
    if shared_cxx_runtime(shlex.split(configured)) is not False:
        return None
    cc, cxx = SYSTEM_COMPILERS
    if not (os.path.exists(cxx) and shared_cxx_runtime([cxx])):
        raise SystemExit(
            f"qtrain: {configured} has no shared libstdc++ (libstdc++.so), so qtrain._ext would "
            "carry its own C++ runtime and crash on every error an op raises; set CXX and CC "
            "to a compiler that has one (torch's own: GCC, with libstdc++ installed)"
        )
    environ["CC"], environ["CXX"] = cc, cxx
    return (
        f"{configured} has no shared libstdc++, so qtrain._ext would carry its own C++ runtime "
        f"and crash on every error an op raises: building with {cxx} instead"
    )


def _rel(paths: list[str]) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def _torch_lib_dir() -> str:
    return os.path.join(os.path.dirname(torch.__file__), "lib")


def _glob(*patterns: str) -> list[str]:
    return _rel(
        [p for pattern in patterns for p in glob.glob(os.path.join(ROOT, EXT_DIR, pattern))]
    )


def cpu_sources() -> list[str]:
    """The sources of every build: the module, the op fronts and the CPU kernels."""
    return _glob("module.cpp", "ops/*.cpp", "cpu/*.cpp")


def cuda_sources() -> list[str]:
    """What a CUDA build adds: the CUDA kernels and their host-side files."""
    return _glob("cuda/*.cu", "cuda/*.cpp")


def object_clashes(sources: list[str]) -> list[tuple[str, str]]:
    """Pairs of sources that would compile to the same object file.

    torch's ninja build names each object after its source with the suffix
    replaced (ext/a.cpp and ext/a.cu both give ext/a.o), and ninja then stops
    with "multiple rules generate": the CUDA extension did not build on a GPU
    machine for that reason, while compiling file by file had passed.
    """
    seen: dict[str, str] = {}
    clashes = []
    for source in sources:
        stem = os.path.splitext(source)[0]
        if stem in seen:
            clashes.append((seen[stem], source))
        seen.setdefault(stem, source)
    return clashes


def _check_objects(name: str, sources: list[str]) -> None:
    clashes = object_clashes(sources)
    if clashes:
        pairs = "; ".join(f"{a} and {b}" for a, b in clashes)
        raise SystemExit(
            f"qtrain: {name} cannot build: these sources compile to the same object file: "
            f"{pairs}; rename one of each pair"
        )


def _nvcc() -> str | None:
    """nvcc under torch's CUDA_HOME (torch finds it from CUDA_HOME / CUDA_PATH / PATH)."""
    home = cpp_extension.CUDA_HOME
    if not home:
        return None
    for name in ("nvcc", "nvcc.exe"):
        path = os.path.join(home, "bin", name)
        if os.path.exists(path):
            return path
    return None


def _cuda_reason(mode: str) -> str | None:
    """Why this build has no CUDA kernels (None: it has them); raises with QTRAIN_BUILD_CUDA=1."""
    if mode in ("0", "no", "off", "false"):
        return "QTRAIN_BUILD_CUDA=0"
    reason = None
    if not torch.version.cuda:
        reason = f"torch {torch.__version__} has no CUDA"
    elif _nvcc() is None:
        reason = "nvcc not found (torch found no CUDA_HOME; set CUDA_HOME or put nvcc on PATH)"
    elif not cuda_sources():
        reason = f"no CUDA sources ({EXT_DIR}/cuda/)"
    if reason is not None and mode in ("1", "yes", "on", "true"):
        raise SystemExit(f"qtrain: QTRAIN_BUILD_CUDA=1 but cannot build the CUDA kernels: {reason}")
    return reason


def _extension() -> object:
    """qtrain._ext: CPU kernels always, CUDA kernels too when this torch and nvcc allow."""
    mode = os.environ.get("QTRAIN_BUILD_CUDA", "auto").strip().lower()
    sources = cpu_sources()
    if not sources:
        raise SystemExit(f"qtrain: no C++ sources in {EXT_DIR}/")
    # -g0: no debug info (the .so drops from ~6 MB to well under 1 MB and builds faster)
    cxx = ["-O3", "-g0", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"]
    link = ["-fopenmp"]
    if sys.platform.startswith("linux"):
        # Find libc10/libtorch (and torch's own libgomp, so one OpenMP runtime is
        # loaded) even when qtrain._ext is imported before torch.
        link.append("-Wl,-rpath," + _torch_lib_dir())
    include = [os.path.join(ROOT, EXT_DIR)]
    reason = _cuda_reason(mode)
    if reason is not None:
        _log(f"CPU kernels only: {reason}")
        _check_objects("qtrain._ext", sources)
        return cpp_extension.CppExtension(
            name="qtrain._ext",
            sources=sources,
            include_dirs=include,
            extra_compile_args={"cxx": cxx},
            extra_link_args=link,
        )
    sources = sources + cuda_sources()
    _check_objects("qtrain._ext", sources)
    # sm_80 (A100) and sm_90 (H100 / H200) native, PTX for newer GPUs; a user's own list wins
    archs = os.environ.setdefault("TORCH_CUDA_ARCH_LIST", CUDA_ARCHS)
    _log(f"CPU and CUDA kernels, TORCH_CUDA_ARCH_LIST={archs}")
    return cpp_extension.CUDAExtension(
        name="qtrain._ext",
        sources=sources,
        include_dirs=include,
        define_macros=[("QTRAIN_WITH_CUDA", "1")],
        extra_compile_args={
            "cxx": [*cxx, f'-DQTRAIN_CUDA_ARCHS="{archs}"'],
            # no FMA contraction on device either, so CUDA results match the reference
            "nvcc": ["-O3", "--fmad=false", "-lineinfo"],
        },
        extra_link_args=link,
    )


class BuildPyWithHook(build_py):
    """build_py that also writes HOOK_PTH at the root of build_lib (wheel = site-packages)."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable wheel gets it from EditableWheelWithHook
            self.mkpath(self.build_lib)
            with open(os.path.join(self.build_lib, HOOK_PTH), "w", encoding="utf-8") as f:
                f.write(HOOK_LINE)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            outputs.append(os.path.join(self.build_lib, HOOK_PTH))
        return outputs


class _AddHookPth:
    """Wraps setuptools' editable strategy: whatever it writes, plus HOOK_PTH."""

    def __init__(self, strategy: object) -> None:
        self.strategy = strategy

    def __call__(self, wheel: object, files: list[str], mapping: dict[str, str]) -> None:
        self.strategy(wheel, files, mapping)  # type: ignore[operator]
        wheel.writestr(HOOK_PTH, HOOK_LINE.encode())  # type: ignore[attr-defined]

    def __enter__(self) -> _AddHookPth:
        self.strategy.__enter__()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> object:
        return self.strategy.__exit__(*exc)  # type: ignore[attr-defined]


class EditableWheelWithHook(editable_wheel):
    """editable_wheel (PEP 660, ``pip install -e .``) that also puts HOOK_PTH in the wheel.

    An editable wheel holds no build_lib files, only what setuptools' editable
    strategy writes into it: its ``__editable__`` .pth and finder. setuptools has no
    public way to add a file there, so this wraps ``_select_strategy`` (there since
    setuptools 64, when editable wheels came; checked with 84); a setuptools without
    it fails the install here rather than leaving the hook out (and
    tests/test_compat.py checks that the .pth is installed).
    """

    def run(self) -> None:
        if not callable(getattr(editable_wheel, "_select_strategy", None)):
            raise SystemExit(
                f"qtrain: this setuptools' editable_wheel has no _select_strategy, so an "
                f"editable install cannot add {HOOK_PTH}; install without -e, or with a "
                f"setuptools that has it (64 to 84 do)"
            )
        super().run()

    def _select_strategy(self, *args: Any, **kwargs: Any) -> Any:
        return _AddHookPth(super()._select_strategy(*args, **kwargs))


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    _jobs()
    switched = choose_compilers()
    if switched:
        _log(switched)
    setup(
        ext_modules=[_extension()],
        cmdclass={
            "build_ext": cpp_extension.BuildExtension,
            "build_py": BuildPyWithHook,
            "editable_wheel": EditableWheelWithHook,
        },
    )
