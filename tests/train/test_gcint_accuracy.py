"""Accuracy bars of integer-only training (issue 28): ``train.numerics = "gcint"`` within
1.0 point of the FP32 run of the same recipe, mean test accuracy over seeds 0, 1, 2:

* full graph, Cora and Citeseer with the built-in GCN (16 hidden units, the example recipes
  as shipped), the paper's DyQ and loss; reads ../shared/datasets (skipped without it);
* mini-batch, GCINT's setting (256 hidden units, 25 / 10 neighbours, batches of 1024) on
  synthetic-arxiv (40 classes, 3 epochs) and synthetic-products (47 classes, 2.4M nodes,
  one epoch), the bounded DyQ, the softmax error and the decaying step.

Each gcint run must really have trained integer-only: no float product counted.
``pytest -s`` prints the accuracies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import SEEDS, ExampleRuns, needs_planetoid

TOLERANCE = 1.0  # points
GCINT = {
    "gcint dyq": ["train.numerics=gcint"],
    "gcint stq": ["train.numerics=gcint", "train.gcint_quantizer=stq"],
}

pytestmark = [pytest.mark.slow]


def _assert_integer_only(name: str, summary: dict[str, Any], batches_per_epoch: int = 1) -> None:
    """Every product of the run integer: the op library's int8 GEMMs and SpMMs ran (5 and
    at least 3 per step), no float one was counted."""
    assert summary["numerics"] == "gcint", name
    kernels = summary["kernels"]
    assert set(kernels) == {"int_gemm", "int_spmm", "requantize", "dyq"}, (name, kernels)
    steps = batches_per_epoch * summary["epochs"]
    assert kernels["int_gemm"]["ext-cpu"] >= 5 * steps
    assert kernels["int_spmm"]["ext-cpu"] >= 3 * steps


@needs_planetoid
@pytest.mark.parametrize("example", ["cora-gcn", "citeseer-gcn"])
def test_gcint_within_one_point_of_fp32(example: str, example_runs: ExampleRuns) -> None:
    fp32 = example_runs.mean(example, [])
    print(f"{example} fp32: {fp32:.2f}")
    dyq = example_runs.mean(example, GCINT["gcint dyq"])
    stq = example_runs.mean(example, GCINT["gcint stq"])
    print(f"{example} gcint dyq: {dyq:.2f}, stq: {stq:.2f} (not held to the bar)")
    for name, overrides in GCINT.items():
        for summary in example_runs.summaries(example, overrides):
            _assert_integer_only(name, summary)
    gap = fp32 - dyq
    assert gap <= TOLERANCE, (
        f"{example}: gcint (DyQ) mean {dyq:.2f} is {gap:.2f} points below FP32 {fp32:.2f} "
        f"(seeds {SEEDS})"
    )


# GCINT's mini-batch setting: 256 hidden units, 25 / 10 neighbours, batches of 1024
MINIBATCH_TRAIN = {"patience": 0, "mode": "minibatch", "fanouts": [25, 10], "batch_size": 1024}
GCINT_MINIBATCH = {
    "numerics": "gcint",
    "gcint_quantizer": "dyq-bounded",
    "gcint_loss": "softmax",
}
# dataset: (epochs, training batches per epoch, extra train keys). Measured on 2 cores:
# synthetic-arxiv, 3 epochs (91k training nodes): FP32 79.79, gcint 81.71 with the decaying
# step (81.29 constant, 79.55 before the softmax error's per-row window; the paper's DyQ
# 72.87). synthetic-products (196k training nodes): one epoch, seed 0, FP32 69.77 and gcint
# 80.33 (2 epochs, 3 seeds, bench/gcint.py: 73.55 and 85.48); about 80 s a run, FP32's
# evaluation all nodes at once (in batches of 65,536 it took 264 s of the run's 349).
MINIBATCH_DATASETS = {
    "synthetic-arxiv": (3, 80, {}),
    "synthetic-products": (1, 192, {"eval_batch_size": 0}),
}


@pytest.mark.parametrize("dataset", list(MINIBATCH_DATASETS))
def test_minibatch_gcint_within_one_point_of_fp32(tmp_path: Path, dataset: str) -> None:
    """GCINT's mini-batch setting: the bounded DyQ, the softmax error and (``auto``) the
    step decaying over the run, against FP32 Adam and cross-entropy on the same recipe."""
    from qtrain.recipe import build_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    epochs, batches, extra_train = MINIBATCH_DATASETS[dataset]
    train = {**MINIBATCH_TRAIN, **extra_train, "epochs": epochs, "eval_every": epochs}
    accuracy: dict[str, list[float]] = {"fp32": [], "gcint": []}
    for seed in SEEDS:
        for name, extra in (("fp32", {}), ("gcint", GCINT_MINIBATCH)):
            raw = {
                "model": {"name": "gcn", "hidden": 256, "layers": 2},
                "dataset": {"name": dataset},
                "train": {**train, **extra, "seed": seed},
                "output": {"dir": str(tmp_path), "checkpoint": False},
            }
            summary = execute(build_recipe(raw, f"{name}-{seed}"), reporter=Reporter())
            assert summary["status"] == "completed", summary.get("error")
            if name == "gcint":
                _assert_integer_only(name, summary, batches_per_epoch=batches)
                assert summary["gcint"]["lr_decay"] == "linear"
            accuracy[name].append(100.0 * summary["test_acc"])
    fp32, gcint = (sum(v) / len(v) for v in (accuracy["fp32"], accuracy["gcint"]))
    print(f"{dataset} mini-batch fp32: {fp32:.2f}, gcint bounded softmax: {gcint:.2f}")
    assert fp32 - gcint <= TOLERANCE, (
        f"{dataset}: mini-batch gcint mean {gcint:.2f} is {fp32 - gcint:.2f} points below "
        f"FP32 {fp32:.2f} (seeds {SEEDS}: {accuracy})"
    )
