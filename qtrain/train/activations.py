"""Activation memory: what autograd keeps for backward, measured where it is stored.

Every training step runs under one pair of ``saved_tensors_hooks``
(:class:`ActivationMeter`). Each tensor autograd saves is counted by the bytes
that hold it: the tensor's storage (counted once however many ops or views
save it) or, when a codec (the ``exact`` plugin) replaced it by a compressed
form, the bytes of that form. The model's parameters and the step's inputs
(features, labels, graph data) exist whether or not autograd saves them, so
they are passed by reference and not counted, as EXACT's accounting does
(exact-iclr22 appendix H). Neither is a copy a plugin keeps of one of them for
the whole run (tango's int8 node features, quantized once per run, or a
weight's, kept until the optimizer changes it): plugins name such copies with
:func:`note_copy`, and their bytes are reported as ``input_copy_bytes``. A
saved tensor stops counting when autograd frees it after its backward. ``activation_bytes`` is the highest total reached in a
step; ``peak_memory_bytes`` is the process's peak resident memory during the
step (Linux resets the high-water mark per step through
``/proc/self/clear_refs``), or the CUDA allocator's peak on a GPU.

Codecs plug in through :func:`installed_codec`: one at a time, because
PyTorch applies only the innermost pair of saved-tensor hooks.
"""

from __future__ import annotations

import contextlib
import re
import resource
import sys
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch

from qtrain.errors import PluginError


class SavedTensorCodec(Protocol):
    """Replaces saved tensors by a smaller form and restores them for backward."""

    def encode(self, t: torch.Tensor) -> Any | None:
        """A stored form of ``t``, or None to keep ``t`` itself."""

    def decode(self, stored: Any) -> torch.Tensor:
        """The tensor backward should see."""

    def nbytes(self, stored: Any) -> int:
        """Bytes the stored form holds."""

    def begin_step(self) -> None:
        """A training step starts (forget per-step state)."""

    def end_step(self) -> None:
        """The training step's backward is done."""


_codec: list[SavedTensorCodec] = []


@contextlib.contextmanager
def installed_codec(codec: SavedTensorCodec) -> Iterator[None]:
    """Make ``codec`` the one every :class:`ActivationMeter` step uses."""
    if _codec:
        raise PluginError(
            "two plugins compress saved tensors; only one saved-tensor codec can be active"
        )
    _codec.append(codec)
    try:
        yield
    finally:
        _codec.clear()


def current_codec() -> SavedTensorCodec | None:
    return _codec[0] if _codec else None


# storage key of a copy -> (the copy, held weakly; the storage key of what it copies)
_copies: dict[int, tuple[weakref.ReferenceType[torch.Tensor], int]] = {}


def note_copy(copy: torch.Tensor, source: torch.Tensor) -> None:
    """Record that ``copy`` is computed from ``source`` alone and kept as long as it is.

    Saved for backward, a copy of a step input or a parameter counts as that
    input does (not an activation) and goes to ``input_copy_bytes``; a copy of
    anything else counts as usual. The record dies with the copy.
    """
    key, source_key = storage_key(copy), storage_key(source)
    if key is None or source_key is None:
        return

    def forget(ref: weakref.ReferenceType[torch.Tensor]) -> None:
        entry = _copies.get(key)
        if entry is not None and entry[0] is ref:
            del _copies[key]

    _copies[key] = (weakref.ref(copy, forget), source_key)


def copied_from(key: int) -> int | None:
    """The storage key of what the live tensor stored at ``key`` copies (None if not a copy)."""
    entry = _copies.get(key)
    if entry is None:
        return None
    copy = entry[0]()
    return entry[1] if copy is not None and storage_key(copy) == key else None


def storage_key(t: torch.Tensor) -> int | None:
    """The address of t's storage (None for tensors without one, e.g. sparse)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


# ---------------------------------------------------------------- peak memory

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


def _reset_peak_rss() -> bool:
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
        return True
    except OSError:
        return False


def process_peak_rss() -> int:
    """The whole process's peak resident set size in bytes (``ru_maxrss``)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) * (1 if sys.platform == "darwin" else 1024)  # macOS reports bytes, Linux KiB


