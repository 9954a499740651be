"""TOML recipe -> validated, frozen dataclasses; every error names the key.

A recipe has six tables: ``[model]``, ``[dataset]``, ``[train]``, ``[quant]``
(with one sub-table per plugin), ``[distributed]`` and ``[output]``. The
model, dataset and plugin tables are checked against the options their
registry entries declare, so a typo anywhere fails before training starts.
``resolve_toml`` writes the recipe back with every default filled in: fed to
``qtrain run`` again it reproduces the run.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from qtrain.config import option, parse_section, to_table
from qtrain.errors import RecipeError, one_of

SECTIONS = ("model", "dataset", "train", "quant", "distributed", "output")


@dataclass(frozen=True)
class TrainConfig:
    """How to train: loop, optimiser, evaluation, seeds."""

    mode: Literal["full", "minibatch"] = option(
        "full", "full-graph steps, or neighbour-sampled mini-batches for large graphs"
    )
    epochs: int = option(200, "training epochs", min=1, max=1_000_000)
    lr: float = option(0.01, "Adam learning rate", min=0.0)
    weight_decay: float = option(5e-4, "Adam weight decay (L2)", min=0.0)
    seed: int = option(0, "seed for weights, dropout, sampling and stochastic rounding", min=0)
    eval_every: int = option(1, "evaluate on validation and test every N epochs", min=1)
    patience: int = option(
        0, "stop after N evaluations without a better validation metric (0 = never)", min=0
    )
    fanouts: list[int] = option(
        [10, 25], "mini-batch: neighbours sampled per layer, input layer first (-1 = all)", min=-1
    )
    batch_size: int = option(1024, "mini-batch: seed nodes per batch", min=1)
    eval_batch_size: int = option(
        4096,
        "mini-batch: nodes per batch in layer-wise evaluation (0: all nodes at once, the "
        "full-graph forward; much faster where a full-graph forward fits in memory)",
        min=0,
    )
    device: str = option("cpu", "'cpu', 'cuda', 'cuda:N' or 'auto' (CUDA when torch sees a GPU)")
    graph_kernels: Literal["auto", "qtrain", "dgl"] = option(
        "auto",
        "who runs the graph primitives: qtrain's device route on a GPU and DGL on the CPU "
        "(auto), qtrain's route everywhere (qtrain), or DGL (dgl: the CPU only with DGL's "
        "CPU build)",
    )
    threads: int = option(0, "CPU threads for torch (0 = torch's default)", min=0)
    numerics: Literal["float32", "gcint"] = option(
        "float32",
        "float32 (autograd, Adam, cross-entropy; [quant] plugins quantize inside it) or "
        "gcint: the GCN trained integer-only (GCINT: int8 forward, backward, loss and "
        "integer SGD)",
    )
    gcint_quantizer: Literal["dyq", "stq", "dyq-bounded"] = option(
        "dyq",
        "gcint: how activations go back to int8 after each product: dyq (the 7-bit window "
        "holding the most values, per tensor), stq (the fixed window at bit 7) or "
        "dyq-bounded (the lowest window that saturates at most 1 value in 8192: the "
        "largest activations keep their size; for mini-batches and many classes)",
    )
    gcint_loss: Literal["mse", "softmax"] = option(
        "mse",
        "gcint: the output error, mse (the paper's: logits minus 127 x one-hot) or softmax "
        "(cross-entropy's, with a table-lookup softmax in integers; for more than a few "
        "classes)",
    )
    gcint_lr_shift: int = option(
        4,
        "gcint: integer SGD step, W32 -= G8 * 2^shift (master weights carry 8 bits below "
        "the int8 grid; a negative shift divides, rounded to nearest: mini-batches take "
        "many small steps)",
        min=-7,
        max=16,
    )
    gcint_lr_decay: Literal["auto", "constant", "linear"] = option(
        "auto",
        "gcint: the integer SGD step over the run, constant, linear (from the full step to "
        "zero over epochs x batches: DyQ gives every gradient the same size, so only a "
        "shrinking step lets many mini-batch steps settle) or auto (linear for mini-batches, "
        "constant full-graph: what measured best on each)",
    )

    @property
    def gcint_step_decay(self) -> Literal["constant", "linear"]:
        """``gcint_lr_decay`` with ``auto`` resolved by the mode. Measured (3 seeds, 2-core
        VM, README): mini-batch synthetic-products 75.43 +- 5.44 constant, 85.48 +- 0.16
        linear; synthetic-arxiv 81.29 / 81.71; full-graph Cora 81.13 / 80.50, Citeseer
        70.53 / 69.83."""
        if self.gcint_lr_decay != "auto":
            return self.gcint_lr_decay
        return "linear" if self.mode == "minibatch" else "constant"

    def validate(self) -> None:
        cores = os.cpu_count() or 1
        if self.threads > cores:
            raise ValueError(
                f"threads = {self.threads} is more than the {cores} CPU cores of this machine; "
                f"use 0 (torch's default) to {cores}"
            )
        indexed = self.device.startswith("cuda:") and self.device[5:].isdigit()
        if self.device not in ("cpu", "cuda", "auto") and not indexed:
            raise ValueError(
                f"device = {self.device!r} is not allowed; use 'cpu', 'cuda', 'cuda:N' or 'auto'"
            )
        if any(f == 0 for f in self.fanouts):
            raise ValueError("fanouts must be positive or -1 (all neighbours), not 0")
        if not self.fanouts:
            raise ValueError("fanouts must list one entry per GNN layer")


@dataclass(frozen=True)
class DistributedConfig:
    """Multi-worker full-graph training on torch.distributed (adaqp-mlsys23)."""

    world_size: int = option(
        1, "workers; > 1 starts them on this machine (or run the recipe under torchrun)", min=1
    )
    backend: Literal["gloo", "nccl"] = option(
        "gloo", "torch.distributed backend: gloo (CPU workers) or nccl (one GPU per worker)"
    )
    partition: Literal["metis", "random"] = option("metis", "how the graph is split across workers")
    message_bits: Literal[32, 8, 4, 2, "adaptive"] = option(
        32, 'bits per value of the halo messages: 32 (unquantized), 8, 4, 2 or "adaptive"'
    )
    lambda_: float = option(
        0.5,
        "adaptive: weight of the variance objective against time (eq. 12)",
        min=0.0,
        max=1.0,
        key="lambda",
    )
    reassign_period: int = option(100, "adaptive: epochs between bit-width assignments", min=1)
    group_size: int = option(100, "adaptive: messages that share one bit width", min=1)
    overlap: bool = option(
        False, "compute the central nodes while the marginal nodes' messages are in flight"
    )
    timeout_s: float = option(
        60.0, "seconds a worker waits for its peers before the run fails", min=1.0
    )

    def validate(self) -> None:
        if self.backend == "nccl" and self.world_size > 1:
            import torch

            if not torch.cuda.is_available():
                raise ValueError("backend = 'nccl' needs CUDA devices; use 'gloo' on CPUs")


@dataclass(frozen=True)
class OutputConfig:
    """Where a run's files go."""

    dir: str = option("runs", "parent folder of the run directories")
    name: str = option("", "run name prefix (default: the recipe file's name)")
    checkpoint: bool = option(True, "save the best-on-validation model")
    checkpoint_every: int = option(
        10,
        "epochs between writes of the best model so far (0: only when the run ends)",
        min=0,
        max=1_000_000,
    )

    def validate(self) -> None:
        # the run directory is <dir>/<name>-<time>: a name must not lead out of dir
        name = self.name
        if "/" in name or "\\" in name or name in (".", "..") or name.startswith("."):
            raise ValueError(
                f"name = {name!r} must be a plain name (no '/', '\\', no leading '.'): the run "
                "directory is made inside output.dir"
            )
        if any(ord(c) < 32 or ord(c) == 127 for c in name) or len(name) > 100:
            raise ValueError(
                f"name = {name!r} must be at most 100 printable characters (no control characters)"
            )


