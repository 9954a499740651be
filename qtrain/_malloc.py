"""Keeping freed tensor memory in the process instead of handing it back to the kernel.

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a
fresh ``mmap`` and unmaps it on free. Full-graph layers allocate tensors of
tens of megabytes many times per step (outputs, gradients, zero-filled slice
gradients), so each one is page-faulted in and zeroed anew. That adds up: one
GCN layer split for overlap took 1.55x the whole block's time with glibc's
defaults and 1.10x with this (``bench/overlap_layer.py``). With mmap off and
trimming raised, freed blocks stay in the heap and the next step reuses them.
The peak of live memory does not change; the resident set no longer shrinks
between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_MAX = -4
KEEP_BYTES = 2**31 - 1  # give back only a free heap top above 2 GiB (mallopt takes an int)


def keep_freed_memory() -> bool:
    """Ask glibc to reuse freed large blocks; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
