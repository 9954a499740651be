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
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any

_applied: list[str] = []
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


def import_dgl() -> Any:
    """Import DGL with the adaptations this environment needs; return the module."""
    global _dgl
    if _dgl is not None:
        return _dgl
    if "DGLBACKEND" not in os.environ:
        os.environ["DGLBACKEND"] = "pytorch"
        _applied.append("DGLBACKEND=pytorch (keeps DGL from writing ~/.dgl/config.json)")
    if "dgl" not in sys.modules and "dgl.graphbolt" not in sys.modules and not _graphbolt_loads():
        stub = types.ModuleType("dgl.graphbolt")
        stub.__doc__ = "Placeholder registered by qtrain: graphbolt has no build for this torch."
        sys.modules["dgl.graphbolt"] = stub
        _applied.append("dgl.graphbolt replaced by an empty module (no build for this torch)")
    _import_ogb_without_version_check()
    import dgl

    _dgl = dgl
    return dgl


def applied() -> list[str]:
    """The adaptations made so far in this process."""
    return list(_applied)
