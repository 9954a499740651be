"""The build: sources that can compile side by side, and builds that survive a raised error."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from qtrain.cli import app
from qtrain.ops import backends

ROOT = Path(__file__).resolve().parents[1]


def _setup_module() -> ModuleType:
    """setup.py as a module: its source lists, without running setup()."""
    spec = importlib.util.spec_from_file_location("qtrain_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_two_sources_compile_to_one_object_file() -> None:
    setup = _setup_module()
    cpu, cuda = setup.cpu_sources(), setup.cuda_sources()
    assert "ext/module.cpp" in cpu and "ext/cuda/module_cuda.cpp" in cuda
    assert any(s.endswith(".cu") for s in cuda) and not any(s.endswith(".cu") for s in cpu)
    assert setup.object_clashes(cpu + cuda) == []  # a CUDA build compiles both


def test_every_op_has_a_front_and_a_kernel_per_device_side_by_side() -> None:
    """ext/ops/<op>.cpp, ext/cpu/<op>_kernel.cpp, ext/cuda/<op>_kernel.cu: one op, one name."""
    from qtrain.ops.fakes import FAKES

    ext = ROOT / "ext"
    fronts = {p.stem for p in (ext / "ops").glob("*.cpp")}
    assert fronts == set(FAKES)
    for device, suffix in (("cpu", ".cpp"), ("cuda", ".cu")):
        kernels = {
            p.name.removesuffix("_kernel" + suffix)
            for p in (ext / device).glob("*_kernel" + suffix)
        }
        assert kernels == fronts, f"{device}: no kernel file for {sorted(fronts - kernels)}"


def test_object_clashes_finds_what_ninja_refused() -> None:
    """ext/compress_cuda.cpp and ext/compress_cuda.cu both became compress_cuda.o."""
    setup = _setup_module()
    sources = ["ext/compress_cuda.cpp", "ext/gemm_cuda.cu", "ext/compress_cuda.cu"]
    assert setup.object_clashes(sources) == [("ext/compress_cuda.cpp", "ext/compress_cuda.cu")]
    with pytest.raises(SystemExit, match=r"compress_cuda\.cpp and ext/compress_cuda\.cu"):
        setup._check_objects("qtrain._ext", sources)


def test_the_cpu_extension_raises_instead_of_crashing() -> None:
    """A missing build fails here: CI must build qtrain._ext."""
    assert backends.available("ext-cpu"), backends.error("ext-cpu")
    assert backends.check_error_path("ext-cpu") is None


@pytest.mark.parametrize(
    ("probe", "expected"),
    [
        (
            "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
            r"qtrain\._ext \(ext-cpu\) crashed \(SIGSEGV\) when an op raised .* built with .*, torch "
            r"built with .*, C\+\+ runtime loaded: .*; rebuild it",
        ),
        ("import os, signal; os.kill(os.getpid(), signal.SIGABRT)", r"crashed \(SIGABRT\)"),
        ("x = 1", "did not .it returned without raising"),
        ("raise TypeError('no')", r"did not \(TypeError: no\)"),
    ],
)
def test_error_path_check_names_what_went_wrong(probe: str, expected: str) -> None:
    found = backends.check_error_path("ext-cpu", probe)
    assert found is not None
    assert re.search(expected, found), found


def test_doctor_fails_on_a_build_that_crashes_when_an_op_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reason = "qtrain._ext crashed (SIGSEGV) when an op raised an error"
    monkeypatch.setattr(backends, "check_error_path", lambda name: reason)
    runner = CliRunner()
    result = runner.invoke(app, ["doctor", "--json"])
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.exit_code == 1 and report["healthy"] is False
    assert report["extensions"]["ext-cpu"]["error_path"] == reason
    table = runner.invoke(app, ["doctor"])
    assert table.exit_code == 1 and "unsafe build" in table.stdout


def _fake_compiler(tmp_path: Path, prints: str) -> str:
    """A "compiler" that answers -print-file-name=libstdc++.so with ``prints``."""
    script = tmp_path / "fake-g++"
    script.write_text(f"#!/bin/sh\necho '{prints}'\n")
    script.chmod(0o755)
    return str(script)


def test_a_compiler_without_a_shared_cxx_runtime_is_replaced_by_the_systems(
    tmp_path: Path,
) -> None:
    """The H100 machine's /opt/gcc answers with the bare name: it has no libstdc++.so."""
    setup = _setup_module()
    assert setup.shared_cxx_runtime([_fake_compiler(tmp_path, "libstdc++.so")]) is False
    assert setup.shared_cxx_runtime([str(tmp_path / "missing-g++")]) is None
    environ = {"CC": "/opt/gcc/bin/gcc", "CXX": _fake_compiler(tmp_path, "libstdc++.so")}
    note = setup.choose_compilers(environ)
    assert environ == {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}
    assert note is not None and "no shared libstdc++" in note and "/usr/bin/g++" in note


