"""bench/exact_capacity.py's arithmetic over its children's rows (the children themselves
load synthetic-products, which is the bench's to run): rounds pooled, steady step times
without each child's first step, and the comparison with FP32 only where FP32 finished."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import bench_script

GIB = 2**30


@pytest.fixture(scope="module")
def capacity() -> Any:
    yield from bench_script("exact_capacity")


def child(outcome: str, peak_gib: float, steps: list[float] | None) -> dict[str, Any]:
    return {
        "outcome": outcome,
        "max_rss_bytes_polled": int(peak_gib * GIB),
        "max_hwm_bytes_polled": int(peak_gib * GIB),
        "step_seconds": steps,
    }


def pooled(capacity: Any, *rounds: dict[str, Any]) -> dict[str, Any]:
    row = dict(rounds[0])
    row["rounds"] = [capacity._round_summary(r) for r in rounds]
    capacity._pool_rounds(row)
    return row


def test_rounds_pool_the_highest_peak_and_the_steps_after_the_first(capacity: Any) -> None:
    row = pooled(
        capacity,
        child("finished", 8.2, [33.0, 29.0, 28.0]),
        child("finished", 9.2, [34.0, 30.0, 31.0]),
    )
    assert row["max_rss_bytes_polled"] == int(9.2 * GIB)
    assert row["steady_step_seconds"] == [29.0, 28.0, 30.0, 31.0]
    assert row["outcome"] == "finished"
    killed = pooled(
        capacity, child("finished", 8.0, [1.0]), child("killed at the budget", 12, None)
    )
    assert killed["outcome"] == "killed at the budget" and killed["steady_step_seconds"] == []


def test_comparison_with_fp32(capacity: Any) -> None:
    fp32 = pooled(capacity, child("finished", 16.0, [40.0, 32.0, 30.0]))
    int2 = pooled(capacity, child("finished", 8.0, [33.0, 30.0, 36.0]))
    versus = capacity.compare_to_fp32({"fp32": fp32, "int2": int2})["int2"]
    assert versus["peak_ratio"] == pytest.approx(2.0)
    assert versus["step_time_ratio"] == pytest.approx(33.0 / 31.0)
    assert versus["fp32_step_s_iqr"][0] <= 31.0 <= versus["fp32_step_s_iqr"][1]


@pytest.mark.parametrize(
    "fp32_row",
    [
        child("killed at the budget", 12.0, None),  # no FP32 step: no ratio to earn
        child("finished", 16.0, [40.0]),  # only a first step (it builds DGL's formats)
    ],
)
def test_no_comparison_without_a_steady_fp32_step(capacity: Any, fp32_row: dict) -> None:
    fp32 = pooled(capacity, fp32_row)
    int2 = pooled(capacity, child("finished", 8.0, [33.0, 30.0]))
    assert capacity.compare_to_fp32({"fp32": fp32, "int2": int2}) == {}
