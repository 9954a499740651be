"""The Python examples run as a user runs them and learn what they are meant to learn."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("plugin", [None, "tango", "exact"])
def test_own_loop_on_the_device_route(plugin: str | None) -> None:
    """examples/own_loop_gpu.py on the CPU: the route a GPU run takes, with DGL's CPU build."""
    command = [sys.executable, str(ROOT / "examples" / "own_loop_gpu.py"), "--device", "cpu"]
    if plugin:
        command += ["--plugin", plugin]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    found = re.search(r"device cpu, loss [\d.]+, held-out accuracy ([\d.]+)", done.stdout)
    assert found, done.stdout
    assert float(found.group(1)) > 0.9  # two communities: chance is 0.5
