"""qtrain's built-in GCN, GAT and GraphSAGE trained end to end on a GPU, beside PyG.

What a user gets: the built-in models (unmodified ``dgl.nn`` GraphConv,
GATConv, SAGEConv) trained full-graph by qtrain's runner
(``qtrain.runner.execute``) through the device route (``train.graph_kernels =
"qtrain"``: with DGL's CPU-only build, qtrain runs DGL's graph primitives on
the GPU itself), on synthetic graphs whose labels carry signal, so that
accuracy shows the models learn. Per model, on one graph, features, labels and
splits, in one process, one row each:

* ``qtrain FP32 (route)``: the baseline of every ratio in the group;
* ``qtrain bf16 autocast (route)``: the run inside
  ``torch.autocast(device_type, dtype=torch.bfloat16)``. The route's SpMM
  multiplies half-precision operands in float32 and casts the result back,
  because cuSPARSE has no mixed float32 x bfloat16 product, so the
  aggregations do not get faster, only the dense products;
* ``qtrain tango 8-bit``, ``qtrain exact INT2``, ``qtrain tango 8-bit + exact
  INT2``: the plugins with their default configs, on the route;
* ``qtrain tango 8-bit nearest``: tango with round-to-nearest instead of its default
  stochastic rounding, which on the CPU converged like FP32 where stochastic rounding
  lagged (synthetic-products at 100,000 nodes; README, "GPUs with today's torch");
* ``PyG <Conv> FP32`` and ``PyG <Conv> bf16 autocast``: PyTorch Geometric's
  GCNConv / GATConv / SAGEConv (``edge_index`` form, the library's default)
  with the same layers, widths, heads, dropout, optimizer and epochs, in a
  loop that times what qtrain's trainer times. PyG is imported lazily: where it
  is not installed each of its rows says so.

Each row: the median epoch (forward, loss, backward, Adam step; evaluation
excluded) over the epochs after the warm-up ones, with min, max, the quartiles
and the interquartile range (``iqr_ms``; PyG's epochs are timed one call each by
``torch.utils.benchmark.Timer``, ``bench/_timing.py``); the peak GPU memory the
row allocated (``torch.cuda.reset_peak_memory_stats`` before each row,
``max_memory_allocated`` after it, less what
was allocated before it: features, graph structure, model, optimizer and
activations); test accuracy at the best validation epoch; ratios (baseline /
row: > 1 is faster or smaller) against qtrain FP32 and PyG FP32 of the same
group. A row that runs out of GPU memory says ``out of memory`` and the run
goes on. Every qtrain FP32 row must reach a test accuracy well above chance
(at least ``max(2 / classes, 1 / classes + 0.1)``); otherwise the run fails
(``E2EFailure``, which carries the rows), after measuring every row.

Sizes: ``arxiv`` (synthetic-arxiv: 169,343 nodes, 2.3 M edges; ``run(quick=True)``),
``products`` (synthetic-products: 2.4 M nodes, 124 M edges; ``run(quick=False)``
does arxiv then products) and ``tiny`` (synthetic-small with 300 nodes, for the
CPU: what CI runs, ``tests/test_gpu_e2e.py``). The dataset of a size is loaded
once and handed to every run (registered in qtrain's dataset registry as
``<preset>@e2e``).

    python bench/gpu_e2e.py                                  # cuda, arxiv
    python bench/gpu_e2e.py --size arxiv --size products --json e2e.json
    python bench/gpu_e2e.py --device cpu --size tiny         # the route on the CPU (CI)

Imported by ``bench/gpu.py``; ``run(quick)`` returns rows in that script's format.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401  (qtrain from this checkout)
import torch
from _timing import once

from qtrain._malloc import set_up_allocator

MODELS = ("gcn", "gat", "sage")
MODEL_NAMES = {"gcn": "GCN", "gat": "GAT", "sage": "GraphSAGE"}
PYG_CONVS = {"gcn": "GCNConv", "gat": "GATConv", "sage": "SAGEConv"}
FP32 = "qtrain FP32 (route)"
BF16_NOTE = (
    "bf16 autocast: dense products in bf16; the route's SpMM multiplies bf16 operands in "
    "float32 and casts back (cuSPARSE has no mixed fp32 x bf16 product)"
)
# (row name, [quant] table, autocast to bf16)
QTRAIN_VARIANTS: tuple[tuple[str, dict[str, Any], bool], ...] = (
    (FP32, {}, False),
    ("qtrain bf16 autocast (route)", {}, True),
    ("qtrain tango 8-bit (route)", {"plugin": ["tango"], "tango": {"bits": 8}}, False),
    (
        "qtrain tango 8-bit nearest (route)",
        {"plugin": ["tango"], "tango": {"bits": 8, "rounding": "nearest"}},
        False,
    ),
    ("qtrain exact INT2 (route)", {"plugin": ["exact"], "exact": {"bits": 2}}, False),
    (
        "qtrain tango 8-bit + exact INT2 (route)",
        {"plugin": ["tango", "exact"], "tango": {"bits": 8}, "exact": {"bits": 2}},
        False,
    ),
)
# --variants: short names of the rows (FP32 always runs: every ratio and the accuracy bar
# are against it); a lent GPU's ten-minute call fits a few rows at products scale
VARIANT_KEYS = {
    "bf16": QTRAIN_VARIANTS[1][0],
    "tango": QTRAIN_VARIANTS[2][0],
    "tango-nearest": QTRAIN_VARIANTS[3][0],
    "exact": QTRAIN_VARIANTS[4][0],
    "tango+exact": QTRAIN_VARIANTS[5][0],
}
PYG_KEY = "pyg"


@dataclass(frozen=True)
class Size:
    """One graph and how long each row trains on it."""

    preset: str
    options: dict[str, Any]
    epochs: int  # training epochs per row (enough for accuracy to show learning)
    warmup: int  # the first epochs, not timed (CSR views built, kernels loaded)
    eval_every: int
    models: dict[str, dict[str, Any]]  # [model] tables
    lr: dict[str, float] = field(default_factory=lambda: {"gcn": 0.01, "gat": 0.005, "sage": 0.01})
    threads: int = 0  # CPU threads for torch (0: its default)


# the example recipes' models (examples/arxiv-*.toml), but GraphSAGE with the mean
# aggregator that PyG's SAGEConv has too, and 2 layers: 3 mean layers with DGL's SAGEConv
# initialisation start with logits of std 2.7 (PyG's: 0.16) and, at lr 0.01, stayed at
# chance for 50 epochs on synthetic-arxiv (2 layers: 56% test accuracy after 12)
_LARGE_MODELS: dict[str, dict[str, Any]] = {
    "gcn": {"name": "gcn", "hidden": 256, "layers": 3, "dropout": 0.5},
    "gat": {
        "name": "gat",
        "hidden": 64,
        "heads": 4,
        "out_heads": 1,
        "layers": 3,
        "dropout": 0.5,
        "attn_dropout": 0.1,
    },
    "sage": {"name": "sage", "hidden": 256, "layers": 2, "dropout": 0.5, "aggregator": "mean"},
}

SIZES: dict[str, Size] = {
    "tiny": Size(
        "synthetic-small",
        {"nodes": 300},
        epochs=30,
        warmup=3,
        eval_every=5,
        models={
            "gcn": {"name": "gcn", "hidden": 16, "layers": 2, "dropout": 0.5},
            "gat": {
                "name": "gat",
                "hidden": 8,
                "heads": 2,
                "out_heads": 1,
                "layers": 2,
                "dropout": 0.5,
                "attn_dropout": 0.1,
            },
            "sage": {
                "name": "sage",
                "hidden": 32,  # 16 units: 0.49 test accuracy at seed 0 (0.73 at seeds 1, 2)
                "layers": 2,
                "dropout": 0.5,
                "aggregator": "mean",
            },
        },
        lr={"gcn": 0.02, "gat": 0.02, "sage": 0.02},
        threads=1,  # 300 nodes: more threads only wait on each other (or on other jobs)
    ),
    "arxiv": Size("synthetic-arxiv", {}, epochs=50, warmup=5, eval_every=10, models=_LARGE_MODELS),
    # on the CPU (DGL's kernels, hidden 64) GCN reached 24% test accuracy after 10 epochs and
    # 2-layer mean GraphSAGE 11% after 15 (chance 2.1%)
    "products": Size(
        "synthetic-products", {}, epochs=24, warmup=3, eval_every=8, models=_LARGE_MODELS
    ),
}


class E2EFailure(RuntimeError):
    """A qtrain FP32 row did not train to a test accuracy well above chance (or did not
    run); ``rows`` holds every row measured."""

    def __init__(self, message: str, rows: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.rows = rows


def accuracy_bar(classes: int) -> float:
    """What a qtrain FP32 row's test accuracy must reach: well above chance (1 / classes)."""
    return max(2.0 / classes, 1.0 / classes + 0.1)


