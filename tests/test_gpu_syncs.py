"""bench/gpu_syncs.py where CI can run it: the phase and site of a sync from its Python
stack, the report, and the refusal without CUDA (the debug mode exists only there)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def syncs() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("gpu_syncs", ROOT / "bench" / "gpu_syncs.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


def frame(path: str, line: int, name: str) -> traceback.FrameSummary:
    return traceback.FrameSummary(str(ROOT / path), line, name)


RUNNER = [
    frame("bench/gpu_syncs.py", 1, "measure"),
    frame("qtrain/runner.py", 50, "execute"),
    frame("qtrain/train/loop.py", 320, "run"),
]


@pytest.mark.parametrize(
    ("inner", "phase"),
    [
        ([frame("qtrain/train/loop.py", 225, "train_epoch")], "step"),
        ([frame("qtrain/train/loop.py", 267, "evaluate")], "eval"),
        ([frame("qtrain/train/loop.py", 296, "_check_finite")], "epoch"),
    ],
)
def test_a_sync_is_placed_by_the_runner_function_around_it(
    syncs: Any, inner: list[traceback.FrameSummary], phase: str
) -> None:
    torch_frame = traceback.FrameSummary("/x/site-packages/torch/nn/modules/module.py", 1, "f")
    stack = [*RUNNER, *inner, frame("qtrain/ops/sparse.py", 266, "qspmm"), torch_frame]
    got_phase, site = syncs.phase_and_site(stack)
    assert got_phase == phase
    assert site.startswith("qtrain/ops/sparse.py:266 qspmm  <-  qtrain/train/loop.py:")
    assert site.count("<-") == 2 and "module.py" not in site


def test_a_sync_before_the_first_epoch_is_setup(syncs: Any) -> None:
    stack = [RUNNER[0], RUNNER[1], frame("qtrain/train/prepare.py", 145, "prepared")]
    assert syncs.phase_and_site(stack) == (
        "setup",
        "qtrain/train/prepare.py:145 prepared  <-  qtrain/runner.py:50 execute",
    )
    assert syncs.phase_and_site([RUNNER[0]]) == ("setup", "(outside qtrain)")


def test_report_names_the_phases_and_sites(syncs: Any) -> None:
    row = {
        "model": "gcn",
        "variant": "tango",
        "status": "ok",
        "epochs": 4,
        "syncs": {"step": 8, "eval": 2, "epoch": 4, "setup": 1},
        "step_syncs_per_epoch": 2.0,
        "sites": [{"phase": "step", "site": "qtrain/ops/sparse.py:266 qspmm", "count": 8}],
    }
    text = syncs.report([row])
    assert "gcn tango (ok): 4 epochs, syncs by phase: step 8, eval 2, epoch 4, setup 1" in text
    assert "in the step 2.0 per epoch" in text
    assert "      8  step   qtrain/ops/sparse.py:266 qspmm" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_says_so(syncs: Any) -> None:
    done = subprocess.run(
        [sys.executable, "bench/gpu_syncs.py", "--models", "gcn"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"gpu_syncs: torch {torch.__version__} sees no CUDA device"
    ]


def test_a_sync_on_autograds_device_thread_is_the_steps_backward(syncs: Any) -> None:
    """On CUDA, autograd runs the backward on its own thread: the stack starts at the
    backward function, with none of the runner's frames."""
    stack = [
        frame("qtrain/plugin.py", 155, "__torch_function__"),
        frame("qtrain/ops/gemm.py", 220, "int8_gemm"),
        frame("qtrain/ops/gemm.py", 180, "combined_scale"),
    ]
    phase, site = syncs.phase_and_site(stack)
    assert phase == "step"
    assert site.startswith("qtrain/ops/gemm.py:180 combined_scale")
