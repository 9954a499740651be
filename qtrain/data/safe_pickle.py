"""Read untrusted data pickles without running code or trusting their structure.

A pickle can name any callable, and even the harmless-looking ones are
dangerous with crafted arguments: a ``scipy.sparse.csr_matrix`` rebuilt by a
pickle gets its ``indices`` / ``indptr`` written straight into ``__dict__``,
skipping every check, and ``toarray()`` then writes out of bounds (a
segfault from a file that names only allowed classes). So no name a pickle
asks for resolves to a NumPy or SciPy internal. Each resolves to a stand-in
that only records its arguments:

* ``numpy.dtype`` -> :class:`DtypeRecord`, a plain numeric dtype or an error;
* ``numpy.core.multiarray._reconstruct`` + ``ndarray.__setstate__`` ->
  :class:`ArrayRecord`, whose array is made by ``np.frombuffer`` from raw
  bytes whose length must match the declared shape exactly;
* ``scipy.sparse.{csr,csc,coo}_matrix`` -> :class:`SparseRecord`, which
  keeps the attribute dict; :func:`sparse_to_dense` checks every index
  before anything reads it.

Arrays are numeric only (bool, int, uint, float of 1-8 bytes): no object
arrays, so no pointers ever come out of a file's bytes.
"""

from __future__ import annotations

import collections
import math
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np

_NUMERIC_SPEC = re.compile(r"^[biuf][1248]$")  # how NumPy pickles plain dtypes: 'f8', 'i4', 'b1'
_SPARSE_FORMATS = ("csr", "csc", "coo")


class UnsafePickle(pickle.UnpicklingError):
    """The pickle asks for something outside the admitted data classes."""


class MalformedRecord(ValueError):
    """A recorded array or matrix is inconsistent (lengths, shapes, index ranges, dtypes)."""


class _NdarrayClass:
    """What ``numpy.ndarray`` resolves to: only a token for ``_reconstruct``."""


class DtypeRecord:
    """``numpy.dtype(spec, align, copy)`` restricted to numeric scalar types."""

    def __init__(self, spec: Any, align: Any = False, copy: Any = True) -> None:
        if not isinstance(spec, str) or not _NUMERIC_SPEC.match(spec):
            raise MalformedRecord(
                f"dtype {spec!r} is not a plain numeric type (allowed: b1, i1-i8, u1-u8, f2-f8)"
            )
        self.dtype = np.dtype(spec)

    def __setstate__(self, state: Any) -> None:
        # NumPy's state: (version, byteorder, subarray, names, fields, elsize, alignment, flags)
        if not isinstance(state, tuple) or len(state) < 2 or state[1] not in ("<", ">", "|", "="):
            raise MalformedRecord(f"dtype state {state!r:.80} is not that of a numeric dtype")
        if any(part is not None for part in state[2:5]):
            raise MalformedRecord("structured and sub-array dtypes are not allowed")
        if state[1] in "<>":
            self.dtype = self.dtype.newbyteorder(state[1])


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise MalformedRecord(f"{what} shape {value!r:.80} is not a tuple of non-negative integers")
    return tuple(int(d) for d in value)


def _array_from_bytes(raw: Any, dtype: Any, shape: Any, fortran: bool) -> np.ndarray:
    if not isinstance(dtype, DtypeRecord):
        raise MalformedRecord(f"array dtype is a {type(dtype).__name__}, not a numpy.dtype")
    if isinstance(raw, str):  # Python 2 str read with encoding="latin1"
        raw = raw.encode("latin1")
    if not isinstance(raw, (bytes, bytearray)):
        raise MalformedRecord(f"array data is a {type(raw).__name__}, not raw bytes")
    dims = _shape(shape, "array")
    if len(dims) > 2:
        raise MalformedRecord(f"array has {len(dims)} dimensions; these files hold 1-D and 2-D")
    expected = math.prod(dims) * dtype.dtype.itemsize
    if len(raw) != expected:
        raise MalformedRecord(
            f"array of shape {dims} and dtype {dtype.dtype} needs {expected} bytes, "
            f"the file holds {len(raw)}"
        )
    flat = np.frombuffer(bytes(raw), dtype=dtype.dtype)
    return flat.reshape(dims, order="F" if fortran else "C").astype(dtype.dtype.newbyteorder("="))