# ----------------------------------------------------------------- measuring a row


def _is_oom(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(exc, oom) or "out of memory" in str(exc).lower()


def _spread(times_s: list[float]) -> dict[str, Any]:
    """Median, its interquartile range (q3 - q1), min, max and quartiles in milliseconds of
    the timed epochs."""
    ms = [1000.0 * t for t in times_s]
    if not ms:
        return dict.fromkeys(("ms", "iqr_ms", "ms_min", "ms_max", "ms_q1", "ms_q3"))
    q1, _, q3 = statistics.quantiles(ms, n=4) if len(ms) > 1 else (ms[0], ms[0], ms[0])
    return {
        "ms": statistics.median(ms),
        "iqr_ms": q3 - q1,
        "ms_min": min(ms),
        "ms_max": max(ms),
        "ms_q1": q1,
        "ms_q3": q3,
    }


@contextlib.contextmanager
def _memory(device: torch.device, out: dict[str, Any]) -> Iterator[None]:
    """Peak device memory the block allocated beyond what was allocated before it."""
    from qtrain.ops.graph import CSR_CACHE

    # earlier rows' device copies of the graph's CSR views must neither count in this row's
    # memory nor crowd it out (the cache keeps the last few graphs' views)
    CSR_CACHE.clear()
    gc.collect()
    if device.type != "cuda":
        yield
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        yield
    finally:
        torch.cuda.synchronize(device)
        out["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device) - before)
        out["peak_memory_source"] = (
            "torch.cuda.max_memory_allocated over the row, less what was allocated before it"
        )
        out["memory_before_bytes"] = int(before)
        CSR_CACHE.clear()
        gc.collect()
        torch.cuda.empty_cache()


def _epoch_times() -> Any:
    """A qtrain reporter that keeps each epoch's training time (``epoch_time_s``)."""
    from qtrain.train.progress import Reporter

    class EpochTimes(Reporter):
        def __init__(self) -> None:
            self.times: list[float] = []

        def epoch(self, record: dict[str, Any]) -> None:
            self.times.append(float(record["epoch_time_s"]))

    return EpochTimes()


_LOADED: dict[str, Any] = {}


def _in_memory(size: Size) -> tuple[str, Any]:
    """The size's dataset, loaded once, under a registry name every row's recipe can use."""
    from qtrain.data import load_dataset
    from qtrain.data.registry import DATASETS

    name = f"{size.preset}@e2e"
    _LOADED[name] = load_dataset(size.preset, dict(size.options))
    if name not in DATASETS:
        entry = DATASETS.get(size.preset)

        def load(_options: Any, _name: str = name) -> Any:
            return _LOADED[_name]

        DATASETS.add(
            name,
            load,
            options=entry.options,
            summary=f"{size.preset}, loaded once by bench/gpu_e2e.py",
            defaults=entry.defaults,
        )
    return name, _LOADED[name]


def _qtrain_row(
    size: Size,
    model: str,
    dataset_name: str,
    quant: dict[str, Any],
    bf16: bool,
    device: torch.device,
    out_dir: str,
) -> dict[str, Any]:
    from qtrain.recipe import build_recipe
    from qtrain.runner import execute

    raw = {
        "model": size.models[model],
        "dataset": {"name": dataset_name, **size.options},
        "train": {
            "mode": "full",
            "epochs": size.epochs,
            "lr": size.lr[model],
            "weight_decay": 0.0,
            "seed": 0,
            "eval_every": size.eval_every,
            "device": str(device),
            "graph_kernels": "qtrain",
            "threads": size.threads,
        },
        "quant": quant,
        "output": {"dir": out_dir, "checkpoint": False},
    }
    recipe = build_recipe(raw, f"e2e-{model}")
    epochs = _epoch_times()
    row: dict[str, Any] = {}
    with _memory(device, row):
        # one autocast region around the whole run (what a user wrapping `qtrain run`'s
        # Python entry point would write), without autocast's weight cache: that cache
        # keeps the first bf16 copy of each weight until the region ends, so every later
        # step would run the initial weights (seen: no learning at all)
        autocast = (
            torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
            if bf16
            else contextlib.nullcontext()
        )
        with autocast:
            summary = execute(recipe, reporter=epochs)
    if device.type != "cuda":
        row["peak_memory_bytes"] = summary.get("peak_memory_bytes")
        row["peak_memory_source"] = f"qtrain summary: {summary.get('peak_memory_source')}"
    row.update(_spread(epochs.times[size.warmup :]))
    row.update(
        status="ok" if summary.get("status") == "completed" else str(summary.get("status")),
        test_acc=summary.get("test_acc"),
        val_acc=summary.get("val_acc"),
        best_epoch=summary.get("best_epoch"),
        epochs=summary.get("epochs"),
        timed_epochs=max(0, len(epochs.times) - size.warmup),
        graph_kernels=summary.get("graph_kernels"),
        kernels=summary.get("kernels"),
        kernel_fallbacks=summary.get("kernel_fallbacks"),
        plugins=summary.get("plugins"),
        step_peak_memory_bytes=summary.get("peak_memory_bytes"),
        num_edges_trained=summary.get("num_edges"),
    )
    return row


# ----------------------------------------------------------------- PyG


def _pyg_model(model: str, in_feats: int, classes: int, cfg: dict[str, Any]) -> torch.nn.Module:
    """PyG's convolutions in the layout of qtrain's built-in model of the same name."""
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv, GCNConv, SAGEConv

    layers = cfg["layers"]

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = torch.nn.ModuleList()
            if model == "gat":
                width = in_feats
                for i in range(layers):
                    last = i == layers - 1
                    out, heads = (
                        (classes, cfg["out_heads"]) if last else (cfg["hidden"], cfg["heads"])
                    )
                    # concat hidden heads, average the output heads (qtrain's GAT: mean(1))
                    self.convs.append(
                        GATConv(width, out, heads, concat=not last, dropout=cfg["attn_dropout"])
                    )
                    width = out * heads
            else:
                dims = [in_feats] + [cfg["hidden"]] * (layers - 1) + [classes]
                for i in range(layers):
                    conv = (
                        GCNConv(dims[i], dims[i + 1])  # self-loops, symmetric norm: norm="both"
                        if model == "gcn"
                        else SAGEConv(dims[i], dims[i + 1], aggr="mean")
                    )
                    self.convs.append(conv)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            for i, conv in enumerate(self.convs):
                last = i == len(self.convs) - 1
                if model == "gat":
                    x = F.dropout(x, cfg["dropout"], self.training)  # GATConv's feat_drop
                    x = conv(x, edge_index)
                    x = x if last else F.elu(x)
                else:
                    if i > 0:
                        x = F.dropout(x, cfg["dropout"], self.training)
                    x = conv(x, edge_index)
                    x = x if last else F.relu(x)
            return x

    return Net()


def _pyg_step(
    net: torch.nn.Module,
    opt: torch.optim.Optimizer,
    feat: torch.Tensor,
    edge_index: torch.Tensor,
    labels: torch.Tensor,
    train: torch.Tensor,
    autocast: Callable[[], AbstractContextManager[object]],
    sync: Callable[[], None],
) -> None:
    """One PyG epoch as qtrain's Trainer.run times one: the step, the loss read back, train
    accuracy; then ``sync()`` for the row's device (the Timer's clock waits for the current
    device only)."""
    import torch.nn.functional as F

    net.train()
    opt.zero_grad(set_to_none=True)
    with autocast():
        logits = net(feat, edge_index)[train]
        loss = F.cross_entropy(logits.float(), labels[train])
    loss.backward()
    opt.step()
    float(loss.item())
    float((logits.argmax(1) == labels[train]).float().mean())
    sync()


def _pyg_row(
    size: Size, model: str, dataset: Any, bf16: bool, device: torch.device
) -> dict[str, Any]:
    import torch_geometric

    from qtrain.data.base import FEAT, LABEL, TEST_MASK, TRAIN_MASK, VAL_MASK

    row: dict[str, Any] = {"pyg_version": torch_geometric.__version__}
    graph = dataset.graph
    threads = torch.get_num_threads()
    if size.threads:
        torch.set_num_threads(size.threads)  # as the qtrain rows' train.threads
    with contextlib.ExitStack() as stack:
        stack.callback(torch.set_num_threads, threads)
        stack.enter_context(_memory(device, row))
        src, dst = graph.edges()
        edge_index = torch.stack([src, dst]).to(device)
        data = graph.ndata
        feat, labels = data[FEAT].to(device), data[LABEL].to(device)
        idx = {
            k: torch.nonzero(data[m], as_tuple=False).squeeze(1).to(device)
            for k, m in (("train", TRAIN_MASK), ("val", VAL_MASK), ("test", TEST_MASK))
        }
        torch.manual_seed(0)
        net = _pyg_model(model, feat.shape[1], dataset.num_classes, size.models[model]).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=size.lr[model], weight_decay=0.0)

        def autocast() -> Any:
            if bf16:
                return torch.autocast(device.type, dtype=torch.bfloat16)
            return contextlib.nullcontext()

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        step = functools.partial(
            _pyg_step, net, opt, feat, edge_index, labels, idx["train"], autocast, sync
        )
        times: list[float] = []
        best = (-1.0, None, None)
        for epoch in range(1, size.epochs + 1):
            sync()
            times.append(once(step))
            if epoch % size.eval_every == 0 or epoch == size.epochs:
                net.eval()
                with torch.no_grad(), autocast():
                    pred = net(feat, edge_index).argmax(1)
                acc = {k: float((pred[idx[k]] == labels[idx[k]]).float().mean()) for k in idx}
                if acc["val"] > best[0]:
                    best = (acc["val"], acc["test"], epoch)
        del step, net, opt, feat, labels, edge_index, idx, pred
    if device.type != "cuda":
        row["peak_memory_source"] = "not measured on the CPU (no per-row peak there)"
    row.update(_spread(times[size.warmup :]))
    row.update(
        status="ok",
        test_acc=best[1],
        val_acc=best[0],
        best_epoch=best[2],
        epochs=size.epochs,
        timed_epochs=max(0, len(times) - size.warmup),
    )
    return row


def _pyg_missing() -> str | None:
    """Why PyG's rows cannot run here, or None."""
    try:
        import torch_geometric.nn  # noqa: F401
    except Exception as exc:  # not installed, or broken against this torch
        return f"not installed: PyTorch Geometric ({type(exc).__name__}: {exc})"
    return None


# ----------------------------------------------------------------- a size, all rows


def _guarded(fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)``'s row, or a row that says it ran out of memory / failed."""
    from qtrain.errors import RunDiverged

    try:
        return fn(*args)
    except Exception as exc:
        oom = _is_oom(exc)
        if oom:
            status = "out of memory"
        elif isinstance(exc, RunDiverged):  # the loss or the weights stopped being finite
            status = f"diverged: {exc}"[:500]
        else:
            status = f"error: {type(exc).__name__}: {exc}"[:500]
        trace = None if oom else traceback.format_exc()[-4000:]
    # out of the except block: the traceback's frames, which hold the failed row's tensors,
    # are gone, so the memory can go back before the next row
    from qtrain.ops.graph import CSR_CACHE

    CSR_CACHE.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"status": status, "ms": None, "trace": trace}


