"""A user's own model in a recipe: ``module:Class`` or a ``qtrain.models`` entry point."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import qtrain.models as models
from qtrain.errors import RecipeError
from qtrain.recipe import build_recipe, load_recipe, resolve_toml
from qtrain.registry import Registry
from qtrain.runner import execute
from qtrain.train.progress import Reporter

MODULE = '''
from dataclasses import dataclass

import torch
from torch import nn

from qtrain._compat import import_dgl
from qtrain.config import option
from qtrain.models import GNNModel

dgl = import_dgl()
from dgl.nn import GraphConv


class TwoLayerGCN(nn.Module):
    """Two GraphConv layers, as a DGL tutorial writes them."""

    def __init__(self, in_feats: int, num_classes: int, hidden: int = 16, dropout: float = 0.5):
        super().__init__()
        self.layers = nn.ModuleList([GraphConv(in_feats, hidden), GraphConv(hidden, num_classes)])
        self.dropout = nn.Dropout(dropout)

    def prepare_graph(self, graph):
        return dgl.add_self_loop(dgl.remove_self_loop(graph))

    def forward(self, graph, x):
        h = torch.relu(self.layers[0](graph, x))
        return self.layers[1](graph, self.dropout(h))


@dataclass(frozen=True)
class SkipOptions:
    hidden: int = option(8, "hidden units", min=1)


class Skip(GNNModel):
    """A GNNModel with an Options dataclass, as the built-in models are declared."""

    Options = SkipOptions

    def __init__(self, in_feats, num_classes, options):
        super().__init__()
        self.layers.append(GraphConv(in_feats, options.hidden, allow_zero_in_degree=True))
        self.layers.append(GraphConv(options.hidden, num_classes, allow_zero_in_degree=True))

    def layer_dims(self):
        return [layer._out_feats for layer in self.layers]

    def layer_step(self, i, graph, h):
        h = self.layers[i](graph, h)
        return torch.relu(h) if i == 0 else h


class NoSizes(nn.Module):
    def __init__(self, hidden=4):
        super().__init__()


NOT_A_CLASS = 3
'''


@pytest.fixture
def usermods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"usermods_{tmp_path.name.replace('-', '_')}"  # one module per test: no stale import
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _raw(tmp_path: Path, model: dict[str, Any], **train: Any) -> dict[str, Any]:
    return {
        "model": model,
        "dataset": {"name": "synthetic-small", "nodes": 300},
        "train": {"epochs": 3, **train},
        "output": {"dir": str(tmp_path / "runs")},
    }


def test_a_plain_module_trains_from_a_recipe_and_its_options_round_trip(
    tmp_path: Path, usermods: str
) -> None:
    name = f"{usermods}:TwoLayerGCN"
    recipe = build_recipe(_raw(tmp_path, {"name": name, "hidden": 8, "dropout": 0.1}), "mine")
    summary = execute(recipe, reporter=Reporter())
    assert summary["status"] == "completed" and summary["test_acc"] is not None
    text = resolve_toml(recipe)
    assert f'name = "{name}"' in text and "hidden = 8" in text and "dropout = 0.1" in text
    path = tmp_path / "again.toml"
    path.write_text(text)
    assert load_recipe(path).model == recipe.model


def test_a_gnnmodel_with_options_trains_full_graph_and_on_blocks(
    tmp_path: Path, usermods: str
) -> None:
    name = f"{usermods}:Skip"
    for mode in ("full", "minibatch"):
        raw = _raw(tmp_path, {"name": name, "hidden": 6}, mode=mode, fanouts=[3, 3])
        summary = execute(build_recipe(raw, "skip"), reporter=Reporter())
        assert summary["status"] == "completed", mode


def test_tango_keeps_a_user_modules_last_layer_in_float32(tmp_path: Path, usermods: str) -> None:
    raw = {**_raw(tmp_path, {"name": f"{usermods}:TwoLayerGCN"}), "quant": {"plugin": ["tango"]}}
    summary = execute(build_recipe(raw, "mine"), reporter=Reporter())
    report = summary["plugin_reports"]["tango"]
    assert report["fp32_before_softmax"] is True
    assert "gemm: output layer (fp32_before_softmax)" in report["fp32_calls"]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"hidden": "wide"}, r"^model\.hidden = 'wide' must be an integer$"),
        ({"hiden": 8}, r"^unknown key model\.hiden; allowed keys: dropout, hidden$"),
        ({"dropout": float("nan")}, r"model\.dropout = nan must be a finite number"),
    ],
)
def test_options_are_checked_against_the_constructor(
    tmp_path: Path, usermods: str, model: dict[str, Any], message: str
) -> None:
    with pytest.raises(RecipeError, match=message):
        build_recipe(_raw(tmp_path, {"name": f"{usermods}:TwoLayerGCN", **model}), "bad")


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_such_module_xyz:Net", r"cannot import 'no_such_module_xyz' \(ModuleNotFoundError"),
        ("{mod}:Missing", r"has no 'Missing'"),
        ("{mod}:NOT_A_CLASS", r"is 3, not a torch\.nn\.Module class"),
        (
            "{mod}:NoSizes",
            r"must take \(in_feats, num_classes, \.\.\.\) first; it takes \(hidden\)",
        ),
        (":Net", r"a user model is named 'package\.module:Class'"),
    ],
)
def test_a_bad_reference_is_one_line_naming_it(
    tmp_path: Path, usermods: str, reference: str, message: str
) -> None:
    with pytest.raises(RecipeError, match=message):
        build_recipe(_raw(tmp_path, {"name": reference.format(mod=usermods)}), "bad")


def test_a_plain_module_is_full_graph_only(tmp_path: Path, usermods: str) -> None:
    raw = _raw(tmp_path, {"name": f"{usermods}:TwoLayerGCN"}, mode="minibatch", fanouts=[3, 3])
    with pytest.raises(RecipeError, match=r"is not supported by model .*full-graph only"):
        execute(build_recipe(raw, "mine"), reporter=Reporter())


def test_entry_points_register_models_and_a_broken_one_is_named(
    tmp_path: Path, usermods: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    module = importlib.import_module(usermods)

    def broken() -> Any:
        raise ImportError("needs torch_scatter")

    points = [
        SimpleNamespace(
            name="tutorial-gcn", value=f"{usermods}:TwoLayerGCN", load=lambda: module.TwoLayerGCN
        ),
        SimpleNamespace(name="fancy", value="fancy_pkg:Net", load=broken),
    ]
    monkeypatch.setattr(
        models, "entry_points", lambda group: points if group == "qtrain.models" else []
    )
    monkeypatch.setattr(models, "_BROKEN_ENTRY_POINTS", {})
    fresh = Registry("model", loader=models._load, resolve=models._resolve)
    monkeypatch.setattr(models, "MODELS", fresh)
    assert {"gcn", "tutorial-gcn"} <= set(fresh.names()) and "fancy" not in fresh.names()
    recipe = build_recipe(_raw(tmp_path, {"name": "tutorial-gcn", "hidden": 4}), "ep")
    assert recipe.model.options.hidden == 4
    with pytest.raises(
        RecipeError, match=r"model 'fancy' could not be loaded: .*needs torch_scatter"
    ):
        build_recipe(_raw(tmp_path, {"name": "fancy"}), "ep")
