"""qtrain: quantized GNN training for DGL.

``qtrain run recipe.toml`` from the shell; ``with qtrain.patch("trace"): ...``
from Python to run an unmodified DGL model under qtrain's plugins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# No side effects here: a user's own `import dgl` imports qtrain too (qtrain_dgl_hook).
# The `qtrain` command sets torch's allocator up in qtrain.cli.main instead.

__version__ = "0.1.0"

if TYPE_CHECKING:
    from qtrain.plugin import PatchSession


def patch(policy: Any = None, /, **options: Any) -> PatchSession:
    """Activate plugins around a user's own training loop (see ``qtrain.patching.patch``)."""
    from qtrain.patching import patch as _patch

    return _patch(policy, **options)


def to_device(graph: Any, device: Any) -> Any:
    """``graph`` with its features on ``device`` and qtrain running DGL's graph primitives
    there (``qtrain.route``): unmodified DGL models on a GPU with DGL's CPU build."""
    from qtrain.route import to_device as _to_device

    return _to_device(graph, device)


__all__ = ["__version__", "patch", "to_device"]