def _shape(size: Size, model: str, dataset: Any) -> str:
    g = dataset.graph
    cfg = size.models[model]
    if model == "gat":
        dims = f"{cfg['layers']} layers, {cfg['heads']} heads x {cfg['hidden']}"
    else:
        dims = f"{cfg['layers']} x {cfg['hidden']}" + (
            f" ({cfg['aggregator']})" if model == "sage" else ""
        )
    loops = " (+ self-loops)" if model in ("gcn", "gat") else ""
    return (
        f"{MODEL_NAMES[model]} {dims} on {size.preset}: {g.num_nodes():,} nodes, "
        f"{g.num_edges():,} edges{loops}, {dataset.graph.ndata['feat'].shape[1]} features, "
        f"{dataset.num_classes} classes"
    )


def measure(
    sizes: list[str],
    device: str = "cuda",
    models: tuple[str, ...] = MODELS,
    variants: frozenset[str] | None = None,
) -> list[dict[str, Any]]:
    """Every row of every size (``variants``: only those of ``VARIANT_KEYS`` and ``PYG_KEY``
    named, beside FP32; None: all); raises ``E2EFailure`` (with the rows) when a qtrain FP32
    row does not reach its accuracy bar."""
    chosen = {FP32} | {
        name for key, name in VARIANT_KEYS.items() if variants is None or key in variants
    }
    with_pyg = variants is None or PYG_KEY in variants
    dev = torch.device(device)
    # the built-in plugins (tango, exact) register on import; a checkout that is not
    # installed finds them in plugins/
    from qtrain.plugin import import_builtin_plugins

    import_builtin_plugins()
    pyg_missing = _pyg_missing()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="qtrain-e2e-") as out_dir:
        for size_name in sizes:
            size = SIZES[size_name]
            started = time.perf_counter()
            dataset_name, dataset = _in_memory(size)
            print(
                f"gpu_e2e: {size.preset} ready in {time.perf_counter() - started:.1f} s "
                f"({dataset.graph.num_nodes():,} nodes, {dataset.graph.num_edges():,} edges)",
                file=sys.stderr,
                flush=True,
            )
            chance = 1.0 / dataset.num_classes
            for model in models:
                group: list[dict[str, Any]] = []
                for variant, quant, bf16 in QTRAIN_VARIANTS:
                    if variant not in chosen:
                        continue
                    row = _guarded(
                        _qtrain_row, size, model, dataset_name, quant, bf16, dev, out_dir
                    )
                    row["variant"] = variant
                    if bf16:
                        row["note"] = BF16_NOTE
                    group.append(row)
                    _progress(size_name, model, row)
                qtrain_rows = len(group)
                for bf16 in (False, True) if with_pyg else ():
                    variant = f"PyG {PYG_CONVS[model]} {'bf16 autocast' if bf16 else 'FP32'}"
                    if pyg_missing is not None:
                        row = {"status": pyg_missing, "ms": None}
                    else:
                        row = _guarded(_pyg_row, size, model, dataset, bf16, dev)
                    row["variant"] = variant
                    if bf16:
                        row["note"] = "bf16 autocast around PyG's forward"
                    group.append(row)
                    _progress(size_name, model, row)
                base = group[0]
                pyg = group[qtrain_rows] if with_pyg else {}
                for row in group:
                    for key in (
                        "ms",
                        "iqr_ms",
                        "peak_memory_bytes",
                        "test_acc",
                        "val_acc",
                        "best_epoch",
                    ):
                        row.setdefault(key, None)
                    row.update(
                        case=f"e2e {MODEL_NAMES[model]} {row['variant']}",
                        size=size_name,
                        model=model,
                        shape=_shape(size, model, dataset),
                        device=str(dev),
                        chance=chance,
                        warmup_epochs=size.warmup,
                        **_ratios(row, base, "qtrain FP32 (route)"),
                        **_pyg_ratios(row, pyg),
                        gbps=None,
                        bw_fraction=None,
                    )
                bar = accuracy_bar(dataset.num_classes)
                base["accuracy_bar"] = bar
                acc = base.get("test_acc")
                base["accuracy_ok"] = base.get("status") == "ok" and acc is not None and acc >= bar
                if not base["accuracy_ok"]:
                    failures.append(
                        f"{MODEL_NAMES[model]} on {size.preset}, qtrain FP32: status "
                        f"{base.get('status')!r}, test accuracy {acc} (want >= {bar:.3f}, "
                        f"chance {chance:.3f})"
                    )
                rows.extend(group)
            _LOADED.clear()  # the next size's graph must not share memory with this one
            del dataset
            gc.collect()
    if failures:
        raise E2EFailure(
            "qtrain FP32 did not train well above chance: " + "; ".join(failures), rows
        )
    return rows


