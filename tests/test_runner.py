"""Training runs: run directory, summary, repeatability, resume, interruption, modes.

Runs use ``synthetic-small`` shrunk to a few hundred nodes so that each takes
about a second on two cores; the reporter is silent unless a test needs it.
"""

from __future__ import annotations

import io
import json
import math
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from qtrain import signals
from qtrain.errors import RecipeError
from qtrain.recipe import Recipe, build_recipe, load_recipe
from qtrain.runner import execute
from qtrain.train import metrics
from qtrain.train.progress import PlainReporter, Reporter, RichReporter, RunStart, make_reporter
from qtrain.train.rundir import read_metrics

SUMMARY_KEYS = {
    "test_acc",
    "val_acc",
    "best_epoch",
    "epochs",
    "epoch_time_s",
    "train_time_s",
    "peak_memory_bytes",
    "peak_memory_source",
    "run_dir",
    "plugins",
    "plugin_reports",
    "status",
    "recipe",
    "model",
    "dataset",
    "seed",
    "num_params",
    "metric",
}
TIMING_KEYS = {"epoch_time_s", "eval_time_s"}


def recipe(tmp_path: Path, name: str = "tiny", **tables: dict[str, Any]) -> Recipe:
    """A small recipe: gcn on a 300-node synthetic-small, 4 epochs, runs under tmp_path."""
    raw: dict[str, Any] = {
        "model": {"name": "gcn", "hidden": 8},
        "dataset": {"name": "synthetic-small", "nodes": 300},
        "train": {"epochs": 4},
        "output": {"dir": str(tmp_path / "runs")},
    }
    for key, table in tables.items():
        raw[key] = {**raw.get(key, {}), **table}
    return build_recipe(raw, name)