@dataclass(frozen=True)
class ModelSection:
    """``[model]``: a registered model name and that model's options."""

    name: str
    options: Any


@dataclass(frozen=True)
class DatasetSection:
    """``[dataset]``: a registered dataset name and that dataset's options."""

    name: str
    options: Any


@dataclass(frozen=True)
class QuantSection:
    """``[quant]``: the plugins to activate, in order, and each one's config."""

    plugins: tuple[str, ...] = ()
    configs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Recipe:
    """A whole validated recipe; ``name`` names its run directories."""

    name: str
    model: ModelSection
    dataset: DatasetSection
    train: TrainConfig
    quant: QuantSection
    distributed: DistributedConfig
    output: OutputConfig


def _table(raw: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise RecipeError(f"[{key}] must be a table, got {type(value).__name__}")
    return value


def _named(raw: Mapping[str, Any], key: str, registry: Any) -> tuple[str, Any]:
    table = _table(raw, key)
    if "name" not in table:
        raise RecipeError(f"missing key {key}.name; registered: {one_of(registry.names())}")
    name = table["name"]
    if not isinstance(name, str):
        raise RecipeError(f"{key}.name must be a string; registered: {one_of(registry.names())}")
    entry = registry.get(name)
    return name, entry.parse(table, key)


def parse_quant(table: Mapping[str, Any]) -> QuantSection:
    """A ``[quant]`` table (its plugins and their sub-tables), validated."""
    from qtrain.plugin import PLUGINS

    plugins = table.get("plugin", [])
    if isinstance(plugins, str):
        plugins = [plugins] if plugins else []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise RecipeError(
            f"quant.plugin must be a name or a list of names; registered: {one_of(PLUGINS.names())}"
        )
    if len(set(plugins)) != len(plugins):
        raise RecipeError(f"quant.plugin lists a plugin twice: {plugins}")
    configs: dict[str, Any] = {}
    for name in plugins:
        PLUGINS.get(name)  # unknown names fail here, listing the registered ones
    for name in plugins:
        for later in PLUGINS.get(name).factory.listed_before:
            if later in plugins and plugins.index(later) < plugins.index(name):
                fixed = [p for p in plugins if p != name]
                fixed.insert(fixed.index(later), name)
                raise RecipeError(
                    f"quant.plugin lists {later!r} before {name!r}; {name} must come first "
                    f"(a later plugin wraps the earlier ones' primitives): {plugins} -> {fixed}"
                )
    for key, value in table.items():
        if key == "plugin":
            continue
        if not isinstance(value, dict):
            raise RecipeError(
                f"unknown key quant.{key}; [quant] takes 'plugin' and one sub-table per plugin "
                f"({one_of(PLUGINS.names())})"
            )
        if key not in PLUGINS:
            raise RecipeError(
                f"unknown plugin table [quant.{key}]; registered: {one_of(PLUGINS.names())}"
            )
    for name in plugins:
        configs[name] = PLUGINS.get(name).parse(
            _table(table, name) if name in table else {}, f"quant.{name}"
        )
    for name in sorted(set(table) - set(plugins) - {"plugin"}):
        options = _table(table, name)
        PLUGINS.get(name).parse(options, f"quant.{name}")  # a typo is named first
        if options:  # dropping them would train without what the user asked for
            raise RecipeError(
                f"quant.{name} sets {', '.join(sorted(options))}, but {name} is not enabled "
                f"(quant.plugin = {list(plugins)}); add {name!r} to quant.plugin or remove "
                f"the [quant.{name}] options"
            )
    return QuantSection(tuple(plugins), configs)


def build_recipe(raw: Mapping[str, Any], name: str) -> Recipe:
    """Validate a recipe given as nested dicts (a parsed TOML document)."""
    from qtrain.data import DATASETS
    from qtrain.models import MODELS

    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise RecipeError(f"unknown section [{unknown[0]}]; sections: {', '.join(SECTIONS)}")
    model_name, model_opts = _named(raw, "model", MODELS)
    dataset_name, dataset_opts = _named(raw, "dataset", DATASETS)
    output = parse_section(OutputConfig, _table(raw, "output"), "output")
    output = replace(output, name=output.name or name)  # resolved once, so it round-trips
    train = parse_section(TrainConfig, _table(raw, "train"), "train")
    quant = parse_quant(_table(raw, "quant"))
    distributed = parse_section(DistributedConfig, _table(raw, "distributed"), "distributed")
    check_numerics(train, model_name, quant, distributed)
    return Recipe(
        name=output.name,
        model=ModelSection(model_name, model_opts),
        dataset=DatasetSection(dataset_name, dataset_opts),
        train=train,
        quant=quant,
        distributed=distributed,
        output=output,
    )


def check_numerics(
    train: TrainConfig, model: str, quant: QuantSection, distributed: DistributedConfig
) -> None:
    """``train.numerics = "gcint"`` trains the built-in GCN in one process with its own
    integer loop: no other model, no plugin beside it, no workers."""
    if train.numerics != "gcint":
        return
    if model != "gcn":
        raise RecipeError(
            f"train.numerics = 'gcint' trains model 'gcn' only (GCINT's integer GCN), not "
            f"{model!r}; set model.name = 'gcn' or train.numerics = 'float32'"
        )
    if quant.plugins:
        raise RecipeError(
            f"train.numerics = 'gcint' replaces the float training that plugins quantize; "
            f"remove quant.plugin = {list(quant.plugins)} or set train.numerics = 'float32'"
        )
    if distributed.world_size > 1:
        raise RecipeError(
            "train.numerics = 'gcint' trains in one process; set distributed.world_size = 1"
        )


# A recipe is a short TOML file; reading stops past this, so a device (/dev/zero) or an
# endless pipe given as a recipe is refused instead of filling memory.
MAX_RECIPE_BYTES = 1 << 20


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file, turning I/O and syntax errors into one-line RecipeErrors."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_RECIPE_BYTES + 1)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise RecipeError(f"recipe {path} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"recipe {path} cannot be read: {exc}") from None
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeError(
            f"recipe {path} is larger than {MAX_RECIPE_BYTES // 2**20} MiB; a recipe is a short "
            "TOML file"
        )
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"recipe {path} is not valid TOML: {exc}") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """``train.epochs=5`` -> (["train", "epochs"], 5); bare words become strings."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise RecipeError(f"--set {text!r} must look like SECTION.KEY=VALUE, e.g. train.epochs=5")
    path = key.split(".")
    if path[0] not in SECTIONS or len(path) < 2 or not all(path):
        raise RecipeError(
            f"--set {key}: the key must start with one of {', '.join(SECTIONS)} and name a key"
        )
    value = value.strip()
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        if not value or any(c in value for c in "[]{}\"'"):
            raise RecipeError(f"--set {key}={value}: not a valid TOML value") from None
        parsed = value  # a bare word: model.name=gat
    return path, parsed


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``raw`` with each ``KEY=VALUE`` override set (types checked later)."""
    out = copy.deepcopy(dict(raw))
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecipeError(f"--set {'.'.join(path)}: {part} is not a table")
            node = child
        node[path[-1]] = value
    return out


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read, override and validate a recipe file."""
    path = Path(path)
    raw = apply_overrides(read_toml(path), overrides)
    return build_recipe(raw, name=path.stem)


def recipe_tables(recipe: Recipe) -> dict[str, Any]:
    """The recipe as nested dicts with every default filled in."""
    quant: dict[str, Any] = {"plugin": list(recipe.quant.plugins)}
    for name in recipe.quant.plugins:
        quant[name] = to_table(recipe.quant.configs[name])
    return {
        "model": {"name": recipe.model.name, **to_table(recipe.model.options)},
        "dataset": {"name": recipe.dataset.name, **to_table(recipe.dataset.options)},
        "train": to_table(recipe.train),
        "quant": quant,
        "distributed": to_table(recipe.distributed),
        "output": to_table(recipe.output),
    }


def _plain(value: Any) -> Any:
    """Tuples as lists, nested: what a TOML writer takes."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def dumps_toml(tables: Mapping[str, Any], header: str = "") -> str:
    """Nested dicts (tables of scalars, lists and sub-tables) as TOML, written by tomli-w
    (which escapes every control character, so any string reads back as it was)."""
    import tomli_w

    comments = "".join(f"# {line}\n" for line in header.splitlines())
    return comments + ("\n" if comments else "") + tomli_w.dumps(_plain(tables))


def resolve_toml(recipe: Recipe, header: str = "") -> str:
    """The resolved recipe as TOML text, reproducing the run when fed back."""
    return dumps_toml(recipe_tables(recipe), header)
