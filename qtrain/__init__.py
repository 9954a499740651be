"""qtrain: quantized GNN training for DGL.

``qtrain run recipe.toml`` from the shell; ``with qtrain.patch("trace"): ...``
from Python to run an unmodified DGL model under qtrain's plugins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from qtrain.plugin import PatchSession


def patch(policy: Any = None, /, **options: Any) -> PatchSession:
    """Activate plugins around a user's own training loop (see ``qtrain.plugin.patch``)."""
    from qtrain.plugin import patch as _patch

    return _patch(policy, **options)


__all__ = ["__version__", "patch"]
