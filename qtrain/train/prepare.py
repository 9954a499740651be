"""What a run starts from: seeds, threads, the device, the dataset, the model and its graph.

Shared by a single-process run, each distributed worker and ``qtrain calibrate`` /
``qtrain profile``, so they all start exactly as a run of the same recipe does.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from qtrain import route
from qtrain._compat import import_dgl
from qtrain.errors import DatasetError, QtrainError, RecipeError
from qtrain.models import build_model
from qtrain.models.base import GNNModel
from qtrain.plugin import reads_only_in_csr
from qtrain.recipe import Recipe
from qtrain.train.loop import dgl_threads


def seed_everything(seed: int) -> None:
    """Seed every generator a run draws from: Python, NumPy, torch (CPU and CUDA), DGL."""
    dgl = import_dgl()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    dgl.seed(seed)


def resolve_device(name: str) -> torch.device:
    """The torch device for ``train.device`` ("auto": the first GPU torch sees, else the
    CPU), or a RecipeError if it is not usable here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise RecipeError(
            f"train.device = {name!r} is not a device; use 'cpu', 'cuda', 'cuda:N' or 'auto'"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RecipeError(f"train.device = {name!r}, but torch sees no CUDA device; use 'cpu'")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise RecipeError(
                f"train.device = {name!r}, but torch sees {torch.cuda.device_count()} CUDA device(s)"
            )
    return device


def check_mode(recipe: Recipe, model: GNNModel) -> None:
    """Refuse training modes the model or the fanouts cannot serve, naming the keys."""
    train = recipe.train
    if train.mode != "minibatch":
        return
    if not model.supports_minibatch:
        raise RecipeError(
            f"train.mode = 'minibatch' is not supported by model {recipe.model.name!r} "
            "(it trains full-graph only); use train.mode = 'full'"
        )
    layers = len(model.layers)
    if len(train.fanouts) != layers:
        raise RecipeError(
            f"train.fanouts = {list(train.fanouts)} has {len(train.fanouts)} entries, but model "
            f"{recipe.model.name!r} has {layers} GNN layers (model.layers); give one fanout per layer"
        )


def check_trainable(name: str, graph: Any) -> None:
    """Refuse a graph a run could only report made-up numbers for: no nodes, or no node
    to train on (the loss of an empty selection is NaN)."""
    from qtrain.data.base import TRAIN_MASK

    if graph.num_nodes() == 0:
        raise DatasetError(f"dataset {name!r} has no nodes; there is nothing to train")
    mask = graph.ndata.get(TRAIN_MASK)
    if mask is not None and not bool(mask.any()):
        raise DatasetError(
            f"dataset {name!r} has no training nodes (its {TRAIN_MASK} is all false); "
            "give some nodes a true train_mask"
        )


def check_dgl_device(device: torch.device) -> None:
    """Fail early (before the run directory exists) if DGL cannot place graphs on ``device``."""
    dgl = import_dgl()
    try:
        dgl.graph(([0], [0])).to(device)
    except Exception as exc:  # a DGL build without CUDA raises its own error type
        raise QtrainError(
            f"train.device = '{device}' with train.graph_kernels = 'dgl': this DGL build cannot "
            f"place graphs there ({exc}); use graph_kernels = 'auto' (qtrain runs them)"
        ) from None


INT32_LIMIT = 2**31 - 1  # node and edge ids must fit int32 for DGL's int32 graphs


def as_int32(graph: Any) -> Any:
    """``graph`` with int32 ids when its node and edge counts fit them; otherwise as it is.

    What a full-graph run holds. A loaded graph is a COO of int64 ids; a full-graph
    step makes DGL add the CSC (aggregation) and the CSR (its backward) beside it, all
    three in int64: 5.6 GiB of structure on synthetic-products (123.7 M edges), 2.8 GiB
    in int32. The COO stays: qtrain's own kernels (tango, the device route) key their
    CSR on its arrays, and DGL derives a fresh COO on every call from a graph that
    holds only a CSR. Node and edge data are shared, not copied.
    """
    if graph.idtype == torch.int64 and max(graph.num_nodes(), graph.num_edges()) <= INT32_LIMIT:
        return graph.int()
    return graph


def held_as_in_csr(graph: Any) -> Any:
    """``graph`` held as its in-CSR (DGL's CSC) alone, without edge ids: for a run whose
    steps read nothing else (``qtrain.plugin.reads_only_in_csr``).

    DGL converts the COO (its CSC, in its own order within a row, as its aggregation
    reads it); the new graph numbers its edges in that order, so it needs no edge-id
    array, and is restricted to the CSC so DGL keeps nothing beside it: on
    synthetic-products 0.47 GiB of structure in int32, where the COO alone is 0.92 GiB.
    Node data are shared; edge data follow their edges to the new ids.
    """
    dgl = import_dgl()
    indptr, indices, eids = graph.formats("csc").adj_tensors("csc")
    held = dgl.graph(
        ("csc", (indptr, indices, indices.new_empty(0))),
        num_nodes=graph.num_nodes(),
        idtype=graph.idtype,
    ).formats("csc")
    held.ndata.update(graph.ndata)
    if len(graph.edata):
        order = eids.long() if eids.numel() else torch.arange(graph.num_edges())
        held.edata.update({key: value[order] for key, value in graph.edata.items()})
    return held


def uses_route(graph_kernels: str, device: torch.device) -> bool:
    """Whether qtrain's device route runs the graph primitives (``train.graph_kernels``)."""
    return graph_kernels == "qtrain" or (graph_kernels == "auto" and device.type != "cpu")


@contextlib.contextmanager
def prepared(
    recipe: Recipe, device: torch.device | None = None, compact: bool = True
) -> Iterator[tuple[Any, Any, GNNModel, torch.device]]:
    """Threads, seeds, dataset, model and graph exactly as a run of ``recipe`` starts them.

    Yields ``(dataset, graph, model, device)`` with the graph through
    ``model.prepare_graph`` and the model on the device (``train.device``, unless
    ``device`` overrides it: a distributed worker's own GPU) and, for a full-graph run
    unless ``compact`` is false, made from the dataset's graph with int32 ids
    (``as_int32``), and held as its in-CSR alone where the recipe's plugins read
    nothing else (``held_as_in_csr``); qtrain's device route is enabled for the device when
    ``train.graph_kernels`` says so; thread counts are restored and the route disabled
    afterwards.
    """
    from qtrain.data import load_dataset

    train = recipe.train
    device = device if device is not None else resolve_device(train.device)
    previous_threads = torch.get_num_threads()
    with contextlib.ExitStack() as stack:
        if train.threads:
            torch.set_num_threads(train.threads)
            stack.callback(torch.set_num_threads, previous_threads)
            stack.enter_context(dgl_threads(train.threads))
        seed_everything(train.seed)
        dataset = load_dataset(recipe.dataset.name, recipe.dataset.options)
        check_trainable(recipe.dataset.name, dataset.graph)
        seed_everything(train.seed)  # the model's weights do not depend on how the data was made
        model = build_model(recipe.model, dataset)
        check_mode(recipe, model)
        if train.mode == "full" and compact:
            # before the model's own graph is made from it: nothing keeps the int64 ids
            dataset.graph = as_int32(dataset.graph)
        graph = model.prepare_graph(dataset.graph)
        if (
            train.mode == "full"
            and compact
            and graph is dataset.graph
            and not uses_route(train.graph_kernels, device)
            and reads_only_in_csr(recipe.quant, model, device)
        ):
            dataset.graph = graph = held_as_in_csr(graph)  # the COO is no longer referenced
        if uses_route(train.graph_kernels, device):
            route.enable(device)  # before any plugin: plugins wrap the route's primitives
            stack.callback(route.disable)
        elif device.type != "cpu":
            check_dgl_device(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        yield dataset, graph, model.to(device), device
