"""How a run quantizes: bit count, rounding, the random stream, the cache, the backend.

One ``QuantPolicy`` lives for one plugin activation. Stochastic rounding takes
its counters from one stream per policy: each quantization takes the next
``numel`` counters, so a run with the same seed and the same sequence of
calls draws the same random numbers (runs repeat), and no two tensors share
randomness.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from qtrain.plugins.tango.cache import QuantCache, Quantized

from qtrain.ops.quantize import quantize

_CONSTANT_MIX = 0xBF58476D1CE4E5B9  # odd: seeds of step constants apart from the stream's


class NonFiniteOperand(ValueError):
    """An operand holds NaN or Inf, which the quantizer refuses: the primitive runs in
    float32 instead, so a diverged step shows NaN / Inf as in float32 rather than failing."""


@dataclass
class QuantPolicy:
    """Quantization settings plus the state they need (counter stream, cache).

    Nothing here is checked: tango's config validated the settings where the recipe
    entered, and the op's front (or the reference) checks them again at the kernel."""

    bits: int = 8
    rounding: str = "stochastic"
    seed: int = 0
    cache: QuantCache | None = field(default_factory=QuantCache)
    backend: str = "auto"
    # told (primitive, why) when a backward runs in float32 (tango's fp32_calls report)
    on_fp32: Callable[[str, str], None] | None = None
    _offset: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _take(self, n: int) -> int:
        with self._lock:
            start = self._offset
            self._offset += n
        return start

    def gradient(self, grad: torch.Tensor) -> Quantized:
        """Quantize an incoming gradient. Through the cache when it is on: autograd hands
        one tensor to every branch of a sum (RGCN's relation messages plus its self-loop,
        a residual), and each branch's quantized backward then reads one quantization
        instead of making its own. The cache holds tensors weakly, so no gradient outlives
        its backward."""
        return self._through_cache(grad, constant=False)

    @staticmethod
    def constant(x: torch.Tensor, recording: bool | None = None) -> bool:
        """True for a forward operand that takes no part in the gradient being recorded:
        a step input (the node features, or what the model computes from them alone),
        or anything of an evaluation (no gradient recorded).

        ``recording``: whether the primitive's caller records a gradient, taken where it
        was called (``torch.is_grad_enabled()`` there; the default reads it now). Inside
        an autograd Function's forward grad mode is always off, so a forward must be
        told: read there, every weight and activation would count as a constant."""
        if recording is None:
            recording = torch.is_grad_enabled()
        return not (recording and x.requires_grad)

    def fresh(self, x: torch.Tensor, constant: bool = False) -> Quantized:
        """Quantize x now (anything that is used once).

        Stochastic rounding draws from the stream, except for a ``constant``
        (:meth:`constant`): that draws from a seed of its own at counter 0, so its
        quantization depends on its values only, not on how many tensors were
        quantized before it, and an evaluation leaves the stream where it was. The
        cache keeps the node features across steps and an evaluation's weights until
        the optimizer changes them; after a resume they are quantized again and must
        come out as they did."""
        seed, offset = self.seed, 0
        if self.rounding == "stochastic":
            if constant:
                seed = (self.seed * _CONSTANT_MIX + x.numel()) % 2**64
            else:
                offset = self._take(x.numel())
        try:
            return quantize(
                x, self.bits, self.rounding, seed=seed, offset=offset, backend=self.backend
            )
        except ValueError:
            # checked only once the quantizer has refused x: no extra pass when x is finite
            if bool(torch.isfinite(x).all()):
                raise
            raise NonFiniteOperand("operand holds NaN or Inf") from None

    def cached(self, x: torch.Tensor, recording: bool | None = None) -> Quantized:
        """Quantize a forward operand, reusing an earlier quantization of the same unchanged
        tensor if cached (a constant's and a stream draw's are kept apart: a weight an
        evaluation quantized is not what the next training step draws). ``recording`` as
        in :meth:`constant`."""
        return self._through_cache(x, constant=self.constant(x, recording))

    def _through_cache(self, x: torch.Tensor, constant: bool) -> Quantized:
        if self.cache is None:
            return self.fresh(x, constant)
        return self.cache.get_or_quantize(
            x, self._settings(constant), lambda t: self.fresh(t, constant)
        )

    def store(self, x: torch.Tensor, value: Quantized) -> None:
        """Cache ``value`` as the forward operand ``x``'s quantization (with the cache on)."""
        if self.cache is not None:
            self.cache.put(x, self._settings(self.constant(x)), value)

    def _settings(self, constant: bool) -> tuple[object, ...]:
        """What a cached quantization was made under (a constant's kept apart)."""
        return (self.bits, self.rounding, self.seed, constant)

    def fp32(self, primitive: str, why: str) -> None:
        """Report that a part of ``primitive`` ran in float32 (see ``on_fp32``)."""
        if self.on_fp32 is not None:
            self.on_fp32(primitive, why)

    def note_reuse(self) -> None:
        """Count a forward-to-backward reuse of a quantized operand."""
        if self.cache is not None:
            self.cache.note_reuse()
