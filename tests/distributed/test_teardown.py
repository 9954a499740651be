"""A worker leaves its process group with no communication thread left running.

A gloo thread that outlives ``destroy_process_group`` can drop the last reference to a
tensor while the interpreter finalizes, and the worker then dies of SIGABRT after a
finished run (seen in CI, under load, as "terminate called without an active
exception"). The race itself is rare; the thread that makes it possible is not, so the
tests look for the thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="thread names are read from Linux's /proc"
)

# A fresh interpreter, so that the first optimizer imports torch._dynamo inside the
# group, as in a worker (this test process may have imported it already).
_WORKER = """
import glob, json, os, socket, sys, time
import torch
import torch.distributed as dist
from qtrain.distributed.launch import process_group

def names():
    return sorted(open(f).read().strip() for f in glob.glob("/proc/self/task/*/comm"))

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
fresh = "torch._dynamo" not in sys.modules
with process_group("gloo", 0, 1, 60):
    dist.barrier()
    # a thread names itself once it runs: on a busy machine that can take a moment
    deadline = time.monotonic() + 30
    while not any("gloo" in n for n in names()) and time.monotonic() < deadline:
        time.sleep(0.05)
    inside = names()
    torch.optim.Adam([torch.nn.Parameter(torch.ones(2))])
after = names()
print(json.dumps({"fresh": fresh, "inside": inside, "after": after}))
"""


def _gloo(names: list[str]) -> list[str]:
    return [name for name in names if "gloo" in name]


def test_no_gloo_thread_outlives_the_process_group() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WORKER], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["fresh"], "torch._dynamo was imported before the group: the test proves nothing"
    assert _gloo(seen["inside"]), seen["inside"]  # the threads this test looks for exist
    assert not _gloo(seen["after"]), seen["after"]
