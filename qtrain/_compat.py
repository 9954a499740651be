"""The one place that adapts DGL to the torch it finds.

DGL 2.1.0 (the newest Linux wheel on PyPI) imports under newer torch releases
with two adaptations, each applied only when it is needed:

* ``dgl.graphbolt`` loads a C++ library built only for torch 2.0-2.2.1 and
  raises at import otherwise; qtrain never uses graphbolt, so an empty module
  is registered under that name before ``import dgl``.
* ``DGLBACKEND`` is set to ``pytorch`` so that DGL does not write
  ``~/.dgl/config.json`` on first import.
* ``import dgl`` imports ``ogb`` (through ``dgl.data.lrgb``), whose first
  import starts a thread asking PyPI for ogb's newest release. There is no
  network at run time, so ogb is imported first with that check disabled.

``import_dgl()`` is the only way qtrain imports DGL; ``applied()`` says what
was adapted, for ``qtrain doctor`` and the run log.

A user's own ``import dgl`` gets the same adaptations without importing qtrain
first: installing qtrain puts ``qtrain_dgl_hook.pth`` in site-packages, which
at interpreter start-up runs ``qtrain_dgl_hook.install()`` (the top-level module
``qtrain_dgl_hook.py``). That puts a finder at the front of ``sys.meta_path``
and imports nothing else; on the first ``import dgl`` the finder removes itself,
calls ``prepare_dgl_import()`` here and lets the normal import go on. Setting
``QTRAIN_NO_DGL_HOOK=1`` leaves the finder out.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any

_applied: list[str] = []
_prepared = False
_dgl: Any = None


def _graphbolt_loads() -> bool:
    """True if DGL's graphbolt C++ library exists for the installed torch."""
    spec = importlib.util.find_spec("dgl")
    if spec is None or not spec.submodule_search_locations:
        return True
    import torch

    root = os.path.join(next(iter(spec.submodule_search_locations)), "graphbolt")
    version = torch.__version__.split("+")[0]
    return os.path.exists(os.path.join(root, f"libgraphbolt_pytorch_{version}.so"))


def _import_ogb_without_version_check() -> None:
    """Import ogb with its PyPI version check (the ``outdated`` package) hidden."""
    if "ogb" in sys.modules or importlib.util.find_spec("ogb") is None:
        return
    missing = object()
    saved = sys.modules.get("outdated", missing)
    sys.modules["outdated"] = None  # type: ignore[assignment]  # makes ogb skip its check
    try:
        import ogb  # noqa: F401
    finally:
        if saved is missing:
            sys.modules.pop("outdated", None)
        else:
            sys.modules["outdated"] = saved  # type: ignore[assignment]
    _applied.append("ogb imported without its PyPI version check (no network at run time)")


def prepare_dgl_import() -> None:
    """Make the adaptations that must come before ``import dgl`` (once per process).

    ``import_dgl()`` calls it, and so does the import hook (``qtrain_dgl_hook``)
    when a user's own code imports dgl first.
    """
    global _prepared
    if _prepared:
        return
    _prepared = True  # first: the checks below may look dgl up, which reaches the hook again
    if "DGLBACKEND" not in os.environ:
        os.environ["DGLBACKEND"] = "pytorch"
        _applied.append("DGLBACKEND=pytorch (keeps DGL from writing ~/.dgl/config.json)")
    if "dgl" not in sys.modules and "dgl.graphbolt" not in sys.modules and not _graphbolt_loads():
        stub = types.ModuleType("dgl.graphbolt")
        stub.__doc__ = "Placeholder registered by qtrain: graphbolt has no build for this torch."
        sys.modules["dgl.graphbolt"] = stub
        _applied.append("dgl.graphbolt replaced by an empty module (no build for this torch)")
    _import_ogb_without_version_check()


def import_dgl() -> Any:
    """Import DGL with the adaptations this environment needs; return the module."""
    global _dgl
    if _dgl is not None:
        return _dgl
    prepare_dgl_import()
    import dgl

    _dgl = dgl
    return dgl


def applied() -> list[str]:
    """The adaptations made so far in this process."""
    return list(_applied)
