"""Issue 32's accuracy bars that take hours to measure on 2 cores.

On synthetic-arxiv GCN and GAT, mean test accuracy over seeds 0, 1, 2 against FP32 with
the same seeds: tango with its defaults at 4 bits within 1.0 point, at 2 bits within 3.0,
``bits = "auto"`` within 0.3; exact at 1 bit within 0.5. On the six Planetoid recipes,
``"auto"`` within 0.3 point; over all eight recipes' runs it picks 5 bits or fewer on
average. Each run also shows that the low-bit kernels ran (accuracy_checks.py).

Marked ``hours`` (about 30 runs of 5 to 20 minutes on synthetic-arxiv, two threads a
run): never run by default, run by ``pytest -m hours tests/plugins/test_lowbit_bars.py -s``
(``-s`` prints the table). The Planetoid bars at 4 and 2 bits and at INT1, and ``"auto"``
within 1.0 point, are the slow tests' (test_tango_lowbit_accuracy.py, test_exact_accuracy.py,
test_tango_accuracy.py), which ``make test`` runs; ``"auto"``'s 0.3 is asserted here
only: its Planetoid gaps (Citeseer GCN -0.23) are a test node or two from the bar, which a
machine whose float kernels round differently can cross. The Planetoid runs read
../shared/datasets (skipped without it); synthetic-arxiv is generated into qtrain's data
folder by the first run that needs it.
"""

from __future__ import annotations

import statistics

import pytest
from accuracy_checks import (
    assert_activations_compressed,
    assert_auto_chose_by_gradient,
    assert_tango_low_bits_ran,
)
from conftest import SEEDS, ExampleRuns, needs_planetoid

pytestmark = pytest.mark.hours

ARXIV = ("arxiv-gcn", "arxiv-gat")
PLANETOID = ("cora-gcn", "cora-gat", "cora-sage", "citeseer-gcn", "citeseer-gat", "citeseer-sage")
THREADS = ["train.threads=2"]  # as the README's synthetic-arxiv rows were measured
TANGO = ['quant.plugin=["tango"]']
AUTO = [*TANGO, 'quant.tango.bits="auto"']
AUTO_BAR = 0.3  # points below FP32
AUTO_MEAN_BITS = 5.0
VARIANTS = {  # name: (overrides, points below FP32 allowed)
    "tango-4": ([*TANGO, "quant.tango.bits=4"], 1.0),
    "tango-2": ([*TANGO, "quant.tango.bits=2"], 3.0),
    "tango-auto": (AUTO, AUTO_BAR),
    "exact-int1": (['quant.plugin=["exact"]', "quant.exact.bits=1"], 0.5),
}


def _gap(runs: ExampleRuns, example: str, overrides: list[str], fp32: list[str]) -> float:
    """Points the variant's mean is below FP32's (printed with the seeds' accuracies)."""
    base, got = runs.accuracies(example, fp32), runs.accuracies(example, overrides)
    print(
        f"{example} {overrides}: {statistics.mean(got):.2f} {got}; FP32 {statistics.mean(base):.2f} {base}"
    )
    return statistics.mean(base) - statistics.mean(got)


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("example", ARXIV)
def test_synthetic_arxiv_bars(example: str, name: str, synthetic_runs: ExampleRuns) -> None:
    overrides, bar = VARIANTS[name]
    overrides = [*overrides, *THREADS]
    for plain, summary in zip(
        synthetic_runs.summaries(example, THREADS),
        synthetic_runs.summaries(example, overrides),
        strict=True,
    ):
        if name == "exact-int1":
            assert_activations_compressed(example, name, plain, summary)
        else:
            bits = summary["plugin_reports"]["tango"]["bits"]
            if name == "tango-auto":
                assert assert_auto_chose_by_gradient(example, summary) == bits
            assert_tango_low_bits_ran(example, summary, bits)
    gap = _gap(synthetic_runs, example, overrides, THREADS)
    assert gap <= bar, (
        f"{example}: {name} is {gap:.2f} points below FP32 (seeds {SEEDS}; bar {bar})"
    )


@needs_planetoid
@pytest.mark.parametrize("example", PLANETOID)
def test_auto_within_a_third_of_a_point_on_planetoid(
    example: str, example_runs: ExampleRuns
) -> None:
    for summary in example_runs.summaries(example, AUTO):
        assert_auto_chose_by_gradient(example, summary)
    gap = _gap(example_runs, example, AUTO, [])
    assert gap <= AUTO_BAR, f"{example}: auto is {gap:.2f} points below FP32 (bar {AUTO_BAR})"


@needs_planetoid
def test_auto_picks_five_bits_or_fewer_on_average(
    example_runs: ExampleRuns, synthetic_runs: ExampleRuns
) -> None:
    picks = [
        assert_auto_chose_by_gradient(example, summary)
        for runs, examples, overrides in (
            (example_runs, PLANETOID, AUTO),
            (synthetic_runs, ARXIV, [*AUTO, *THREADS]),
        )
        for example in examples
        for summary in runs.summaries(example, overrides)
    ]
    mean = statistics.mean(picks)
    print(f"auto over the eight recipes: bits {picks}, mean {mean:.2f}")
    assert mean <= AUTO_MEAN_BITS, f"auto picked {mean:.2f} bits on average: {picks}"