class ArrayRecord:
    """``_reconstruct(ndarray, (0,), b'b')`` then ``__setstate__``: an array from checked bytes."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 5:
            state = state[1:]  # (version, shape, dtype, is_fortran, raw)
        if not isinstance(state, tuple) or len(state) != 4:
            raise MalformedRecord(f"array state {state!r:.80} is not NumPy's")
        shape, dtype, fortran, raw = state
        self.array = _array_from_bytes(raw, dtype, shape, bool(fortran))


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> ArrayRecord:
    if cls is not _NdarrayClass or _shape(shape, "empty array") != (0,):
        raise MalformedRecord("_reconstruct is only admitted for an empty numpy.ndarray")
    return ArrayRecord()


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    """NumPy 2's reduce for protocol 5 (the buffer arrives in-band as bytes)."""
    if order not in ("C", "F"):
        raise MalformedRecord(f"array order {order!r:.20} is neither 'C' nor 'F'")
    return _array_from_bytes(buf, dtype, shape, order == "F")


def _scalar(dtype: Any, raw: Any) -> Any:
    """``numpy.core.multiarray.scalar``: one numeric value from its bytes."""
    return _array_from_bytes(raw, dtype, (), False)[()]


def _encode(text: Any, encoding: Any = "latin1") -> bytes:
    """``_codecs.encode``: how Python 3 writes bytes into protocol-2 pickles (latin1 only)."""
    if not isinstance(text, str) or str(encoding).lower() not in ("latin1", "latin-1"):
        raise MalformedRecord("_codecs.encode is only admitted for latin1 text")
    return text.encode("latin1")


def _bytes(*args: Any) -> bytes:
    """``bytes()``: how Python 3 writes an empty bytes object into protocol-2 pickles."""
    if args:
        raise MalformedRecord("bytes(...) is only admitted without arguments")
    return b""


def _defaultdict(factory: Any = None) -> collections.defaultdict:
    if factory is not list:
        raise MalformedRecord("defaultdict is only admitted with the list factory")
    return collections.defaultdict(list)


class SparseRecord:
    """A SciPy sparse matrix's attribute dict, kept as data until :func:`sparse_to_dense`."""

    fmt = ""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = state[0]
        if not isinstance(state, dict):
            raise MalformedRecord("a sparse matrix's state must be an attribute dict")
        self.state = state


def _sparse_record(fmt: str) -> type[SparseRecord]:
    return type(f"{fmt}_matrix_record", (SparseRecord,), {"fmt": fmt})


_SPARSE_RECORDS = {fmt: _sparse_record(fmt) for fmt in _SPARSE_FORMATS}

# (module, name) as written in the pickle -> the stand-in it resolves to
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): _NdarrayClass,
    ("numpy", "dtype"): DtypeRecord,
    ("collections", "defaultdict"): _defaultdict,
    ("__builtin__", "list"): list,
    ("builtins", "list"): list,
    ("_codecs", "encode"): _encode,
    ("__builtin__", "bytes"): _bytes,
    ("builtins", "bytes"): _bytes,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
}
for _module in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ALLOWED[(_module, "_reconstruct")] = _reconstruct
    _ALLOWED[(_module, "scalar")] = _scalar
for _fmt in _SPARSE_FORMATS:
    for _module in ("scipy.sparse", f"scipy.sparse.{_fmt}", f"scipy.sparse._{_fmt}"):
        _ALLOWED[(_module, f"{_fmt}_matrix")] = _SPARSE_RECORDS[_fmt]
ALLOWED_NAMES = "NumPy numeric arrays, SciPy csr/csc/coo matrices, defaultdict(list), lists"