def without_times(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


class Recorder(Reporter):
    """Remembers what it was told; raises ``exc`` after epoch ``at``."""

    def __init__(self, at: int | None = None, exc: BaseException | None = None) -> None:
        self.at, self.exc = at, exc
        self.started: RunStart | None = None
        self.files_at_start: set[str] = set()
        self.epochs: list[dict[str, Any]] = []
        self.summary: dict[str, Any] | None = None

    def start(self, info: RunStart) -> None:
        self.started = info
        self.files_at_start = {p.name for p in Path(info.run_dir).iterdir()}

    def epoch(self, record: dict[str, Any]) -> None:
        self.epochs.append(record)
        if self.at is not None and record["epoch"] == self.at:
            assert self.exc is not None
            raise self.exc

    def finish(self, summary: dict[str, Any]) -> None:
        self.summary = summary


def test_run_directory_layout_and_summary(tmp_path: Path) -> None:
    reporter = Recorder()
    summary = execute(recipe(tmp_path), reporter=reporter)
    run_dir = Path(summary["run_dir"])
    assert run_dir.parent == tmp_path / "runs"
    assert run_dir.name.startswith("tiny-") and len(run_dir.name) == len("tiny-YYYYmmdd-HHMMSS")
    assert {p.name for p in run_dir.iterdir()} == {
        "recipe.toml",
        "metrics.jsonl",
        "summary.json",
        "checkpoint.pt",
        "curves.csv",
        "curves.png",
        "resume.pt",
    }
    # recipe.toml is written before training starts; metrics come later
    assert "recipe.toml" in reporter.files_at_start
    assert "metrics.jsonl" not in reporter.files_at_start

    assert set(summary) >= SUMMARY_KEYS
    assert json.loads((run_dir / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert reporter.summary == summary
    assert summary["status"] == "completed"
    assert summary["epochs"] == 4 and 1 <= summary["best_epoch"] <= 4
    assert summary["metric"] == "accuracy" and summary["plugins"] == []
    assert (summary["recipe"], summary["model"], summary["dataset"]) == (
        "tiny",
        "gcn",
        "synthetic-small",
    )
    assert summary["seed"] == 0 and summary["num_params"] > 0
    assert summary["peak_memory_bytes"] > 0 and "per step" in summary["peak_memory_source"]
    assert summary["activation_bytes"] > 0 and summary["process_peak_memory_bytes"] > 0
    assert 0.0 <= summary["test_acc"] <= 1.0 and 0.0 <= summary["val_acc"] <= 1.0

    records = read_metrics(run_dir)
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert {"epoch", "loss", "train_acc", "val_acc", "test_acc", "epoch_time_s"} <= set(r)
    best = next(r for r in records if r["epoch"] == summary["best_epoch"])
    assert best["val_acc"] == summary["val_acc"] == max(r["val_acc"] for r in records)
    assert best["test_acc"] == summary["test_acc"]

    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == summary["best_epoch"] and ckpt["val_acc"] == summary["val_acc"]
    from qtrain.data import load_dataset
    from qtrain.models import build_model

    r = recipe(tmp_path)
    model = build_model(r.model, load_dataset(r.dataset.name, r.dataset.options))
    model.load_state_dict(ckpt["model_state"])


def test_same_seed_same_numbers_and_resume_from_resolved_recipe(tmp_path: Path) -> None:
    first = execute(recipe(tmp_path, train={"epochs": 6}), reporter=Reporter())
    second = execute(recipe(tmp_path, train={"epochs": 6}), reporter=Reporter())
    assert first["run_dir"] != second["run_dir"]  # same second: a suffixed directory
    runs = [without_times(read_metrics(s["run_dir"])) for s in (first, second)]
    assert runs[0] == runs[1]

    resolved = load_recipe(Path(first["run_dir"]) / "recipe.toml")
    assert resolved == recipe(tmp_path, train={"epochs": 6})
    third = execute(resolved, reporter=Reporter())
    assert without_times(read_metrics(third["run_dir"])) == runs[0]
    assert third["test_acc"] == first["test_acc"]

    other = execute(recipe(tmp_path, train={"epochs": 6, "seed": 1}), reporter=Reporter())
    assert without_times(read_metrics(other["run_dir"])) != runs[0]


def test_keyboard_interrupt_keeps_what_was_measured(tmp_path: Path) -> None:
    reporter = Recorder(at=3, exc=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as info:
        execute(recipe(tmp_path, train={"epochs": 10}), reporter=reporter)
    run_dir = Path(info.value.run_dir)  # type: ignore[attr-defined]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["epochs"] == 3 and summary["best_epoch"] in (1, 2, 3)
    assert len(read_metrics(run_dir)) == 3
    assert (run_dir / "checkpoint.pt").exists() and (run_dir / "recipe.toml").exists()


def test_failure_mid_run_is_recorded_and_reraised(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        execute(recipe(tmp_path), reporter=Recorder(at=2, exc=RuntimeError("boom")))
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "boom" in summary["error"]
    assert summary["epochs"] == 2 and len(read_metrics(run_dir)) == 2


def test_an_error_a_stop_signal_caused_ends_the_run_interrupted(
    tmp_path: Path, stop_handlers: None
) -> None:
    """A distributed worker's stop signal lands in a finalizer (only remembered there) while
    it waits in a collective; the peer, stopped by the same signal, closes its connection
    and the collective raises. The run was interrupted, not failed (CI saw "failed")."""

    class StoppedPeer(Recorder):
        def epoch(self, record: dict[str, Any]) -> None:
            self.epochs.append(record)
            if record["epoch"] == 2:

                class Finalized:
                    def __del__(self) -> None:
                        signals._stop(signal.SIGTERM, sys._getframe())

                Finalized()
                raise RuntimeError("Connection closed by peer [127.0.0.1]:18622")

    with pytest.raises(KeyboardInterrupt, match="SIGTERM") as info:
        execute(recipe(tmp_path), reporter=StoppedPeer())
    assert isinstance(info.value.__cause__, RuntimeError)  # what the stop caused, chained
    run_dir = Path(info.value.run_dir)  # type: ignore[attr-defined]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "error" not in summary
    assert summary["epochs"] == 2 and (run_dir / "checkpoint.pt").exists()


@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
def test_minibatch_mode(tmp_path: Path, model: str) -> None:
    r = recipe(
        tmp_path,
        model={"name": model, "hidden": 8},
        train={"mode": "minibatch", "fanouts": [4, 4], "batch_size": 32, "epochs": 2},
    )
    summary = execute(r, reporter=Reporter())
    assert summary["status"] == "completed" and summary["mode"] == "minibatch"
    assert summary["epochs"] == 2 and summary["val_acc"] is not None
    assert len(read_metrics(summary["run_dir"])) == 2


def test_minibatch_is_repeatable(tmp_path: Path) -> None:
    train = {"mode": "minibatch", "fanouts": [3, 3], "batch_size": 32, "epochs": 2}
    runs = [
        without_times(
            read_metrics(execute(recipe(tmp_path, train=train), reporter=Reporter())["run_dir"])
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_fanouts_must_match_the_layers(tmp_path: Path) -> None:
    r = recipe(tmp_path, train={"mode": "minibatch", "fanouts": [5, 5, 5]})
    with pytest.raises(RecipeError, match=r"train\.fanouts .* 3 entries.* 2 GNN layers"):
        execute(r, reporter=Reporter())
    assert not (tmp_path / "runs").exists()  # refused before any run directory is made


def test_gcnii_refuses_minibatch(tmp_path: Path) -> None:
    r = recipe(tmp_path, model={"name": "gcnii", "layers": 2}, train={"mode": "minibatch"})
    with pytest.raises(
        RecipeError, match=r"train\.mode = 'minibatch' is not supported by model 'gcnii'"
    ):
        execute(r, reporter=Reporter())


def test_gcnii_trains_full_graph(tmp_path: Path) -> None:
    r = recipe(tmp_path, model={"name": "gcnii", "layers": 4, "hidden": 16}, train={"epochs": 2})
    assert execute(r, reporter=Reporter())["status"] == "completed"


def test_eval_every_and_early_stopping(tmp_path: Path) -> None:
    summary = execute(recipe(tmp_path, train={"epochs": 5, "eval_every": 2}), reporter=Reporter())
    records = read_metrics(summary["run_dir"])
    assert [r["epoch"] for r in records if "val_acc" in r] == [2, 4, 5]  # and always the last

    # lr 0: the validation metric never improves after the first evaluation
    stopped = execute(
        recipe(tmp_path, train={"epochs": 50, "lr": 0.0, "patience": 2}), reporter=Reporter()
    )
    assert stopped["epochs"] == 3 and stopped["best_epoch"] == 1 and stopped["stopped_early"]


def test_no_checkpoint_when_disabled(tmp_path: Path) -> None:
    summary = execute(recipe(tmp_path, output={"checkpoint": False}), reporter=Reporter())
    assert not (Path(summary["run_dir"]) / "checkpoint.pt").exists()


def test_plugins_are_activated_and_reported(tmp_path: Path) -> None:
    summary = execute(recipe(tmp_path, quant={"plugin": ["trace"]}), reporter=Reporter())
    assert summary["plugins"] == ["trace"]
    assert "trace" in summary["plugin_reports"]


def test_multilabel_task_uses_bce_and_micro_f1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from qtrain.data import DATASETS, load_dataset
    from qtrain.registry import Entry

    base = DATASETS.get("synthetic-small")

    def multilabel(options: Any) -> Any:
        ds = load_dataset("synthetic-small", options)
        labels = torch.nn.functional.one_hot(ds.graph.ndata["label"], ds.num_classes).float()
        labels[:, 0] = 1.0  # a second label on every node
        ds.graph.ndata["label"] = labels
        return dataclasses.replace(ds, metric="micro_f1")

    monkeypatch.setitem(
        DATASETS._entries,
        "test-multilabel",
        Entry("test-multilabel", multilabel, base.options, "test only", base.defaults),
    )
    summary = execute(recipe(tmp_path, dataset={"name": "test-multilabel"}), reporter=Reporter())
    assert summary["metric"] == "micro_f1" and 0.0 < summary["test_acc"] <= 1.0


def test_metrics() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
    assert metrics.accuracy(logits, torch.tensor([0, 1, 1])) == pytest.approx(2 / 3)
    # a split with no nodes has no metric (it used to read 0.0000)
    assert metrics.accuracy(logits[:0], torch.tensor([], dtype=torch.long)) is None
    multi = torch.tensor([[1.0, -1.0], [1.0, 1.0]])
    truth = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    # tp = 2, fp = 1, fn = 1 -> 2*2 / (4 + 1 + 1)
    assert metrics.micro_f1(multi, truth) == pytest.approx(4 / 6)
    assert metrics.micro_f1(-multi.abs(), torch.zeros(2, 2)) == 0.0
    assert metrics.micro_f1(multi[:0], truth[:0]) is None


def test_a_graph_without_validation_nodes_reports_none_not_zero(tmp_path: Path) -> None:
    """No validation node: nothing to select the best epoch on; the latest evaluation
    stands, its test metric is reported and the validation metric is none."""
    summary = execute(
        recipe(tmp_path, dataset={"val_fraction": 0.0}, train={"epochs": 4, "eval_every": 2}),
        reporter=Reporter(),
    )
    assert summary["status"] == "completed"
    assert summary["val_acc"] is None and summary["best_epoch"] == 4
    assert summary["test_acc"] is not None and 0.0 < summary["test_acc"] <= 1.0
    records = read_metrics(summary["run_dir"])
    assert [r.get("val_acc", "absent") for r in records] == ["absent", None, "absent", None]
    on_disk = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    assert on_disk["val_acc"] is None


def test_reporters_write_to_their_stream_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = io.StringIO()
    assert isinstance(make_reporter(stream), PlainReporter)
    execute(recipe(tmp_path, train={"epochs": 3, "eval_every": 2}), reporter=make_reporter(stream))
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("qtrain: gcn on synthetic-small")
    assert [line.split()[1] for line in lines[1:-1]] == ["2/3", "3/3"]  # evaluated epochs only
    assert "completed after 3 epochs" in lines[-1]
    assert capsys.readouterr().out == ""  # standard output belongs to the CLI

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Terminal()
    reporter = make_reporter(tty)
    assert isinstance(reporter, RichReporter)
    execute(recipe(tmp_path, train={"epochs": 2}), reporter=reporter)
    assert "loss" in tty.getvalue() and "val" in tty.getvalue()


def test_example_recipes_are_valid() -> None:
    examples = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.toml"))
    names = {p.stem for p in examples}
    assert {
        "cora-gcn",
        "cora-gat",
        "cora-sage",
        "citeseer-gcn",
        "citeseer-gat",
        "citeseer-sage",
        "arxiv-gcn",
        "arxiv-gat",
        "products-sage-minibatch",
    } <= names
    for path in examples:
        loaded = load_recipe(path)
        assert loaded.name == path.stem
        assert loaded.quant.plugins == ()
        if loaded.train.mode == "minibatch":
            layers = loaded.model.options.layers
            assert len(loaded.train.fanouts) == layers, path.name


# ------------------------------------------------------------ who runs the graph primitives


def _losses(summary: dict[str, Any]) -> list[float]:
    return [r["loss"] for r in read_metrics(summary["run_dir"])]


@pytest.mark.parametrize(
    ("model", "plugins"),
    [
        ("gcn", []),
        ("gat", []),
        ("sage", []),
        ("gcnii", []),
        ("gcn", ["tango"]),
        ("sage", ["tango"]),
    ],
)
def test_qtrain_graph_kernels_train_as_dgl_does(
    tmp_path: Path, model: str, plugins: list[str]
) -> None:
    """train.graph_kernels = 'qtrain' runs every graph primitive on qtrain's device route
    (what a GPU run uses) on the CPU: the run's numbers are DGL's."""
    runs = {}
    for kernels in ("dgl", "qtrain"):
        r = recipe(
            tmp_path,
            model={"name": model, "hidden": 8},
            train={"graph_kernels": kernels},
            quant={"plugin": plugins},
        )
        runs[kernels] = execute(r, reporter=Reporter())
    assert runs["dgl"]["graph_kernels"] == "dgl" and runs["qtrain"]["graph_kernels"] == "qtrain"
    assert "route" not in json.dumps(runs["dgl"]["kernels"])
    assert sum(runs["qtrain"]["kernels"]["spmm"].values()) > 0
    assert runs["qtrain"]["kernels"]["spmm"].get("route", 0) > 0 or plugins
    assert _losses(runs["qtrain"]) == pytest.approx(_losses(runs["dgl"]), rel=1e-3)
    assert runs["qtrain"]["val_acc"] == pytest.approx(runs["dgl"]["val_acc"], abs=0.02)


@pytest.mark.parametrize(
    ("model", "plugins"),
    [("gcn", ["trace"]), ("gcn", ["exact"]), ("gcn", ["tango", "exact"]), ("gat", ["tango"])],
)
def test_every_plugin_trains_on_the_route(tmp_path: Path, model: str, plugins: list[str]) -> None:
    """Where a plugin's random draws depend on which tensors a kernel saves or calls (exact
    compresses what autograd saves; under DGL's kernels tango also quantizes the primitives
    DGL's own backward passes call), the route trains to the same quality, not the same
    numbers."""
    runs = {}
    for kernels in ("dgl", "qtrain"):
        r = recipe(
            tmp_path,
            model={"name": model, "hidden": 8},
            train={"graph_kernels": kernels, "epochs": 10},
            quant={"plugin": plugins},
        )
        runs[kernels] = execute(r, reporter=Reporter())
    routed = runs["qtrain"]
    assert routed["status"] == "completed" and routed["plugins"] == plugins
    assert all(routed["plugin_reports"][p] for p in plugins)
    assert all(math.isfinite(x) for x in _losses(routed))
    assert routed["val_acc"] == pytest.approx(runs["dgl"]["val_acc"], abs=0.1)


def test_qtrain_graph_kernels_on_minibatch_blocks(tmp_path: Path) -> None:
    train = {"mode": "minibatch", "fanouts": [3, 3], "batch_size": 32, "epochs": 2}
    summary = execute(
        recipe(
            tmp_path,
            model={"name": "sage", "hidden": 8},
            train={**train, "graph_kernels": "qtrain"},
        ),
        reporter=Reporter(),
    )
    assert summary["status"] == "completed" and summary["graph_kernels"] == "qtrain"
    assert summary["kernels"]["spmm"]["route"] > 0


def test_device_auto_on_a_machine_without_a_gpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: auto picks it (make gpu-check covers that)")
    summary = execute(recipe(tmp_path, train={"device": "auto"}), reporter=Reporter())
    assert summary["device"] == "cpu" and summary["graph_kernels"] == "dgl"


@pytest.mark.parametrize("device", ["cuda:x", "tpu", ""])
def test_a_device_that_is_not_one_is_refused(tmp_path: Path, device: str) -> None:
    with pytest.raises(RecipeError, match=r"device = .* use .cpu., .cuda., .cuda:N. or .auto."):
        execute(recipe(tmp_path, train={"device": device}), reporter=Reporter())
    assert not (tmp_path / "runs").exists()


def test_dgl_graph_kernels_on_a_device_dgl_cannot_use_name_the_way_out() -> None:
    from qtrain.errors import QtrainError
    from qtrain.train.prepare import check_dgl_device

    with pytest.raises(QtrainError, match="graph_kernels = 'auto'"):
        check_dgl_device(torch.device("meta"))


# ------------------------------------------------------------ runs that stop being finite


def test_a_diverging_run_ends_diverged_and_keeps_no_number_it_did_not_earn(tmp_path: Path) -> None:
    from qtrain.errors import RunDiverged

    with pytest.raises(RunDiverged, match=r"diverged at epoch \d+: .*lower train\.lr") as caught:
        execute(recipe(tmp_path, train={"lr": 1e30, "epochs": 20}), reporter=Reporter())
    run_dir = Path(caught.value.run_dir)  # type: ignore[attr-defined]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "diverged" and "diverged at epoch" in summary["error"]
    records = read_metrics(run_dir)
    last = records[-1]
    assert last["diverged"] is True and last["loss"] is None
    assert summary["diverged_at"] == last["epoch"] == summary["epochs"]
    assert all(math.isfinite(r["loss"]) for r in records[:-1])
    assert summary["epochs"] < 20  # stopped, not trained to the end on NaN


def test_a_graph_without_training_nodes_is_refused_before_a_run_starts(tmp_path: Path) -> None:
    from qtrain._compat import import_dgl
    from qtrain.errors import DatasetError

    dgl = import_dgl()
    g = dgl.rand_graph(40, 120)
    g.ndata["feat"] = torch.randn(40, 5)
    g.ndata["label"] = torch.randint(0, 3, (40,))
    g.ndata["train_mask"] = torch.zeros(40, dtype=torch.bool)
    g.ndata["val_mask"] = g.ndata["test_mask"] = torch.ones(40, dtype=torch.bool)
    dgl.save_graphs(str(tmp_path / "g.bin"), [g])
    r = build_recipe(
        {
            "model": {"name": "gcn", "hidden": 8},
            "dataset": {"name": "dgl-file", "path": str(tmp_path / "g.bin")},
            "output": {"dir": str(tmp_path / "runs")},
        },
        "no-train",
    )
    with pytest.raises(DatasetError, match="no training nodes"):
        execute(r, reporter=Reporter())
    assert not (tmp_path / "runs").exists()


class _CheckpointWatch(Reporter):
    """Notes, at each epoch, whether checkpoint.pt exists and which epoch it holds."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None
        self.seen: dict[int, int | None] = {}

    def start(self, info: RunStart) -> None:
        self.run_dir = Path(info.run_dir)

    def epoch(self, record: dict[str, Any]) -> None:
        assert self.run_dir is not None
        path = self.run_dir / "checkpoint.pt"
        held = torch.load(path, weights_only=False)["epoch"] if path.exists() else None
        self.seen[record["epoch"]] = held


def test_the_best_model_is_written_every_few_epochs(tmp_path: Path) -> None:
    """A run killed outright (SIGKILL) keeps the best model of its last checkpoint epoch."""
    watch = _CheckpointWatch()
    execute(recipe(tmp_path, train={"epochs": 7}, output={"checkpoint_every": 3}), reporter=watch)
    assert watch.seen[1] is None and watch.seen[2] is None
    assert watch.seen[3] is not None and watch.seen[3] <= 3
    assert watch.seen[6] is not None and watch.seen[6] <= 6
