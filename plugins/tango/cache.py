"""A cache of quantized tensors that can never hand back stale data.

Tango (section 3.3) quantizes a tensor once and reuses the result: between
primitives that read the same tensor (a SAGE layer's input feeds both its
self GEMM and its neighbour SpMM; a weight feeds every forward until the
optimizer changes it) and from forward to backward. A cached entry is used
only if it was made from *this* tensor object (held weakly, so the cache
never keeps an activation alive), at the same storage address, shape,
strides and offset, at the same version counter (every in-place write,
including the optimizer's update and ``.data`` assignment through
``copy_``, bumps it), and with the same quantization settings. Anything else
is a miss and is quantized afresh.

Each quantization is named to the activation meter as a copy of its source
(:func:`qtrain.train.activations.note_copy`): the int8 node features, made once
and kept for the run, then count as the features do, not as a saved activation.

A quantized step constant asked for its transpose a second time gets it
(:meth:`QuantCache.transposed`), kept while its int8 copy lives: the weight gradient
X^T dY of a layer reading the node features then runs as a plain product over rows of
X^T, not as a transposed product that re-packs X's columns every step (on Cora the
packing cost more than FP32's whole product).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from qtrain.train.activations import note_copy


class Quantized(tuple):  # type: ignore[type-arg]
    """(q int8 or packed uint8, scale float32), read as ``q, s = value``, plus ``shift``:
    None, or each row's zero point (``x.amin(-1, keepdim=True)``) where the values are
    ``q * s + shift`` (the policy's affine levels); the products that ask for affine levels
    add ``shift``'s share to what they compute from ``q * s``."""

    shift: torch.Tensor | None

    def __new__(
        cls, q: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor | None = None
    ) -> Quantized:
        value = super().__new__(cls, (q, scale))
        value.shift = shift
        return value

    @staticmethod
    def of(value: tuple[torch.Tensor, torch.Tensor]) -> Quantized:
        """``value`` as a Quantized (a plain pair has no shift)."""
        return value if isinstance(value, Quantized) else Quantized(*value)


def _fingerprint(x: torch.Tensor) -> tuple[object, ...]:
    """Everything about x that a stale entry could differ in."""
    return (
        x._version,
        x.data_ptr(),
        tuple(x.shape),
        tuple(x.stride()),
        x.storage_offset(),
        x.dtype,
        x.device,
    )


@dataclass
class _Entry:
    ref: weakref.ReferenceType[torch.Tensor]
    fingerprint: tuple[object, ...]
    settings: tuple[object, ...]
    value: Quantized


class QuantCache:
    """Quantized versions of live tensors, keyed by identity and version; counts hits and misses.

    A tensor may have several entries, one per set of settings (its rows' and its
    columns' quantizations with per-row scales)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, dict[tuple[object, ...], _Entry]] = {}
        # int8 tensor -> its transpose, contiguous (None: asked for once); an entry dies
        # with its int8 tensor
        self._transposed: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return sum(len(by_settings) for by_settings in self._entries.values())

    def get_or_quantize(
        self,
        x: torch.Tensor,
        settings: tuple[object, ...],
        quantize: Callable[[torch.Tensor], Quantized],
    ) -> Quantized:
        """The cached quantization of ``x`` under ``settings``, or ``quantize(x)`` stored for next time."""
        key = id(x)
        fingerprint = _fingerprint(x)
        with self._lock:
            entry = self._entries.get(key, {}).get(settings)
            if entry is not None and entry.ref() is x and entry.fingerprint == fingerprint:
                self.hits += 1
                return entry.value
        value = quantize(x)
        for part in (*value, getattr(value, "shift", None)):
            if part is not None:
                note_copy(part, x)
        with self._lock:
            self.misses += 1
            self._store(key, x, fingerprint, settings, value)
        return value

    def peek(self, x: torch.Tensor, settings: tuple[object, ...]) -> Quantized | None:
        """The cached quantization of ``x`` under ``settings`` if there is a fresh one, else
        None; counts nothing (the caller converts it into another form it then caches)."""
        with self._lock:
            entry = self._entries.get(id(x), {}).get(settings)
            if entry is not None and entry.ref() is x and entry.fingerprint == _fingerprint(x):
                return entry.value
        return None

    def put(self, x: torch.Tensor, settings: tuple[object, ...], value: Quantized) -> None:
        """Store ``value`` as the quantization of ``x`` under ``settings``: one the caller
        derived from another entry (dropout of the int8 features), not from ``x``'s values."""
        with self._lock:
            self._store(id(x), x, _fingerprint(x), settings, value)

    def _store(
        self,
        key: int,
        x: torch.Tensor,
        fingerprint: tuple[object, ...],
        settings: tuple[object, ...],
        value: Quantized,
    ) -> None:
        """(With the lock held.) A tensor other than the one the id named before, or the
        same one changed since, starts a fresh set of entries."""
        by_settings = self._entries.get(key)
        first = next(iter(by_settings.values()), None) if by_settings else None
        if first is None or first.ref() is not x or first.fingerprint != fingerprint:
            by_settings = self._entries[key] = {}
            ref = weakref.ref(x, self._forget_callback(key))
        else:
            ref = first.ref
        by_settings[settings] = _Entry(ref, fingerprint, settings, value)

    def _forget_callback(self, key: int) -> Callable[[weakref.ReferenceType[torch.Tensor]], None]:
        def forget(ref: weakref.ReferenceType[torch.Tensor]) -> None:
            with self._lock:
                by_settings = self._entries.get(key)
                first = next(iter(by_settings.values()), None) if by_settings else None
                if first is not None and first.ref is ref:
                    del self._entries[key]

        return forget

    def transposed(self, q: torch.Tensor) -> torch.Tensor | None:
        """``q.t()`` made contiguous and kept while ``q`` lives, from the second time ``q`` is
        asked for; None the first time. Only an int8 copy that outlives a step (the node
        features') is asked for twice: one made afresh every step (features aggregated
        or dropped out first) would pay the copy each step and gain nothing."""
        with self._lock:
            if q not in self._transposed:
                self._transposed[q] = None  # seen once
                return None
            found = self._transposed[q]
        if found is not None:
            return found
        made = q.t().contiguous()
        with self._lock:
            self._transposed[q] = made
        return made

    def note_reuse(self) -> None:
        """Count a reuse the caller made itself (forward's quantized operand used in backward)."""
        with self._lock:
            self.hits += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._transposed.clear()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "entries": sum(len(by_settings) for by_settings in self._entries.values()),
                "transposed": sum(t is not None for t in self._transposed.values()),
            }
