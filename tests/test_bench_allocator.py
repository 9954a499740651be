"""bench/allocator.py: one process per allocator setting, the command's keeping freed memory
and the default's not, ratios per variant; a bad variant ends in one line (the times are the
bench's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import bench_script


@pytest.fixture(scope="module")
def allocator() -> Any:
    yield from bench_script("allocator")


def test_each_setting_in_its_own_process(allocator: Any, tmp_path: Path) -> None:
    out = tmp_path / "allocator.json"
    argv = ["--models", "default-gcn", "--variants", "fp32", "--rounds", "1", "--repeat", "1"]
    assert allocator.main([*argv, "--threads", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["freed_memory_kept"] == {"command": [True], "default": [False]}
    row = result["models"]["default-gcn"]["fp32"]
    assert row["default_over_command"] > 0 and len(row["round_ratios"]) == 1
    assert row["command_s"] and row["default_s"]


def test_a_bad_variant_ends_in_one_line(allocator: Any) -> None:
    with pytest.raises(SystemExit, match="--allocator command failed"):
        allocator.main(["--models", "default-gcn", "--variants", "fp33", "--rounds", "1"])
