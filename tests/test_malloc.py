"""qtrain._malloc: a freed large block is reused, not page-faulted in again.

The check talks to glibc directly (malloc, memset, free) so that it measures the
allocator settings alone: torch's own padding for huge-page alignment and the
machine's transparent-huge-page mode move a tensor's start by up to 2 MiB, which
made a tensor-level count depend on the machine (CI saw 544 faults where a
workstation saw 0).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# minor page faults of a second 64 MiB block (16,384 pages of 4 KiB), after the first was freed
SECOND_ALLOCATION = """
import ctypes, ctypes.util, resource, sys
from qtrain._malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.restype, libc.memset.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
size = 64 << 20
first = libc.malloc(size); libc.memset(first, 1, size); libc.free(first)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
second = libc.malloc(size); libc.memset(second, 1, size)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", SECOND_ALLOCATION, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
def test_a_freed_large_block_is_reused_without_page_faults() -> None:
    # glibc's default maps the block afresh: every page faults in (and is zeroed) again,
    # at least 32 faults even where transparent huge pages back it with 2 MiB pages
    assert _faults("keep") < 16 < 32 <= _faults("default")
