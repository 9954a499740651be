"""Lets a plain ``import dgl`` work in qtrain's environment, with no qtrain import first.

DGL 2.1.0 does not import under the torch qtrain runs on without the
adaptations in ``qtrain._compat`` (the one place they live). Installing qtrain
puts ``qtrain_dgl_hook.pth`` in site-packages; at interpreter start-up Python
runs its one line, ``import qtrain_dgl_hook; qtrain_dgl_hook.install()``, which
puts a finder at the front of ``sys.meta_path`` and nothing more: no torch, no
qtrain, no other import. The first time anything looks ``dgl`` up, the finder
takes itself out of ``sys.meta_path``, calls
``qtrain._compat.prepare_dgl_import()`` and returns None, so the normal import
goes on with the adaptations in place (``qtrain._compat.applied()`` lists them).

``QTRAIN_NO_DGL_HOOK=1`` (any value but empty or ``0``) leaves the finder out.
"""

import os  # no `from __future__ import annotations`: that imports a module too
import sys

OFF_SWITCH = "QTRAIN_NO_DGL_HOOK"


class DglImportHook:
    """A meta path finder (the ``importlib.abc.MetaPathFinder`` protocol, without
    importing importlib.abc, which would cost every interpreter start) that only
    ever answers for ``dgl``, once."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname != "dgl":
            return None
        # A new list rather than remove(): importlib is iterating over the current one.
        sys.meta_path = [finder for finder in sys.meta_path if finder is not self]
        try:
            from qtrain._compat import prepare_dgl_import

            prepare_dgl_import()
        except Exception as exc:  # the import goes on as if there were no hook
            import warnings

            warnings.warn(
                f"qtrain: could not adapt DGL to this environment before `import dgl` "
                f"({type(exc).__name__}: {exc}); set {OFF_SWITCH}=1 to skip this step",
                stacklevel=2,
            )
        return None


def installed() -> bool:
    """Whether a hook is waiting in ``sys.meta_path`` for the first ``import dgl``."""
    return any(isinstance(finder, DglImportHook) for finder in sys.meta_path)


def install() -> None:
    """Put the hook at the front of ``sys.meta_path``, unless switched off, dgl is
    already imported, or a hook is already there."""
    if os.environ.get(OFF_SWITCH, "") not in ("", "0"):
        return
    if "dgl" in sys.modules or installed():
        return
    sys.meta_path.insert(0, DglImportHook())
