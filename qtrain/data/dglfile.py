"""A user's own graph saved with ``dgl.save_graphs``: how to train on data qtrain does not know.

The recipe names the file and which node-data fields hold the features,
labels and masks. Everything is checked before training starts, and every
problem is one line: the file is missing or not a DGL graph file, a field
does not exist (the line lists those that do), or has the wrong dtype or
shape. Accepted:

* ``feat``: a 2-D numeric tensor [N, F], converted to float32;
* ``label``: integers [N] (or [N, 1]) for single-label classification, or a
  2-D 0/1 tensor [N, C] for multi-label (metric micro-F1). Negative labels
  (a common "unlabelled" marker) are allowed only outside the three masks and
  become 0, as a trainer may one-hot every label;
* masks: bool, or numbers that are all 0 or 1, of shape [N].

A heterograph (several node or edge types) becomes a relational dataset
(``qtrain.data.base.Relations``): ``target`` names the node type whose labels
and masks are read; every node type's ``feat`` field must have the same width,
and a type without one gets zero features (named in ``info`` and in a warning);
nodes are grouped by type and edges by relation, in the file's type order.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qtrain.config import option
from qtrain.data.base import (
    FEAT,
    LABEL,
    TEST_MASK,
    TRAIN_MASK,
    VAL_MASK,
    NodeDataset,
    fill_typed_node_data,
    typed_graph,
)
from qtrain.data.dgl_reader import read_graph_file
from qtrain.data.registry import DATASETS
from qtrain.errors import DatasetError

# First 8 bytes of every file dgl.save_graphs writes (kDGLSerializeMagic, little endian).
DGL_MAGIC = (0xDD2E4FF046B4A13F).to_bytes(8, "little")


@dataclass(frozen=True)
class DglFileOptions:
    """Which file, which graph in it, and which node-data fields to use."""

    path: str = option(help="file written by dgl.save_graphs (~ is expanded)")
    graph_index: int = option(0, "which graph of the file to use (0 = the first)", min=0)
    feat: str = option("feat", "node-data field holding the features [N, F]")
    label: str = option(
        "label", "node-data field holding the labels: integers [N], or 0/1 [N, C] for multi-label"
    )
    train_mask: str = option("train_mask", "node-data field holding the training mask [N]")
    val_mask: str = option("val_mask", "node-data field holding the validation mask [N]")
    test_mask: str = option("test_mask", "node-data field holding the test mask [N]")
    num_classes: int = option(
        0,
        "number of classes; 0 = max label + 1 (or the label width for multi-label)",
        min=0,
        max=1_000_000,
    )
    target: str = option(
        "",
        "for a file holding a heterograph: the node type to classify (its labels and masks "
        "are read); leave empty for a homogeneous graph",
    )


def _read_graph(path: Path, index: int, heterogeneous: bool) -> Any:
    """Graph ``index`` of the DGL file at ``path``; DatasetError for anything but a good file."""
    if not path.exists():
        raise DatasetError(
            f"dataset 'dgl-file': {path} does not exist; "
            "set [dataset] path to a file written by dgl.save_graphs"
        )
    if not path.is_file():
        raise DatasetError(
            f"dataset 'dgl-file': {path} is not a file; "
            "set [dataset] path to a file written by dgl.save_graphs"
        )
    with open(path, "rb") as f:
        head = f.read(8)
    if head != DGL_MAGIC:
        raise DatasetError(
            f"dataset 'dgl-file': {path} is not a DGL graph file (it does not start with DGL's "
            "marker); write it with dgl.save_graphs"
        )
    return read_graph_file(path, index, f"dataset 'dgl-file': {path}", heterogeneous=heterogeneous)


def _field(data: Mapping[str, Any], key: str, role: str, path: Path, of: str = "") -> Any:
    if key not in data:
        present = ", ".join(sorted(data.keys())) or "none"
        raise DatasetError(
            f"dataset 'dgl-file': {path} has no node-data field {key!r}{of} (the {role}); "
            f"fields present: {present}; set [dataset] {role} to one of them"
        )
    return data[key]


def _shape(tensor: Any) -> str:
    return f"{str(tensor.dtype).replace('torch.', '')} {list(tensor.shape)}"


def _labels(
    raw: Any, labelled: Any, opts: DglFileOptions, where: str, info: dict[str, Any]
) -> tuple[Any, int, str]:
    """(label tensor, num_classes, metric) from the label field, or a DatasetError saying why not."""
    import torch

    n, field = len(labelled), repr(opts.label)
    if raw.dim() == 2 and raw.shape[1] == 1 and not raw.is_floating_point():
        raw = raw[:, 0]  # ogb-style [N, 1] class ids
    if raw.dim() == 2 and raw.shape[0] == n:
        if raw.is_complex() or not bool(((raw == 0) | (raw == 1)).all()):
            raise DatasetError(
                f"{where}: label field {field} is {_shape(raw)} with values other than 0 and 1; "
                "multi-label targets must be 0/1"
            )
        num_classes = int(raw.shape[1])
        if opts.num_classes not in (0, num_classes):
            raise DatasetError(
                f"{where}: num_classes = {opts.num_classes} but the multi-label field {field} "
                f"has {num_classes} columns; allowed: 0 or {num_classes}"
            )
        return raw.float(), num_classes, "micro_f1"
    if raw.dim() != 1 or raw.shape[0] != n:
        raise DatasetError(
            f"{where}: label field {field} is {_shape(raw)}; expected integers [{n}] or 0/1 [{n}, C]"
        )
    if raw.is_floating_point() or raw.is_complex() or raw.dtype == torch.bool:
        raise DatasetError(
            f"{where}: label field {field} is {_shape(raw)}; single-label classes must be "
            f"integers (multi-label needs [{n}, C] of 0/1)"
        )
    label = raw.long()
    if n and bool((label[labelled] < 0).any()):
        raise DatasetError(
            f"{where}: label field {field} has negative labels on nodes inside "
            "train/val/test masks; allowed: 0 and up"
        )
    negative = label < 0
    if bool(negative.any()):  # "unlabelled" markers outside the masks
        info["unlabelled_nodes"] = int(negative.sum())
        label = torch.where(negative, torch.zeros_like(label), label)
    inferred = int(label.max()) + 1 if n else 0
    if inferred > n:  # a stray label of 1e9 once built a 1e9-class output layer
        raise DatasetError(
            f"{where}: label field {field} goes up to {inferred - 1}, but the graph has {n} "
            "nodes, so most of those classes have no node; labels must be class ids 0..C-1 "
            "(a stray value?)"
        )
    num_classes = opts.num_classes or inferred
    if num_classes < inferred:
        raise DatasetError(
            f"{where}: num_classes = {opts.num_classes} but labels go up to {inferred - 1}; "
            f"allowed: 0 (infer) or at least {inferred}"
        )
    return label, num_classes, "accuracy"


def _features(feat: Any, n: int, field: str, where: str, of: str = "") -> Any:
    if feat.dim() != 2 or feat.shape[0] != n or feat.is_complex():
        raise DatasetError(
            f"{where}: feature field {field!r}{of} is {_shape(feat)}; "
            f"expected a numeric [{n}, F] tensor"
        )
    return feat.float()


def _task(
    data: Mapping[str, Any], n: int, opts: DglFileOptions, path: Path, of: str = ""
) -> tuple[dict[str, Any], Any, int, str, dict[str, Any]]:
    """The masks, labels, class count and metric from one node type's data (``of`` names
    the type in errors), and what ``info`` should record of them."""
    import torch

    where = f"dataset 'dgl-file': {path}"
    masks = {}
    for key, field in (
        (TRAIN_MASK, opts.train_mask),
        (VAL_MASK, opts.val_mask),
        (TEST_MASK, opts.test_mask),
    ):
        mask = _field(data, field, key, path, of)
        if mask.shape != (n,):
            raise DatasetError(
                f"{where}: mask field {field!r}{of} is {_shape(mask)}; expected [{n}] of bool or 0/1"
            )
        if mask.dtype != torch.bool:
            if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
                raise DatasetError(
                    f"{where}: mask field {field!r}{of} ({_shape(mask)}) "
                    "holds values other than 0 and 1"
                )
            mask = mask != 0
        masks[key] = mask
    labelled = masks[TRAIN_MASK] | masks[VAL_MASK] | masks[TEST_MASK]
    raw = _field(data, opts.label, "label", path, of)
    info: dict[str, Any] = {}
    label, num_classes, metric = _labels(raw, labelled, opts, where, info)
    return masks, label, num_classes, metric, info


def _fields(opts: DglFileOptions) -> dict[str, str]:
    return {
        "feat": opts.feat,
        "label": opts.label,
        "train_mask": opts.train_mask,
        "val_mask": opts.val_mask,
        "test_mask": opts.test_mask,
    }


def load_dgl_file(opts: DglFileOptions) -> NodeDataset:
    """Read graph ``opts.graph_index`` of ``opts.path`` and check its fields against the contract."""
    path = Path(opts.path).expanduser()
    g = _read_graph(path, opts.graph_index, heterogeneous=True)
    where = f"dataset 'dgl-file': {path}"
    if len(g.ntypes) > 1 or len(g.canonical_etypes) > 1:
        return _relational(g, opts, path)
    if opts.target:
        raise DatasetError(
            f"{where}: target = {opts.target!r} names a node type, but the graph is "
            "homogeneous; leave target empty"
        )
    n = g.num_nodes()
    feat = _features(_field(g.ndata, opts.feat, "feat", path), n, opts.feat, where)
    masks, label, num_classes, metric, task_info = _task(g.ndata, n, opts, path)
    g.ndata[FEAT] = feat
    g.ndata[LABEL] = label
    for key, mask in masks.items():
        g.ndata[key] = mask
    info: dict[str, Any] = {
        "source": "dgl-file",
        "path": str(path),
        "graph_index": opts.graph_index,
        **task_info,
        "nodes": n,
        "edges": int(g.num_edges()),
        "fields": _fields(opts),
    }
    return NodeDataset("dgl-file", g, num_classes, metric, info).validate()  # type: ignore[arg-type]


def _relational(hetero: Any, opts: DglFileOptions, path: Path) -> NodeDataset:
    """A heterograph as one homogeneous graph with type ids (the Relations contract)."""
    where = f"dataset 'dgl-file': {path}"
    ntypes = list(hetero.ntypes)
    if opts.target not in ntypes:
        said = f"target = {opts.target!r} is not one of them" if opts.target else "set target"
        raise DatasetError(
            f"{where} holds a heterograph with node types {ntypes}; {said} (the node type "
            "to classify)"
        )
    sizes = [int(hetero.num_nodes(t)) for t in ntypes]
    n = sum(sizes)
    feats = {}
    for t, size in zip(ntypes, sizes, strict=True):
        data = hetero.nodes[t].data
        if opts.feat in data:
            feats[t] = _features(data[opts.feat], size, opts.feat, where, f" of type {t!r}")
    if not feats:
        raise DatasetError(
            f"{where}: no node type has the feature field {opts.feat!r}; set [dataset] feat"
        )
    target = ntypes.index(opts.target)
    masks, label, num_classes, metric, task_info = _task(
        hetero.nodes[opts.target].data, sizes[target], opts, path, f" of type {opts.target!r}"
    )
    if metric != "accuracy":
        raise DatasetError(
            f"{where}: multi-label targets on a heterograph are not supported; give the "
            f"{opts.target!r} nodes integer class labels"
        )
    g, relations = typed_graph(hetero, opts.target)
    featureless = fill_typed_node_data(g, relations, feats, label, masks, where, opts.feat)
    if featureless:
        warnings.warn(
            f"{where}: node types {featureless} have no {opts.feat!r} field; their features "
            "are zeros",
            stacklevel=3,
        )
    info: dict[str, Any] = {
        "source": "dgl-file",
        "path": str(path),
        "graph_index": opts.graph_index,
        **task_info,
        "nodes": n,
        "edges": int(g.num_edges()),
        "nodes_per_type": dict(zip(ntypes, sizes, strict=True)),
        "featureless_ntypes": featureless,
        "fields": _fields(opts),
    }
    return NodeDataset("dgl-file", g, num_classes, metric, info, relations).validate()


DATASETS.add(
    "dgl-file",
    load_dgl_file,
    options=DglFileOptions,
    summary="your own graph from a dgl.save_graphs file, with the node-data fields you name "
    "(a heterograph: a relational dataset classifying its target node type)",
)
