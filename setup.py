"""Build qtrain's op library against the torch found in the environment.

Metadata lives in pyproject.toml; this file only declares the extension
``qtrain._ext``: the torch custom ops ``torch.ops.qtrain.*`` (see ext/README.md).

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

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
EXT_DIR = "ext"
SYSTEM_COMPILERS = ("/usr/bin/gcc", "/usr/bin/g++")
CUDA_ARCHS = "8.0;9.0+PTX"  # ext/cuda_check.py compiles the same two (make cuda-check)

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


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    _jobs()
    switched = choose_compilers()
    if switched:
        _log(switched)
    setup(
        ext_modules=[_extension()],
        cmdclass={"build_ext": cpp_extension.BuildExtension},
    )
