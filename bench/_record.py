"""What every benchmark writes next to its figures: the commit measured, and the JSON file."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> str | None:
    """The checkout's commit (with "+dirty" when the working tree has changes), for the record."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def provenance() -> dict[str, Any]:
    """The fields that say how a result was made: the command line, the commit, the CPU."""
    return {
        "command": " ".join(["python", *sys.argv]),
        "git_commit": git_commit(),
        "cpu": platform.machine(),
    }


def write_json(path: Path | None, results: dict[str, Any]) -> None:
    """Write ``results`` to ``path`` (parents created); nothing when no path was given."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str))
