"""Dropout in one fused pass that saves a 1-bit mask, for the steps tango runs.

An epoch's dropout costs more than its quantized products on a CPU: torch's
dropout draws a float mask with a Bernoulli generator, multiplies, and keeps
the float mask for a backward multiply (GAT on synthetic-arxiv: 36% of a tango
epoch; Cora: 70%). Under tango, ``torch.nn.functional.dropout`` (what
``nn.Dropout``, DGL's ``feat_drop`` and ``attn_drop``, calls) draws its mask
from qtrain's counter-based generator instead (``qtrain.ops.masks.keep_mask``:
element (row, j) of call c is a pure function of the run's seed, c, row and j),
scales in the same pass and saves the mask packed at 1 bit per element; backward
is the same masked scale. Same keep probability and scale, other random bits
than torch's generator: a tango run does not drop the elements an FP32 run with
the same seed drops. qtrain's own node-keyed dropout (``qtrain.models.dropout``)
keeps its masks; it only switches to the packed path
(``masks.packed_dropout_masks``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from qtrain.ops import masks
from qtrain.plugin import call_argument

_MIX = 0xD1B54A32D192ED03  # odd 64-bit constants: spread (seed, call) over the seed space
_GOLDEN = 0x9E3779B97F4A7C15


class FusedDropout:
    """``F.dropout`` calls in training mode, each from its own counter stream; counts them."""

    def __init__(self, seed: int, backend: str) -> None:
        self.key = (int(seed) + 1) * _MIX % 2**64
        self.backend = backend
        self.calls = 0  # calls drawn so far: the stream's position (saved with a checkpoint)

    def function(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A stand-in for ``F.dropout`` (``original``) that runs :meth:`handle`."""

        def dropout(*args: Any, **kwargs: Any) -> Any:
            return self.handle(original, args, kwargs)

        dropout.__wrapped__ = original  # type: ignore[attr-defined]
        return dropout

    def handle(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``func(*args, **kwargs)`` (torch's dropout), fused where it can be."""
        x = call_argument(args, kwargs, 0, "input", None)
        p = float(call_argument(args, kwargs, 1, "p", 0.5))
        training = bool(call_argument(args, kwargs, 2, "training", True))
        inplace = bool(call_argument(args, kwargs, 3, "inplace", False))
        usable = (
            isinstance(x, torch.Tensor)
            and x.dtype == torch.float32
            and x.device.type in ("cpu", "cuda")
            and x.dim() >= 1
            and x.numel() > 0
        )
        if not (usable and training and not inplace and 0.0 < p < 1.0):
            return func(*args, **kwargs)
        seed = (self.key + self.calls * _GOLDEN) % 2**64
        self.calls += 1
        rows = torch.arange(x.shape[0], device=x.device)
        packed = masks.keep_mask(rows, x[0].numel(), p, seed, self.backend)
        return masks.PackedMaskDropout.apply(x, packed, 1.0 / (1.0 - p), self.backend)