def _ratios(row: dict[str, Any], base: dict[str, Any], name: str) -> dict[str, Any]:
    ms, base_ms = row.get("ms"), base.get("ms")
    mem, base_mem = row.get("peak_memory_bytes"), base.get("peak_memory_bytes")
    return {
        "baseline": name,
        "baseline_ms": base_ms,
        "baseline_iqr_ms": base.get("iqr_ms"),
        "ratio": base_ms / ms if ms and base_ms else None,
        "memory_ratio": base_mem / mem if mem and base_mem else None,
    }


def _pyg_ratios(row: dict[str, Any], pyg: dict[str, Any]) -> dict[str, Any]:
    ms, pyg_ms = row.get("ms"), pyg.get("ms")
    mem, pyg_mem = row.get("peak_memory_bytes"), pyg.get("peak_memory_bytes")
    return {
        "pyg_fp32_ms": pyg_ms,
        "pyg_fp32_iqr_ms": pyg.get("iqr_ms"),
        "ratio_vs_pyg_fp32": pyg_ms / ms if ms and pyg_ms else None,
        "memory_ratio_vs_pyg_fp32": pyg_mem / mem if mem and pyg_mem else None,
    }


def _progress(size: str, model: str, row: dict[str, Any]) -> None:
    ms = "-" if row.get("ms") is None else f"{row['ms']:.2f} ± {row['iqr_ms']:.2f} ms (IQR)"
    acc = "-" if row.get("test_acc") is None else f"{row['test_acc']:.3f}"
    print(
        f"gpu_e2e: {size} {model} {row['variant']}: {ms}, test acc {acc}, {row['status']}",
        file=sys.stderr,
        flush=True,
    )


