"""Compile every CUDA source of qtrain._ext without linking (``make cuda-check``).

Quick feedback while writing a kernel: each ``ext/cuda/*.cu`` is compiled with
nvcc for every architecture the library ships (sm_80, sm_90) and each host-side
``ext/cuda/*.cpp`` with the host compiler, against the torch headers of the
Python running it (the CPU wheel ships ATen/cuda and c10/cuda). It cannot see
what only a whole build sees (two sources compiling to one object file, link
errors): ``make cuda-build`` builds the whole library, and CI runs that.

Exit status 0 when everything compiles, 1 with nvcc's messages otherwise, 2 when
nvcc is missing (set ``QTRAIN_CUDA_CHECK=skip-missing-nvcc`` to make that 0).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXT = ROOT / "ext"
# the architectures setup.py builds for (TORCH_CUDA_ARCH_LIST default there)
ARCHS = ("80", "90")
NVCC_FLAGS = (
    "-std=c++20",
    "-O3",
    "--fmad=false",
    "--expt-relaxed-constexpr",
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "-Xcompiler=-fPIC",
    "-Werror=all-warnings",
)
DEFINES = ("-DTORCH_EXTENSION_NAME=_ext", "-DTORCH_API_INCLUDE_EXTENSION_H", "-DQTRAIN_WITH_CUDA=1")


def find_nvcc() -> str | None:
    """nvcc from CUDA_HOME / CUDA_PATH, else from PATH."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def includes(nvcc: str) -> list[str]:
    """-I flags: ext/, torch's headers, Python's, and the CUDA toolkit's."""
    from torch.utils import cpp_extension

    dirs = [str(EXT), *cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    return [f"-I{d}" for d in dirs] + toolkit_includes(nvcc)


def toolkit_includes(nvcc: str) -> list[str]:
    """The CUDA toolkit's own -I / -isystem flags, as nvcc reports them (nvcc may be a wrapper)."""
    proc = subprocess.run(
        [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
        capture_output=True,
        text=True,
    )
    flags: list[str] = []
    for line in (proc.stdout + proc.stderr).splitlines():
        for key in ("INCLUDES=", "SYSTEM_INCLUDES="):
            if line.startswith("#$ " + key):
                flags += shlex.split(line[len("#$ " + key) :])
    return flags


def commands(nvcc: str, out: Path, only: str = "") -> list[tuple[str, list[str]]]:
    """(source, command) for every CUDA source and host-side file whose name contains ``only``."""
    inc = includes(nvcc)
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    jobs = []
    for cu in sorted(p for p in EXT.glob("cuda/*.cu") if only in p.name):
        obj = out / (cu.stem + ".cu.o")
        jobs.append(
            (cu.name, [nvcc, *NVCC_FLAGS, *gencode, *DEFINES, *inc, "-c", str(cu), "-o", str(obj)])
        )
    cxx = os.environ.get("CXX", "c++")
    for cpp in sorted(p for p in EXT.glob("cuda/*.cpp") if only in p.name):
        obj = out / (cpp.stem + ".o")
        flags = ["-std=c++20", "-O1", "-fPIC", "-Wall", "-Werror", "-Wno-unused-function"]
        jobs.append((cpp.name, [cxx, *flags, *DEFINES, *inc, "-c", str(cpp), "-o", str(obj)]))
    return jobs


def main() -> int:
    nvcc = find_nvcc()
    if nvcc is None:
        msg = "cuda-check: nvcc not found (set CUDA_HOME or put nvcc on PATH)"
        print(msg, file=sys.stderr)
        return 0 if os.environ.get("QTRAIN_CUDA_CHECK") == "skip-missing-nvcc" else 2
    with tempfile.TemporaryDirectory(prefix="qtrain-cuda-check-") as tmp:
        # `python ext/cuda_check.py qspmm`: only the sources whose name contains "qspmm"
        jobs = commands(nvcc, Path(tmp), sys.argv[1] if len(sys.argv) > 1 else "")
        if not jobs:
            print("cuda-check: no CUDA sources in ext/", file=sys.stderr)
            return 1
        workers = max(1, min(len(jobs), os.cpu_count() or 1))

        def run(job: tuple[str, list[str]]) -> tuple[str, subprocess.CompletedProcess[str]]:
            name, cmd = job
            return name, subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)

        failed = 0
        with ThreadPoolExecutor(workers) as pool:
            for name, proc in pool.map(run, jobs):
                if proc.returncode == 0:
                    print(f"cuda-check: ok      {name}")
                else:
                    failed += 1
                    print(
                        f"cuda-check: FAILED  {name}\n{proc.stdout}{proc.stderr}", file=sys.stderr
                    )
    archs = ", ".join(f"sm_{a}" for a in ARCHS)
    print(f"cuda-check: {len(jobs) - failed}/{len(jobs)} sources compile ({archs}, {nvcc})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
