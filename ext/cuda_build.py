"""Build the whole op library with its CUDA kernels in a copy of the working tree, import it,
prove its error path.

Run it with the Python whose torch has CUDA (``make cuda-build`` uses the side
environment ``.venv-cuda`` with PyPI's CUDA build of torch; ``make gpu-check``
the GPU machine's own, with ``--in-place``). No GPU is needed: nvcc compiles
every kernel, and the extension imports and raises without a device. Steps:

1. copy the tracked and untracked-but-not-ignored files to ``build/cuda-tree``
   (keeping its ``build/`` folder, so ninja recompiles only what changed); with
   ``--in-place``, build in the checkout itself instead, from scratch (its
   ``build/temp.*`` objects and ``qtrain/_ext*.so`` removed first);
2. ``QTRAIN_BUILD_CUDA=1 python setup.py build_ext --inplace`` there;
3. in a child process: import ``qtrain._ext``, check that every op of
   ``torch.ops.qtrain`` has its front, a CPU kernel, a CUDA kernel and a fake kernel
   (``qtrain.ops.backends.library_problems``), and make the CPU and the CUDA code raise
   ValueError (``qtrain.ops.backends.check_error_path``).

If step 3 finds a build that crashes when an op raises (an extension built
with another compiler than torch's did so on every C++ exception on an H100
machine), the build is redone once with the system compiler (``/usr/bin/g++``)
and the script says which compiler gave a safe build. Exit status 0 only for a
build that imports and raises properly.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("ext-cpu", "ext-cuda")
COPY = ROOT / "build" / "cuda-tree"

# runs inside the built tree: what was built, and whether an op that must raise does
CHECK = """
import json
from qtrain.ops import backends
report = {}
for name in backends.BACKENDS:
    error = backends.error(name)
    report[name] = {"import": error or "ok",
                    "error_path": backends.check_error_path(name) if error is None else None}
report["ext-cuda"]["info"] = backends.status()["ext-cuda"]
report["ops"] = backends.op_kernels()
report["problems"] = backends.library_problems()
print(json.dumps(report))
"""


def log(message: str) -> None:
    print(f"cuda-build: {message}", flush=True)


def copy_tree(dest: Path = COPY) -> Path:
    """The working tree's files into ``dest``, which keeps only its own build/ folder."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in dest.iterdir():
        if entry.is_dir() and entry.name != "build":
            shutil.rmtree(entry)
        elif not entry.is_dir():
            entry.unlink()
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            target = dest / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)  # keeps mtimes: ninja skips unchanged sources
    return dest


def clean(tree: Path) -> None:
    """No object or extension of an earlier build left in ``tree``."""
    for stale in (tree / "build").glob("temp.*"):
        shutil.rmtree(stale)
    for so in (tree / "qtrain").glob("_ext*.so"):  # _ext_cuda*.so: what older builds left
        so.unlink()


def setup_module() -> ModuleType:
    """setup.py as a module, for its compiler choice (made here too, so this script
    reports the compiler it used) and the system compilers it falls back to."""
    spec = importlib.util.spec_from_file_location("qtrain_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    return setup


def build(tree: Path, env: dict[str, str]) -> bool:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    (tree / "build").mkdir(exist_ok=True)
    (tree / "build" / "cuda-build.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        log(f"build failed (exit {done.returncode}); the end of its output:")
        print("\n".join((done.stdout + done.stderr).strip().splitlines()[-30:]), file=sys.stderr)
        return False
    log(f"built in {time.perf_counter() - start:.0f} s (log: {tree / 'build' / 'cuda-build.log'})")
    return True


def check(tree: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=tree, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"cuda-build: the import check failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def safe(report: dict) -> bool:
    """Both backends import and raise properly."""
    return all(report[b]["import"] == "ok" and report[b]["error_path"] is None for b in BACKENDS)


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-place", action="store_true", help="build in the checkout, cleanly")
    args = parser.parse_args(argv)

    if not torch.version.cuda:
        log(
            f"{sys.executable} has torch {torch.__version__}, without CUDA; run it with a CUDA torch"
        )
        return 2
    env = {**os.environ, "QTRAIN_BUILD_CUDA": "1"}
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
    if not env.get("CUDA_HOME") and Path("/usr/local/cuda/bin/nvcc").exists():
        env["CUDA_HOME"] = "/usr/local/cuda"
    tree = ROOT if args.in_place else copy_tree()
    if args.in_place:
        clean(tree)
    log(f"torch {torch.__version__}, CUDA {torch.version.cuda}, in {tree}")
    setup = setup_module()
    note = setup.choose_compilers(env)
    if note:
        log(note)
    if not build(tree, env):
        return 1
    report = check(tree)
    chosen = env.get("CXX", "the default compiler")
    system = setup.SYSTEM_COMPILERS
    if not safe(report) and all(Path(p).exists() for p in system):
        log(f"unsafe build with {chosen}: {json.dumps(report)}; rebuilding with {system[1]}")
        clean(tree)
        env["CC"], env["CXX"] = system
        chosen = system[1]
        if not build(tree, env):
            return 1
        report = check(tree)
    for name in BACKENDS:
        result = report[name]
        log(f"{name}: import {result['import']}, error path {result['error_path'] or 'ok'}")
    log(f"torch.ops.qtrain: {len(report['ops'])} ops; CUDA: {report['ext-cuda'].get('info')}")
    for problem in report["problems"]:
        log(f"op library: {problem}")
    if not safe(report) or report["problems"]:
        log("FAILED: a build that does not import, lacks a kernel, or crashes when an op raises")
        return 1
    log(
        f"ok: the whole op library builds with its CUDA kernels, imports and raises properly "
        f"(compiler: {chosen})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
