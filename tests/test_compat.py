"""qtrain._compat and its import hook: a plain ``import dgl`` works in qtrain's environment.

Each check runs in a fresh interpreter (the venv's, as a user would start it), since
what is tested happens at start-up and on a process's first ``import dgl``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

HOOK = "qtrain_dgl_hook"
PTH = "qtrain_dgl_hook.pth"

# what a user's script sees: the hook waiting at start-up, then dgl imported with no qtrain
PLAIN_IMPORT = """
import json, os, sys
names = lambda: [type(f).__name__ for f in sys.meta_path]
start = {"modules": sorted(m for m in ("torch", "qtrain", "dgl") if m in sys.modules),
         "meta_path": names()}
IMPORT
import qtrain._compat as compat
graphbolt = sys.modules.get("dgl.graphbolt")
print(json.dumps({
    "start": start,
    "meta_path": names(),
    "dglbackend": os.environ.get("DGLBACKEND"),
    "stubbed": (graphbolt.__doc__ or "").startswith("Placeholder registered by qtrain"),
    "graphbolt_loads": compat._graphbolt_loads(),
    "ogb": "ogb" in sys.modules,
    "applied": compat.applied(),
}))
"""


def _env(**changes: str | None) -> dict[str, str]:
    """This process's environment without the variables under test, then ``changes``."""
    env = {k: v for k, v in os.environ.items() if k not in ("DGLBACKEND", "QTRAIN_NO_DGL_HOOK")}
    env.update({k: v for k, v in changes.items() if v is not None})
    return env


def _python(code: str, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=Path(__file__).parent,  # not the repository root: nothing found by accident
    )


def _report(import_line: str, env: dict[str, str]) -> dict[str, Any]:
    done = _python(PLAIN_IMPORT.replace("IMPORT", import_line), env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_adapted(report: dict[str, Any]) -> None:
    assert report["dglbackend"] == "pytorch"
    assert report["stubbed"] == (not report["graphbolt_loads"])
    applied = report["applied"]
    assert any(line.startswith("DGLBACKEND=pytorch") for line in applied), applied
    assert any("graphbolt" in line for line in applied) == report["stubbed"], applied
    assert any(line.startswith("ogb imported") for line in applied) == report["ogb"], applied
    assert "DglImportHook" not in report["meta_path"]  # it took itself out


def test_a_plain_import_dgl_gets_the_adaptations() -> None:
    report = _report("import dgl", _env())
    # at start-up: the hook first in line, and nothing heavy imported for it
    assert report["start"]["modules"] == []
    assert report["start"]["meta_path"][0] == "DglImportHook"
    _check_adapted(report)
    # every other finder is still there, in its order
    assert report["meta_path"] == report["start"]["meta_path"][1:]


def test_importing_a_dgl_submodule_first_gets_them_too() -> None:
    _check_adapted(_report("import dgl.nn", _env()))


def test_import_dgl_still_adapts_and_reports_when_it_comes_first() -> None:
    """qtrain's own way in: the hook is reached from inside import_dgl and adds nothing twice."""
    report = _report("import qtrain._compat; qtrain._compat.import_dgl()", _env())
    _check_adapted(report)
    assert len(report["applied"]) == len(set(report["applied"]))


def test_a_users_dglbackend_wins() -> None:
    report = _report("import dgl", _env(DGLBACKEND="pytorch"))
    assert not any(line.startswith("DGLBACKEND") for line in report["applied"])


def test_the_off_switch_leaves_the_hook_out() -> None:
    code = (
        "import sys; print([type(f).__name__ for f in sys.meta_path]); "
        "import qtrain_dgl_hook; qtrain_dgl_hook.install(); print(qtrain_dgl_hook.installed())"
    )
    for value, on in (("1", False), ("yes", False), ("0", True), ("", True)):
        done = _python(code, _env(QTRAIN_NO_DGL_HOOK=value))
        assert done.returncode == 0, done.stderr
        first, second = done.stdout.strip().splitlines()
        assert ("DglImportHook" in first) == on and second == str(on), (value, done.stdout)


def test_without_the_hook_a_plain_import_dgl_fails_as_before() -> None:
    """The failure the hook exists for (where graphbolt has no build for this torch)."""
    done = _python(
        "import qtrain._compat as c; print(c._graphbolt_loads()); import dgl",
        _env(QTRAIN_NO_DGL_HOOK="1"),
    )
    if done.stdout.strip() == "True":  # graphbolt loads here: dgl imports without help
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0
        assert "graphbolt" in done.stderr or "torchdata" in done.stderr, done.stderr


def test_a_hook_that_cannot_adapt_warns_and_lets_the_import_go_on() -> None:
    code = (
        "import importlib.util, sys, warnings; warnings.simplefilter('always'); "
        "sys.modules['qtrain._compat'] = None; "  # importing it now raises ImportError
        "spec = importlib.util.find_spec('dgl'); "
        "print(spec is not None, any(type(f).__name__ == 'DglImportHook' for f in sys.meta_path))"
    )
    done = _python(code, _env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"], done.stdout
    assert "qtrain: could not adapt DGL" in done.stderr and "QTRAIN_NO_DGL_HOOK" in done.stderr


def test_the_hook_module_imports_nothing_else() -> None:
    """It runs at every interpreter start: no torch, no qtrain, no importlib.abc."""
    origin = importlib.util.find_spec(HOOK).origin  # type: ignore[union-attr]
    code = (
        "import os, sys; before = set(sys.modules); "  # os: site has imported it at start-up
        f"sys.path.insert(0, {str(Path(origin).parent)!r}); "
        f"import {HOOK}; print(sorted(set(sys.modules) - before))"
    )
    done = _python(code, _env(), "-S", "-I")  # no site: the .pth has not run
    assert done.returncode == 0, done.stderr
    assert ast.literal_eval(done.stdout.strip()) == [HOOK]


def test_the_pth_file_is_installed_and_recorded() -> None:
    """A wheel or editable install that lost the .pth fails here, not silently."""
    site_dirs = [*site.getsitepackages(), site.getusersitepackages()]
    # the installed distribution, not a qtrain.egg-info a build left in the working tree
    (dist,) = importlib.metadata.distributions(name="qtrain", path=site_dirs)
    recorded = [f for f in dist.files or [] if f.name == PTH]
    assert len(recorded) == 1, "qtrain_dgl_hook.pth is not in qtrain's RECORD"
    path = Path(str(dist.locate_file(recorded[0]))).resolve()
    assert path.parent in {Path(p).resolve() for p in site_dirs}, f"{path} is not in site-packages"
    assert path.read_text().strip() == f"import {HOOK}; {HOOK}.install()"