def test_a_compiler_with_a_shared_cxx_runtime_is_kept(tmp_path: Path) -> None:
    setup = _setup_module()
    runtime = tmp_path / "libstdc++.so"
    runtime.write_bytes(b"")
    environ = {"CXX": _fake_compiler(tmp_path, str(runtime))}
    assert setup.choose_compilers(environ) is None
    assert environ == {"CXX": _fake_compiler(tmp_path, str(runtime))}
    # the system compiler CI builds with has one
    assert setup.shared_cxx_runtime(["/usr/bin/g++"]) is True


def test_a_library_that_carries_its_own_cxx_runtime_is_named(tmp_path: Path) -> None:
    """What /opt/gcc produced: libstdc++.a linked into the library, __cxa_throw its own."""
    source = tmp_path / "thrower.cpp"
    source.write_text(
        '#include <stdexcept>\nextern "C" void boom() { throw std::invalid_argument("x"); }\n'
    )
    own, shared = tmp_path / "own.so", tmp_path / "shared.so"
    for out, flags in ((own, ["-static-libstdc++"]), (shared, [])):
        cmd = ["/usr/bin/g++", "-shared", "-fPIC", str(source), "-o", str(out), *flags]
        subprocess.run(cmd, check=True, capture_output=True)
    assert backends.cxx_runtime_owner(str(own)) == str(own)
    assert backends._carries_own_cxx_runtime(str(own))
    assert not backends._carries_own_cxx_runtime(str(shared))
    assert "libstdc++.so" in Path(backends.cxx_runtime_owner(str(shared)) or "").name
    built = backends.status()["ext-cpu"]["path"]
    assert "libstdc++.so" in Path(backends.cxx_runtime_owner(built) or "").name


def test_a_crash_from_an_own_cxx_runtime_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H100 such a build died formatting the error message (SIGSEGV in the static
    copy's ostream): the crash report says so and how to rebuild."""
    monkeypatch.setattr(backends, "_carries_own_cxx_runtime", lambda path: True)
    probe = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    found = backends.check_error_path("ext-cpu", probe)
    assert found is not None
    assert re.search(r"crashed \(SIGSEGV\).*its own copy of the C\+\+ runtime", found), found
    assert "libstdc++.so" in found and "/usr/bin/g++" in found


def test_every_package_folder_is_installed() -> None:
    """A wheel holds only the packages pyproject lists: a folder left out is missing for
    every user who installs qtrain without ``-e`` (qtrain.route and qtrain.compare once were)."""
    from qtrain.recipe import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        "qtrain." + ".".join(p.parent.relative_to(ROOT / "qtrain").parts)
        for p in (ROOT / "qtrain").rglob("__init__.py")
    } | {
        "qtrain.plugins." + ".".join(p.parent.relative_to(ROOT / "plugins").parts)
        for p in (ROOT / "plugins").rglob("__init__.py")
    }
    folders = {name.rstrip(".") for name in folders}
    assert folders == listed, (
        f"not installed: {sorted(folders - listed)}; gone: {sorted(listed - folders)}"
    )
