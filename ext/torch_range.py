"""Check the torch versions qtrain supports: build against each, prove the error path, test.

``make torch-range`` runs it. For each entry of SUPPORTED it makes (once, then
reuses) a virtual environment under ``~/.cache/qtrain/torch-range/`` with that
torch from PyPI and the rest of ``requirements.lock``, copies the working tree
to ``build/torch-<version>/``, installs it there (editable, which builds
the op library against that torch), checks that an op given a bad argument
raises instead of crashing, and runs the tests the entry names. PyPI's Linux wheels of torch are its CUDA
builds; they import and run on a machine without a GPU.

This machine's pip configuration pins torch to the local wheels (find-links
and a constraint file): the environments are made with ``PIP_CONFIG_FILE``
set to the null device, so pip sees PyPI alone.

Exit status 0 when every version builds, raises properly and passes its tests.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cuda_build import ROOT, copy_tree

CACHE = Path.home() / ".cache" / "qtrain" / "torch-range"
OP_TESTS = ("tests/ops", "tests/test_build.py")


@dataclass(frozen=True)
class Supported:
    torch: str  # a version, or "newest" (whatever PyPI serves today)
    tests: tuple[str, ...]  # pytest arguments
    why: str


SUPPORTED = (
    Supported("2.4.1", OP_TESTS, "the last torch DGL's own CUDA wheels support"),
    Supported("pinned", ("-m", "not slow"), "requirements.lock's torch, what CI runs"),
    Supported("newest", ("-m", "not slow"), "the newest torch on PyPI"),
)


def log(message: str) -> None:
    print(f"torch-range: {message}", flush=True)


def locked() -> list[str]:
    """requirements.lock's pins, torch aside."""
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    return [line for line in lines if line and not line.startswith(("#", "torch=="))]


def pinned_torch() -> str:
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    return next(line.split("==")[1] for line in lines if line.startswith("torch=="))


def environment(version: str) -> Path:
    """The Python of a virtual environment with torch ``version`` (made once)."""
    spec = "torch" if version == "newest" else f"torch=={version}"
    venv = CACHE / f"venv-{version}"
    stamp = venv / ".qtrain-spec"
    wanted = "\n".join([spec, *locked()])
    python = venv / "bin" / "python"
    fresh = version != "newest"  # "newest" is re-resolved every run
    if fresh and stamp.is_file() and stamp.read_text() == wanted and python.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    for key in ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        env.pop(key, None)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--only-binary=:all:", spec, *locked()],
        check=True,
        env=env,
    )
    stamp.write_text(wanted)
    return python


def run(python: Path, tree: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QTRAIN_BUILD_CUDA": "0", **extra}
    return subprocess.run(
        [str(python), *args], cwd=tree, env=env, capture_output=True, text=True, check=False
    )


def check(entry: Supported) -> tuple[str, bool]:
    """One version: (a line for the table, passed)."""
    version = pinned_torch() if entry.torch == "pinned" else entry.torch
    python = environment(version)
    found = run(python, ROOT, "-c", "import torch; print(torch.__version__)").stdout.strip()
    tree = copy_tree(ROOT / "build" / f"torch-{entry.torch}")
    start = time.perf_counter()
    # editable, as make build does: the built-in plugins install as qtrain.plugins from plugins/
    built = run(
        python,
        tree,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-e",
        ".",
    )
    (tree / "build").mkdir(exist_ok=True)
    (tree / "build" / "build.log").write_text(built.stdout + built.stderr)
    if built.returncode != 0:
        tail = (built.stdout + built.stderr).strip().splitlines()[-5:]
        return f"torch {found}: build FAILED: {' | '.join(tail)}", False
    seconds = time.perf_counter() - start
    probe = run(python, tree, "-m", "qtrain.ops.backends")
    if probe.returncode != 0:
        return f"torch {found}: built, but {probe.stdout.strip()}", False
    tests = run(python, tree, "-m", "pytest", "-q", "-p", "no:cacheprovider", *entry.tests)
    (tree / "build" / "tests.log").write_text(tests.stdout + tests.stderr)
    summary = (tests.stdout.strip().splitlines() or ["no output"])[-1]
    chosen = " ".join(entry.tests)
    return (
        f"torch {found} ({entry.why}): built in {seconds:.0f} s, error path ok, "
        f"pytest {chosen}: {summary}",
        tests.returncode == 0,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        nargs="*",
        choices=[e.torch for e in SUPPORTED],
        help="check these entries only (default: all)",
    )
    args = parser.parse_args(argv)
    lines, ok = [], True
    for entry in SUPPORTED:
        if args.only and entry.torch not in args.only:
            continue
        log(f"checking torch {entry.torch} ...")
        line, passed = check(entry)
        ok &= passed
        lines.append(("PASS " if passed else "FAIL ") + line)
        log(lines[-1])
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
