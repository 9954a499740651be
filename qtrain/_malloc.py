"""How a process that qtrain owns allocates memory: huge pages for torch, freed memory kept.

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a
fresh ``mmap`` and unmaps it on free. Full-graph layers allocate tensors of
tens of megabytes many times per step (outputs, gradients, zero-filled slice
gradients), so each one is page-faulted in and zeroed anew. That adds up: one
GCN layer split for overlap took 1.55x the whole block's time with glibc's
defaults and 1.10x with this (``bench/overlap_layer.py``), and synthetic-arxiv
epochs at two threads took 1.4-2.2x as long with glibc's defaults as with this
(``bench/allocator.py``). With mmap off and trimming raised, freed blocks stay in
the heap and the next step reuses them. The peak
of live memory does not change; the resident set no longer shrinks between
steps.

Only for a process qtrain owns (the ``qtrain`` command, its distributed workers, the
benchmarks that time what the command runs): ``import qtrain`` must not change a user's
allocator, and a user's own glibc malloc settings win.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_MAX = -4
KEEP_BYTES = 2**31 - 1  # give back only a free heap top above 2 GiB (mallopt takes an int)

# what a user tunes the same three settings with: glibc's environment variables and tunables
MALLOC_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
MALLOC_TUNABLES = (
    "glibc.malloc.mmap_max",
    "glibc.malloc.mmap_threshold",
    "glibc.malloc.trim_threshold",
)


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


def malloc_tuned_by_user(environ: Mapping[str, str] = os.environ) -> bool:
    """True where the environment already sets glibc's mmap or trim behaviour."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    return any(name in environ for name in MALLOC_VARIABLES) or any(
        name in tunables for name in MALLOC_TUNABLES
    )


def set_up_allocator(keep_freed: bool = True) -> bool:
    """What a process qtrain owns asks of its allocators, before torch allocates anything.

    Torch's CPU allocator neither caches nor asks for huge pages by default, so every large
    tensor (nodes x hidden) costs a page fault per 4 KiB when first written: on
    synthetic-arxiv that was a quarter of a GCN epoch. With ``THP_MEM_ALLOC_ENABLE`` set
    before torch's first allocation (it reads it then, not at import), tensors of 2 MiB or
    more are 2 MiB-aligned and advised as transparent huge pages; and freed memory is kept
    (:func:`keep_freed_memory`) unless ``keep_freed`` is false (a benchmark's baseline). A
    user's own value of either wins. Returns whether freed memory is now kept.
    """
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return keep_freed and not malloc_tuned_by_user() and keep_freed_memory()
