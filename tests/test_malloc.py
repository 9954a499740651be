"""qtrain._malloc: freed large tensors are reused, not page-faulted in again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# page faults of a second 64 MiB tensor, after the first one was freed (16,384 pages of
# 4 KiB, or 32 huge pages and the odd small one where transparent huge pages are on)
SECOND_ALLOCATION = """
import resource, sys, torch
from qtrain._malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
x = torch.ones(1 << 24); del x
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
y = torch.ones(1 << 24)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    # as the qtrain command and its workers run: with huge pages asked for (qtrain.cli.main),
    # which `import qtrain` used to set. Without them the freed block is often split by
    # later small allocations and the second tensor is fresh memory again (16,384 faults).
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SECOND_ALLOCATION, mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
def test_a_freed_large_tensor_is_reused_without_page_faults() -> None:
    # glibc maps the tensor afresh: every page faults in (and is zeroed by the kernel) again
    assert _faults("keep") < 32 < _faults("default")