def run(quick: bool) -> list[dict[str, Any]]:
    """``bench/gpu.py``'s stage: arxiv scale (quick), arxiv and products scale (full)."""
    return measure(["arxiv"] if quick else ["arxiv", "products"], "cuda")


# ----------------------------------------------------------------- the command


def _fmt(value: Any, spec: str, scale: float = 1.0, unit: str = "") -> str:
    return "-" if value is None else format(value * scale, spec) + unit


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| case | ms (median ± IQR) | min-max | vs qtrain FP32 | vs PyG FP32 | peak MiB | "
        "mem vs qtrain FP32 | test acc | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        spread = "-" if r.get("ms_min") is None else f"{r['ms_min']:.2f}-{r['ms_max']:.2f}"
        lines.append(
            f"| {r['case']} ({r['size']}) | {_fmt(r.get('ms'), '.2f')}"
            + ("" if r.get("iqr_ms") is None else f" ± {r['iqr_ms']:.2f}")
            + f" | {spread} | "
            f"{_fmt(r.get('ratio'), '.2f', unit='x')} | "
            f"{_fmt(r.get('ratio_vs_pyg_fp32'), '.2f', unit='x')} | "
            f"{_fmt(r.get('peak_memory_bytes'), '.0f', 2**-20)} | "
            f"{_fmt(r.get('memory_ratio'), '.2f', unit='x')} | {_fmt(r.get('test_acc'), '.3f')} | "
            f"{r['status']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    set_up_allocator()  # as the qtrain command sets up its process (qtrain._malloc)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument(
        "--size",
        action="append",
        choices=sorted(SIZES),
        help="graph size; repeat for several (default: arxiv)",
    )
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}"
    )
    keys = [*VARIANT_KEYS, PYG_KEY]
    parser.add_argument(
        "--variants",
        default=None,
        help=f"comma-separated rows beside FP32, of {', '.join(keys)} (default: all)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the rows there")
    args = parser.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m)
    if not models or any(m not in MODELS for m in models):
        parser.error(f"--models takes names of {', '.join(MODELS)}")
    variants = None
    if args.variants is not None:
        variants = frozenset(v for v in args.variants.split(",") if v)
        if any(v not in keys for v in variants):
            parser.error(f"--variants takes names of {', '.join(keys)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            f"gpu_e2e: torch {torch.__version__} sees no CUDA device; use --device cpu",
            file=sys.stderr,
        )
        return 2
    sizes = args.size or ["arxiv"]
    dgl: dict[str, Any] | None = None
    if args.device.startswith("cuda"):
        # a GPU machine has no DGL: bench/gpu.py's step installs it from .gpu/wheels
        from gpu import ensure_dgl

        dgl = ensure_dgl(Path(tempfile.gettempdir()) / "qtrain-gpu-e2e-dgl.log")
        if "error" in dgl:
            print(f"gpu_e2e: {dgl['error']}", file=sys.stderr)
            return 1
    record: dict[str, Any] = {
        "command": " ".join(["python", "bench/gpu_e2e.py", *(argv or sys.argv[1:])]),
        "device": args.device,
        "device_name": (
            torch.cuda.get_device_name(torch.device(args.device))
            if args.device.startswith("cuda")
            else "cpu"
        ),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sizes": sizes,
        "dgl": dgl,
    }
    status = 0
    started = time.perf_counter()
    try:
        rows = measure(sizes, args.device, models, variants)
    except E2EFailure as exc:
        rows, status = exc.rows, 1
        record["error"] = str(exc)
        print(f"gpu_e2e: FAILED {exc}", file=sys.stderr)
    record["seconds"] = round(time.perf_counter() - started, 1)
    record["rows"] = rows
    print(table(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