def _peak_rss() -> int:
    """VmHWM: the peak since the last reset (the process's peak where it cannot be read)."""
    try:
        with open(_STATUS) as f:
            match = re.search(r"VmHWM:\s+(\d+)\s+kB", f.read())
        if match:
            return int(match.group(1)) * 1024
    except OSError:
        pass
    return process_peak_rss()


# ---------------------------------------------------------------- the meter


class _Held:
    """One saved tensor as autograd holds it; un-counts itself when autograd frees it."""

    __slots__ = ("codec", "key", "meter", "value")

    def __init__(
        self, meter: ActivationMeter, key: tuple[str, int], value: Any, codec: Any
    ) -> None:
        self.meter, self.key, self.value, self.codec = meter, key, value, codec

    def __del__(self) -> None:
        self.meter._release(self.key)


class ActivationMeter:
    """Counts (and, with a codec, compresses) the tensors autograd saves in each step."""

    def __init__(self, params: Iterable[torch.Tensor], device: torch.device) -> None:
        self.device = device
        self._param_keys = {k for p in params if (k := storage_key(p)) is not None}
        self._input_keys: set[int] = set()
        self._step_copies: dict[int, int] = {}  # storage key -> bytes, this step
        self._live: dict[tuple[str, int], list[int]] = {}  # key -> [holders, bytes]
        self._current = 0
        self._step_peak = 0
        self._codec: SavedTensorCodec | None = None
        self.activation_bytes = 0  # highest step peak so far
        self.input_copy_bytes = 0  # most bytes of input / parameter copies one step saved
        self.peak_memory_bytes = 0
        self.steps = 0
        self.peak_memory_source = (
            "torch.cuda.max_memory_allocated per step"
            if device.type == "cuda"
            else "peak resident set size per step (VmHWM, reset through /proc/self/clear_refs)"
        )

    @contextlib.contextmanager
    def step(self, inputs: Iterable[torch.Tensor] = ()) -> Iterator[None]:
        """One forward + backward; ``inputs`` are held by the caller and not counted."""
        self._input_keys = {k for t in inputs if (k := storage_key(t)) is not None}
        self._input_keys |= self._param_keys
        self._step_peak = self._current
        self._step_copies = {}
        self._codec = current_codec()
        if self._codec is not None:
            self._codec.begin_step()
        self._start_peak()
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield
        finally:
            if self._codec is not None:
                self._codec.end_step()
            self._codec = None
            self.steps += 1
            self.activation_bytes = max(self.activation_bytes, self._step_peak)
            self.input_copy_bytes = max(self.input_copy_bytes, sum(self._step_copies.values()))
            self.peak_memory_bytes = max(self.peak_memory_bytes, self._end_peak())

    def summary(self) -> dict[str, Any]:
        return {
            "activation_bytes": self.activation_bytes,
            "input_copy_bytes": self.input_copy_bytes,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_source": self.peak_memory_source,
        }

    # -- peak memory ----------------------------------------------------------

    def _start_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif not _reset_peak_rss():
            self.peak_memory_source = "peak resident set size of the process (no per-step reset)"

    def _end_peak(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return _peak_rss()

    # -- hooks ----------------------------------------------------------------

    def _pack(self, t: torch.Tensor) -> Any:
        key = storage_key(t)
        if key is None or key in self._input_keys:
            return t
        if copied_from(key) in self._input_keys:
            self._step_copies[key] = t.untyped_storage().nbytes()
            return t
        if self._codec is not None:
            stored = self._codec.encode(t)
            if stored is not None:
                return self._hold(("codec", id(stored)), stored, self._codec.nbytes(stored))
        return self._hold(("storage", key), t, t.untyped_storage().nbytes())

    @staticmethod
    def _unpack(held: Any) -> torch.Tensor:
        if isinstance(held, _Held):
            return held.codec.decode(held.value) if held.codec is not None else held.value
        return held

    def _hold(self, key: tuple[str, int], value: Any, nbytes: int) -> _Held:
        entry = self._live.get(key)
        if entry is None:
            self._live[key] = [1, nbytes]
            self._current += nbytes
            self._step_peak = max(self._step_peak, self._current)
        else:
            entry[0] += 1
        codec = self._codec if key[0] == "codec" else None
        return _Held(self, key, value, codec)

    def _release(self, key: tuple[str, int]) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self._current -= entry[1]
            del self._live[key]
