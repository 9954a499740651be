"""An on-disk cache of generated arrays: one folder of ``.npy`` files per option set.

Generating synthetic-products takes a while; reading it back should not.
``.npy`` files load without pickle (``allow_pickle=False``), so a cache
folder can never run code; a file shorter than its header says is refused
before anything is allocated, and ``meta.json`` records each array's shape,
dtype and CRC-32, so a flipped byte is noticed instead of loaded. A folder
is written under a temporary name and renamed into place once complete, so
a crash mid-write leaves no half-written cache behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from qtrain.errors import DatasetError

META = "meta.json"


def options_hash(options: Mapping[str, Any]) -> str:
    """A short stable hash of an option set (JSON with sorted keys), for folder names."""
    text = json.dumps(dict(options), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def save_arrays(folder: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> bool:
    """Write ``arrays`` and ``meta`` into ``folder`` atomically; False (with a warning) on failure.

    A cache that cannot be written (read-only disk, disk full) must not fail
    the run that just generated the data, so this warns instead of raising.
    """
    tmp: Path | None = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(folder)
        prefix = f".{folder.name}.tmp-{os.getpid()}-"  # the writer's pid: see remove_abandoned
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=folder.parent))
        shapes = {}
        for key, array in arrays.items():
            np.save(tmp / f"{key}.npy", np.ascontiguousarray(array), allow_pickle=False)
            shapes[key] = {
                "shape": list(array.shape),
                "dtype": array.dtype.str,
                "crc32": crc32(array),
            }
        with open(tmp / META, "w") as f:
            json.dump({**meta, "arrays": shapes}, f, indent=1, sort_keys=True)
        try:
            os.rename(tmp, folder)
        except OSError:
            if (folder / META).exists():  # another process finished first: keep theirs
                shutil.rmtree(tmp, ignore_errors=True)
                return True
            raise
        return True
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(f"could not write the dataset cache {folder}: {exc}", stacklevel=2)
        return False


def remove_abandoned(folder: Path) -> list[Path]:
    """Remove the temporary folders that writers of ``folder`` left when they were killed
    mid-write (a SIGKILL skips every cleanup); a writer still alive keeps its own."""
    removed = []
    for tmp in folder.parent.glob(f".{folder.name}.tmp-*"):
        pid = tmp.name.removeprefix(f".{folder.name}.tmp-").split("-", 1)[0]
        if pid.isdigit() and _alive(int(pid)):
            continue
        shutil.rmtree(tmp, ignore_errors=True)
        removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def crc32(array: np.ndarray) -> int:
    """CRC-32 of the array's bytes in C order (about 4 GB/s: cheap next to reading them)."""
    return zlib.crc32(np.ascontiguousarray(array).data)


def load_arrays(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The arrays and meta stored in ``folder``; None if there is no cache there.

    Anything wrong with an existing folder (missing, truncated or garbled
    file, shape, dtype or checksum not the one recorded) is a DatasetError
    naming the folder and the problem; the caller decides what to do with it.
    """
    if not folder.exists():
        return None
    try:
        with open(folder / META) as f:
            meta = json.load(f)
        if not isinstance(meta, dict) or not isinstance(meta.get("arrays"), dict):
            raise ValueError(f"{META} is not an object with an 'arrays' object")
        arrays: dict[str, np.ndarray] = {}
        for key, spec in meta["arrays"].items():
            if not key.isidentifier() or not isinstance(spec, dict):
                raise ValueError(f"{META} lists an array {key!r} with no valid description")
            arrays[key] = _load_array(folder / f"{key}.npy", spec)
    except (OSError, ValueError, KeyError, TypeError, EOFError, RecursionError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DatasetError(
            f"the dataset cache {folder} is incomplete or corrupt ({reason})"
        ) from None
    return arrays, meta


def _load_array(path: Path, spec: dict[str, Any]) -> np.ndarray:
    """One array, checked against its ``spec`` from meta.json.

    Memory-mapped first, so that a header claiming more data than the file
    holds fails (NumPy compares it with the file's length) before anything
    is allocated; then copied into memory and its checksum compared.
    """
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise
    except Exception as exc:  # a garbled header fails in NumPy's parser with any of many types
        raise ValueError(f"{path.name}: {type(exc).__name__}: {exc}") from None
    if not isinstance(mapped, np.ndarray):  # a .npz archive in place of the .npy file
        raise ValueError(f"{path.name} is not a .npy file")
    if list(mapped.shape) != list(spec["shape"]) or mapped.dtype.str != spec["dtype"]:
        raise ValueError(
            f"{path.name} holds {mapped.dtype.str} {list(mapped.shape)}, "
            f"expected {spec['dtype']} {spec['shape']}"
        )
    array = np.array(mapped, order="C")
    del mapped
    if "crc32" in spec and crc32(array) != spec["crc32"]:  # caches written before it lack one
        raise ValueError(f"{path.name} does not match its checksum")
    return array
