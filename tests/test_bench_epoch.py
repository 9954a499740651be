"""bench/epoch.py's bit-count variants (issue 32): ``tango-B`` / ``tango-B-int8`` run tango at
B bits packed / unpacked, every row has the bytes its steps saved, and ``--baseline`` adds
ratios against one variant; bad names are refused in one line (the times are the bench's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import bench_script

# their main() would keep freed memory for the rest of this worker
pytestmark = pytest.mark.usefixtures("allocator_left_alone")


@pytest.fixture(scope="module")
def epoch() -> Any:
    yield from bench_script("epoch")


def test_bit_count_variants_against_a_baseline(
    epoch: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "epoch.json"
    argv = ["--models", "default-gcn", "--variants", "tango-8", "tango-4", "tango-4-int8"]
    argv += ["--baseline", "tango-8", "--small-repeat", "2", "--small-warmup", "1"]
    argv += ["--small-settle", "0", "--json", str(out)]
    assert epoch.main(argv) == 0
    rows = json.loads(out.read_text())["models"]["default-gcn"]
    assert list(rows) == ["tango-8", "tango-4", "tango-4-int8"]
    settings = {name: (r["tango"]["bits"], r["tango"]["packed"]) for name, r in rows.items()}
    assert settings == {"tango-8": (8, True), "tango-4": (4, True), "tango-4-int8": (4, False)}
    for row in rows.values():
        assert row["activation_bytes"] > 0 and row["speedup_vs_baseline"] > 0
        assert len(row["speedup_vs_baseline_iqr"]) == 2 and row["saved_vs_baseline"] > 0
    assert rows["tango-8"]["speedup_vs_baseline"] == rows["tango-8"]["saved_vs_baseline"] == 1.0
    assert "vs tango-8" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--variants", "tango-9"], "invalid variant value: 'tango-9'"),
        (["--variants", "tango-4", "--baseline", "tango-8"], "is not one of --variants"),
        (["--settle", "-1"], "must be a whole number of epochs, 0 or more: '-1'"),
        (["--settle", "two"], "must be a whole number of epochs, 0 or more: 'two'"),
        (["--device", "gpu0"], "use 'cpu', 'cuda', 'cuda:N' or 'auto', not 'gpu0'"),
        (["--device", "cuda:99"], "train.device = 'cuda:99', but torch sees"),
    ],
)
def test_a_bad_variant_is_refused(
    epoch: Any, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        epoch.main(argv)
    assert info.value.code == 2 and says in capsys.readouterr().err
