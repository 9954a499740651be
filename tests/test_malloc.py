"""qtrain._malloc: a freed large block is reused, not page-faulted in again.

The check talks to glibc directly (malloc, memset, free) so that it measures the
allocator settings alone: torch's own padding for huge-page alignment and the
machine's transparent-huge-page mode move a tensor's start by up to 2 MiB, which
made a tensor-level count depend on the machine (CI saw 544 faults where a
workstation saw 0).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from qtrain._malloc import malloc_tuned_by_user, set_up_allocator

# minor page faults of a second 64 MiB block (16,384 pages of 4 KiB), after the first was freed
SECOND_ALLOCATION = """
import ctypes, ctypes.util, resource, sys
from qtrain._malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
elif sys.argv[1] == "command":  # what the qtrain command sets up before it parses anything
    from qtrain.cli import main
    sys.argv = ["qtrain", "--help"]
    try:
        main()
    except SystemExit:
        pass
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


def _faults(mode: str, environ: dict[str, str] | None = None) -> int:
    # this run's own malloc settings only: none inherited from the shell
    env = {k: v for k, v in os.environ.items() if not malloc_tuned_by_user({k: v})}
    done = subprocess.run(
        [sys.executable, "-c", SECOND_ALLOCATION, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**env, **(environ or {})},
    )
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
def test_a_freed_large_block_is_reused_without_page_faults() -> None:
    # glibc's default maps the block afresh: every page faults in (and is zeroed) again,
    # at least 32 faults even where transparent huge pages back it with 2 MiB pages
    assert _faults("keep") < 16 < 32 <= _faults("default")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
def test_the_command_keeps_freed_memory_unless_the_user_tuned_malloc() -> None:
    """``qtrain`` (cli.main) keeps freed memory for its process; a user's own glibc setting
    (here the default mmap count, spelt out) wins."""
    assert _faults("command") < 16
    assert _faults("command", {"MALLOC_MMAP_MAX_": "65536"}) >= 32
    assert _faults("command", {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}) >= 32
    # what the README tells a user's own script to set: the same effect without qtrain
    assert (
        _faults("default", {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647"}) < 16
    )


@pytest.mark.parametrize(
    ("environ", "tuned"),
    [
        ({}, False),
        ({"MALLOC_MMAP_MAX_": "0"}, True),
        ({"MALLOC_MMAP_THRESHOLD_": "1048576"}, True),
        ({"MALLOC_TRIM_THRESHOLD_": "0"}, True),
        ({"GLIBC_TUNABLES": "glibc.cpu.x86_shstk=off:glibc.malloc.mmap_max=0"}, True),
        ({"GLIBC_TUNABLES": "glibc.cpu.x86_shstk=off"}, False),
        ({"MALLOC_ARENA_MAX": "2", "MALLOC_PERTURB_": "1"}, False),  # not what qtrain sets
    ],
)
def test_what_counts_as_the_users_malloc_setting(environ: dict[str, str], tuned: bool) -> None:
    assert malloc_tuned_by_user(environ) is tuned


def test_a_baseline_asks_for_huge_pages_but_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``set_up_allocator(keep_freed=False)`` (bench/epoch.py --allocator default) sets the
    huge-page variable a user has not set, and leaves glibc alone."""
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    assert set_up_allocator(keep_freed=False) is False
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "1"
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    assert set_up_allocator(keep_freed=False) is False
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "0"
