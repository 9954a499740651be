"""qtrain: quantized GNN training for DGL.

``qtrain run recipe.toml`` from the shell; ``with qtrain.patch("trace"): ...``
from Python to run an unmodified DGL model under qtrain's plugins.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# Torch's CPU allocator neither caches nor asks for huge pages by default, so every
# large tensor (nodes x hidden) costs a page fault per 4 KiB when first written: on
# synthetic-arxiv that was a quarter of a GCN epoch. With this set before torch
# allocates, tensors of 2 MiB or more are 2 MiB-aligned and advised as transparent
# huge pages. A user's own value wins; it has no effect once torch has allocated.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"

if TYPE_CHECKING:
    from qtrain.plugin import PatchSession


def patch(policy: Any = None, /, **options: Any) -> PatchSession:
    """Activate plugins around a user's own training loop (see ``qtrain.patching.patch``)."""
    from qtrain.patching import patch as _patch

    return _patch(policy, **options)


__all__ = ["__version__", "patch"]
