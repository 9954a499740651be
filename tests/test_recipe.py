"""Recipe validation: every wrong key, type or value is named with what is allowed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from qtrain.config import describe, option, parse_section, to_table
from qtrain.errors import RecipeError
from qtrain.recipe import (
    SECTIONS,
    apply_overrides,
    build_recipe,
    dumps_toml,
    load_recipe,
    parse_override,
    read_toml,
    resolve_toml,
)

MINIMAL = {"model": {"name": "gcn"}, "dataset": {"name": "synthetic-small"}}


@dataclass(frozen=True)
class _Example:
    count: int = option(3, "a count", min=1, max=10)
    ratio: float = option(0.5, "a ratio", min=0.0)
    flag: bool = option(False, "a flag")
    mode: Literal["a", "b"] = option("a", "a mode")
    bits: int | Literal["auto"] = option(8, "bits or auto", min=2, max=8)
    sizes: list[int] = option([1, 2], "sizes")


def test_parse_section_defaults_and_types() -> None:
    ex = parse_section(_Example, {"ratio": 1, "bits": "auto", "sizes": [3]}, "x")
    assert ex == _Example(count=3, ratio=1.0, flag=False, mode="a", bits="auto", sizes=[3])
    assert isinstance(ex.ratio, float)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"count": "3"}, r"x\.count = '3' must be an integer"),
        ({"count": True}, r"x\.count = true must be an integer"),
        ({"count": 0}, r"x\.count = 0 is too small; allowed: 1 to 10"),
        ({"count": 11}, r"x\.count = 11 is too large; allowed: 1 to 10"),
        ({"flag": 1}, r"x\.flag = 1 must be true or false"),
        ({"mode": "c"}, r"x\.mode = 'c' is not allowed; use one of 'a', 'b'"),
        ({"bits": 9}, r"x\.bits = 9 is too large; allowed: 2 to 8"),
        ({"bits": "fast"}, r"x\.bits = 'fast' is not allowed; expected int \| 'auto'"),
        ({"sizes": [1, "2"]}, r"x\.sizes\[1\] = '2' must be an integer"),
        ({"sizes": 3}, r"x\.sizes = 3 must be a list of int"),
        (
            {"colour": 1},
            r"unknown key x\.colour; allowed keys: bits, count, flag, mode, ratio, sizes",
        ),
    ],
)
def test_parse_section_errors_name_the_key(table: dict, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        parse_section(_Example, table, "x")


@dataclass(frozen=True)
class _Aliased:
    lambda_: float = option(0.5, "a keyword-named option", key="lambda", min=0.0)


def test_key_alias_for_python_keywords() -> None:
    parsed = parse_section(_Aliased, {"lambda": 2}, "m")
    assert parsed.lambda_ == 2.0
    assert to_table(parsed) == {"lambda": 2.0}
    assert [o.name for o in describe(_Aliased)] == ["lambda"]
    with pytest.raises(RecipeError, match=r"unknown key m\.lambda_; allowed keys: lambda"):
        parse_section(_Aliased, {"lambda_": 1}, "m")
    with pytest.raises(RecipeError, match=r"m\.lambda = -1.0 is too small"):
        parse_section(_Aliased, {"lambda": -1}, "m")


def test_describe_lists_options() -> None:
    names = {o.name: o for o in describe(_Example)}
    assert names["bits"].type == "int | 'auto'"
    assert names["sizes"].default == [1, 2]
    assert names["count"].help == "a count"


def test_minimal_recipe_fills_defaults() -> None:
    recipe = build_recipe(MINIMAL, "minimal")
    assert recipe.name == "minimal"
    assert recipe.model.name == "gcn"
    assert recipe.train.mode == "full"
    assert recipe.quant.plugins == ()
    assert recipe.distributed.world_size == 1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"dataset": {"name": "cora"}}, r"missing key model\.name; registered: .*'gcn'"),
        (
            {**MINIMAL, "model": {"name": "resnet"}},
            r"unknown model 'resnet'; registered: .*'gat'.*'gcn'",
        ),
        (
            {**MINIMAL, "dataset": {"name": "imagenet"}},
            r"unknown dataset 'imagenet'; registered: .*'cora'",
        ),
        (
            {**MINIMAL, "model": {"name": "gcn", "hiden": 3}},
            r"unknown key model\.hiden; allowed keys: .*hidden",
        ),
        ({**MINIMAL, "train": {"epochs": "ten"}}, r"train\.epochs = 'ten' must be an integer"),
        (
            {**MINIMAL, "train": {"mode": "stream"}},
            r"train\.mode = 'stream' is not allowed; use one of 'full', 'minibatch'",
        ),
        ({**MINIMAL, "train": {"device": "tpu"}}, r"train: device = 'tpu' is not allowed"),
        ({**MINIMAL, "train": {"fanouts": [5, 0]}}, r"fanouts must be positive or -1"),
        (
            {**MINIMAL, "train": {"eval_batch_size": -1}},
            r"train\.eval_batch_size = -1 is too small; allowed: >= 0",
        ),
        ({**MINIMAL, "quant": {"plugin": "nope"}}, r"unknown plugin 'nope'; registered: .*'trace'"),
        ({**MINIMAL, "quant": {"plugin": ["trace", "trace"]}}, r"lists a plugin twice"),
        ({**MINIMAL, "quant": {"plugin": 3}}, r"quant\.plugin must be a name or a list of names"),
        ({**MINIMAL, "quant": {"bits": 4}}, r"unknown key quant\.bits; \[quant\] takes 'plugin'"),
        ({**MINIMAL, "quant": {"nope": {"x": 1}}}, r"unknown plugin table \[quant\.nope\]"),
        (
            {**MINIMAL, "quant": {"plugin": "trace", "trace": {"log": "yes"}}},
            r"quant\.trace\.log = 'yes' must be true or false",
        ),
        (
            {**MINIMAL, "distributed": {"message_bits": 3}},
            r"distributed\.message_bits = 3 is not allowed; use one of 32, 8, 4, 2, 'adaptive'",
        ),
        (
            {**MINIMAL, "distributed": {"lambda": 1.5}},
            r"distributed\.lambda = 1\.5 is too large; allowed: 0\.0 to 1\.0",
        ),
        (
            {**MINIMAL, "distributed": {"backend": "mpi"}},
            r"distributed\.backend = 'mpi' is not allowed; use one of 'gloo', 'nccl'",
        ),
        (
            {**MINIMAL, "training": {}},
            r"unknown section \[training\]; sections: " + ", ".join(SECTIONS),
        ),
        ({**MINIMAL, "train": 3}, r"\[train\] must be a table"),
        ({**MINIMAL, "train": {"lr": float("nan")}}, r"train\.lr = nan must be a finite number"),
        ({**MINIMAL, "train": {"lr": float("inf")}}, r"train\.lr = inf must be a finite number"),
        (
            {**MINIMAL, "distributed": {"timeout_s": float("inf")}},
            r"distributed\.timeout_s = inf must be a finite number",
        ),
        (
            {**MINIMAL, "model": {"name": "gcn", "dropout": float("nan")}},
            r"model\.dropout = nan must be a finite number",
        ),
        ({**MINIMAL, "train": {"epochs": 10**23}}, r"train\.epochs = 1\d+ is too large"),
        (
            {**MINIMAL, "train": {"threads": 100_000}},
            r"threads = 100000 is more than the \d+ CPU cores",
        ),
        ({**MINIMAL, "train": {"device": "cuda:abc"}}, r"device = 'cuda:abc' is not allowed"),
        ({**MINIMAL, "output": {"name": "../x"}}, r"output: name = '\.\./x' must be a plain name"),
        (
            {**MINIMAL, "output": {"name": "/etc/x"}},
            r"output: name = '/etc/x' must be a plain name",
        ),
        ({**MINIMAL, "output": {"name": "a\x01b"}}, r"no control characters"),
        (
            {**MINIMAL, "quant": {"exact": {"bitz": 99}}},
            r"unknown key quant\.exact\.bitz; allowed keys: .*bits",
        ),
        (
            {**MINIMAL, "quant": {"plugin": [], "tango": {"bits": 99}}},
            r"quant\.tango\.bits = 99 is too large",
        ),
        (  # valid options of a plugin left out would be dropped: the run would be FP32
            {
                **MINIMAL,
                "quant": {"plugin": ["exact"], "tango": {"bits": 4, "rounding": "nearest"}},
            },
            r"^quant\.tango sets bits, rounding, but tango is not enabled \(quant\.plugin = "
            r"\['exact'\]\); add 'tango' to quant\.plugin or remove the \[quant\.tango\] options$",
        ),
    ],
)
def test_recipe_errors_name_the_key_and_what_is_allowed(raw: dict, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        build_recipe(raw, "bad")


def test_an_empty_table_of_a_plugin_left_out_is_no_option() -> None:
    recipe = build_recipe({**MINIMAL, "quant": {"plugin": [], "tango": {}}}, "ok")
    assert recipe.quant.plugins == ()


def test_overrides_parse_types() -> None:
    assert parse_override("train.epochs=5") == (["train", "epochs"], 5)
    assert parse_override("train.lr=1e-3") == (["train", "lr"], 0.001)
    assert parse_override("model.name=gat") == (["model", "name"], "gat")
    assert parse_override("train.fanouts=[5, 10]") == (["train", "fanouts"], [5, 10])
    assert parse_override('quant.plugin=["trace"]') == (["quant", "plugin"], ["trace"])
    assert parse_override("output.checkpoint=false") == (["output", "checkpoint"], False)
    assert parse_override("quant.trace.log=true") == (["quant", "trace", "log"], True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("epochs", r"must look like SECTION\.KEY=VALUE"),
        ("=5", r"must look like SECTION\.KEY=VALUE"),
        ("epochs=5", r"must start with one of model, dataset"),
        ("train.=5", r"must start with one of"),
        ("train.fanouts=[5,", r"not a valid TOML value"),
    ],
)
def test_bad_overrides(text: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        parse_override(text)


def test_override_is_type_checked_by_validation() -> None:
    raw = apply_overrides(MINIMAL, ["train.epochs=five"])
    with pytest.raises(RecipeError, match=r"train\.epochs = 'five' must be an integer"):
        build_recipe(raw, "x")
    raw = apply_overrides(MINIMAL, ["train.epochs=7", "quant.plugin=trace"])
    recipe = build_recipe(raw, "x")
    assert recipe.train.epochs == 7 and recipe.quant.plugins == ("trace",)
    with pytest.raises(RecipeError, match=r"--set model\.name\.x: name is not a table"):
        apply_overrides(MINIMAL, ["model.name.x=1"])


def test_resolved_recipe_round_trips(tmp_path: Path) -> None:
    raw = apply_overrides(
        MINIMAL, ['quant.plugin=["trace"]', "train.fanouts=[3, 4]", 'output.dir="out dir"']
    )
    recipe = build_recipe(raw, "round")
    text = resolve_toml(recipe, header="resolved by a test\nsecond line")
    path = tmp_path / "resolved.toml"
    path.write_text(text)
    again = load_recipe(path)
    assert again == recipe
    assert resolve_toml(again, header="resolved by a test\nsecond line") == text
    assert text.startswith("# resolved by a test\n# second line\n")
    assert "[quant.trace]" in text


def test_dumps_toml_escapes_and_reads_back(tmp_path: Path) -> None:
    tables = {"output": {"name": 'a "quoted"\\path\n', "x": 1.5, "y": [1, 2], "z": True}}
    path = tmp_path / "t.toml"
    path.write_text(dumps_toml(tables))
    assert read_toml(path) == tables


def test_read_toml_errors(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"recipe .*missing\.toml not found"):
        read_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nname = 1\n")
    with pytest.raises(RecipeError, match=r"recipe .*bad\.toml is not valid TOML"):
        read_toml(bad)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(RecipeError, match=r"cannot be read"):
        read_toml(binary)


def test_examples_and_default_recipe_validate() -> None:
    root = Path(__file__).resolve().parents[1]
    recipes = [root / "qtrain.toml", *sorted((root / "examples").glob("*.toml"))]
    assert len(recipes) >= 10
    for path in recipes:
        load_recipe(path)