class RecordingUnpickler(pickle.Unpickler):
    """Resolves only the stand-ins above; any other name raises before anything runs."""

    def find_class(self, module: str, name: str) -> Any:
        resolved = _ALLOWED.get((module, name))
        if resolved is None:
            raise UnsafePickle(f"{module}.{name}")
        return resolved


def load(path: Path) -> Any:
    """Unpickle ``path`` into plain Python values, ArrayRecords and SparseRecords.

    Raises UnsafePickle for a forbidden name, MalformedRecord for inconsistent
    data, and whatever ``pickle`` raises for truncated or garbled bytes.
    """
    with open(path, "rb") as f:
        return RecordingUnpickler(f, encoding="latin1").load()


def as_array(value: Any, what: str) -> np.ndarray:
    """The checked array behind a record (or a freshly built one); anything else is an error."""
    if isinstance(value, ArrayRecord) and value.array is not None:
        return value.array
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value  # only built by _array_from_bytes
    raise MalformedRecord(f"{what} is a {type(value).__name__}, not a numeric NumPy array")


def _index_array(state: dict[str, Any], key: str, what: str) -> np.ndarray:
    array = as_array(state.get(key), f"{what} {key}")
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise MalformedRecord(f"{what} {key} must be a 1-D integer array")
    return array.astype(np.int64)


def sparse_to_dense(record: SparseRecord, what: str, max_bytes: int) -> np.ndarray:
    """Check a recorded sparse matrix completely, then densify it as float32.

    ``max_bytes`` bounds the dense result: a shape is only two integers in the
    file, so it must not decide how much memory is taken.
    """
    state = record.state
    shape = _shape(state.get("_shape", state.get("shape")), what)
    if len(shape) != 2:
        raise MalformedRecord(f"{what} has shape {shape}, not 2-D")
    rows, cols = shape
    if rows * cols * 4 > max_bytes:
        raise MalformedRecord(
            f"{what} declares {rows} x {cols} features ({rows * cols * 4 / 2**30:.1f} GiB as "
            f"float32), over the {max_bytes / 2**30:.1f} GiB this machine can hold"
        )
    data = as_array(state.get("data"), f"{what} data")
    if data.ndim != 1:
        raise MalformedRecord(f"{what} data must be 1-D")
    if record.fmt == "coo":
        coords = state.get("coords")
        if isinstance(coords, tuple) and len(coords) == 2:  # SciPy >= 1.13
            state = {"row": coords[0], "col": coords[1]}
        row, col = (_index_array(state, key, what) for key in ("row", "col"))
        if not len(row) == len(col) == len(data):
            raise MalformedRecord(f"{what}: row, col and data lengths differ")
        for name, index, bound in (("row", row, rows), ("col", col, cols)):
            if len(index) and (index.min() < 0 or index.max() >= bound):
                raise MalformedRecord(f"{what}: a {name} index is outside 0..{bound - 1}")
    else:
        major, minor = (rows, cols) if record.fmt == "csr" else (cols, rows)
        indptr, indices = (_index_array(state, key, what) for key in ("indptr", "indices"))
        if len(indptr) != major + 1 or (len(indptr) and indptr[0] != 0):
            raise MalformedRecord(f"{what}: indptr must have {major + 1} entries starting at 0")
        if np.any(np.diff(indptr) < 0) or indptr[-1] != len(indices) or len(indices) != len(data):
            raise MalformedRecord(
                f"{what}: indptr must be non-decreasing and end at the number of stored "
                f"values ({len(indices)} indices, {len(data)} values, indptr ends at {indptr[-1]})"
            )
        if len(indices) and (indices.min() < 0 or indices.max() >= minor):
            raise MalformedRecord(f"{what}: a column index is outside 0..{minor - 1}")
        row = np.repeat(np.arange(major, dtype=np.int64), np.diff(indptr))
        col = indices
        if record.fmt == "csc":
            row, col = col, row
    dense = np.zeros(shape, dtype=np.float32)
    np.add.at(dense, (row, col), data.astype(np.float32))  # duplicates add, as in SciPy
    return dense
