"""The OGB node-property tasks (ogbn-*), read with the ``ogb`` package from a local folder.

qtrain never downloads: ogb's ``DglNodePropPredDataset`` would fetch a
missing dataset (after asking on standard input) and would ask to delete a
folder without the expected ``RELEASE_v*.txt``. Both would hang or surprise
a batch run, so every file ogb is about to look for is checked first, and a
missing one is a one-line error saying which folder was expected and how to
fill it. ogb's progress prints are sent to standard error (``--json`` keeps
standard output clean), and its import-time version check, a request to
PyPI from a background thread, is kept from starting.

Per task:

* arxiv, papers100M: directed citations; ``to_bidirected`` (default true)
  adds reverse edges as DGL's examples do. papers100M's unlabelled nodes
  (NaN in ogb) get label 0 and are in no split.
* products: ogb already stores both directions.
* proteins: 112 binary tasks, so the label is float32 [N, 112] and the
  metric micro-F1 (OGB's own leaderboard metric is ROC-AUC). It has no node
  features; as in OGB's and DGL's examples, a node's feature is the mean of
  its 8 incoming edge features (edge features stay in ``edata['feat']``).
* mag: heterogeneous; qtrain's node datasets are homogeneous, so this loads
  the paper nodes and paper-cites-paper edges only (OGB's homogeneous
  baselines do the same), with ``to_bidirected`` true by default.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import warnings
from collections.abc import Iterator
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
    data_dir,
    index_mask,
)
from qtrain.data.registry import DATASETS
from qtrain.errors import DatasetError


@dataclass(frozen=True)
class OgbOptions:
    """Where ogb's dataset folders are, and whether to add reverse edges."""

    root: str = option(
        "",
        "folder holding ogb's dataset folders (ogbn_arxiv/, ogbn_products/, ...); "
        "empty = <data dir>/ogb, the data dir being $QTRAIN_DATA_DIR or ~/.cache/qtrain/datasets",
    )
    to_bidirected: bool = option(
        False,
        "add the reverse of every edge (duplicates merged, edge data dropped), as DGL's "
        "examples do for the directed citation graphs",
    )


@dataclass(frozen=True)
class _Task:
    summary: str
    to_bidirected: bool


TASKS: dict[str, _Task] = {
    "ogbn-arxiv": _Task(
        "OGB arXiv citation graph (169,343 nodes, 40 classes), official time split", True
    ),
    "ogbn-products": _Task(
        "OGB Amazon co-purchase graph (2,449,029 nodes, 47 classes), sales-rank split", False
    ),
    "ogbn-proteins": _Task(
        "OGB protein association graph (132,534 nodes, 112 binary tasks: micro-F1), species split",
        False,
    ),
    "ogbn-mag": _Task(
        "OGB MAG, paper nodes and paper-cites-paper edges only (736,389 nodes, 349 classes), time split",
        True,
    ),
    "ogbn-papers100M": _Task(
        "OGB papers100M citation graph (111M nodes, 172 classes), time split", True
    ),
}


def import_ogb_dataset() -> Any:
    """``DglNodePropPredDataset``, imported after ``import_dgl`` (which also keeps
    ogb from starting its background PyPI version check)."""
    from qtrain._compat import import_dgl

    import_dgl()
    with contextlib.redirect_stdout(sys.stderr):
        from ogb.nodeproppred.dataset_dgl import DglNodePropPredDataset
    return DglNodePropPredDataset


def _master(name: str) -> dict[str, str]:
    """ogb's metadata row for ``name`` (read from the package's master.csv, no import needed)."""
    import csv

    spec = importlib.util.find_spec("ogb")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(
            f"dataset {name!r} needs the ogb package; install it with `pip install ogb`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "nodeproppred" / "master.csv"
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    column = header.index(name)
    return {row[0]: row[column] for row in rows[1:]}


def _folder_help(name: str, meta: dict[str, str], root: Path, dir_name: str) -> str:
    return (
        f"qtrain never downloads: fetch {meta['url']}, unzip it in {root} and rename the folder "
        f"{meta['download_name']}/ to {dir_name}/ (or set [dataset] root, or $QTRAIN_DATA_DIR "
        "whose ogb/ subfolder is the default root)"
    )


def _required_files(meta: dict[str, str]) -> list[str]:
    """The raw files (relative to the dataset folder) ogb reads when it has no processed copy."""
    if meta["is hetero"] == "True":
        return [
            "raw/triplet-type-list.csv.gz"
            if meta["binary"] != "True"
            else "raw/edge_index_dict.npz",
            "raw/num-node-dict.csv.gz" if meta["binary"] != "True" else "raw/num_nodes_dict.npz",
            "raw/nodetype-has-label.csv.gz" if meta["binary"] != "True" else "raw/node-label.npz",
        ]
    if meta["binary"] == "True":
        return ["raw/data.npz", "raw/node-label.npz"]
    files = [
        "raw/edge.csv.gz",
        "raw/num-node-list.csv.gz",
        "raw/num-edge-list.csv.gz",
        "raw/node-label.csv.gz",
    ]
    if meta["has_node_attr"] == "True":
        files.append("raw/node-feat.csv.gz")
    if meta["has_edge_attr"] == "True":
        files.append("raw/edge-feat.csv.gz")
    for extra in ("additional node files", "additional edge files"):
        if meta[extra] != "None":
            files += [f"raw/{f}.csv.gz" for f in meta[extra].split(",")]
    return files


def _split_files(meta: dict[str, str]) -> list[list[str]]:
    """Alternatives (any one suffices) for the split files ogb reads."""
    split = f"split/{meta['split']}"
    if meta["is hetero"] == "True":
        return [[f"{split}/nodetype-has-split.csv.gz"]]
    return [
        [f"{split}/split_dict.pt", f"{split}/train.csv.gz"],
        [f"{split}/split_dict.pt", f"{split}/valid.csv.gz"],
        [f"{split}/split_dict.pt", f"{split}/test.csv.gz"],
    ]


def check_files(name: str, root: Path) -> Path:
    """The dataset folder ogb will use, after checking it holds everything ogb reads.

    Mirrors ``DglNodePropPredDataset``: the folder is ``<root>/ogbn_<x>`` (or
    ``ogbn_<x>_dgl`` if that exists), must hold ``RELEASE_v<version>.txt``,
    and either ``processed/dgl_data_processed`` or the raw files; plus the
    official split.
    """
    meta = _master(name)
    dir_name = name.replace("-", "_")
    if (root / f"{dir_name}_dgl").is_dir():
        dir_name += "_dgl"
    folder = root / dir_name
    how = _folder_help(name, meta, root, dir_name)
    if not folder.is_dir():
        raise DatasetError(
            f"dataset {name!r}: expected ogb's folder {folder}, which does not exist; {how}"
        )
    release = folder / f"RELEASE_v{meta['version']}.txt"
    if not release.is_file():
        raise DatasetError(
            f"dataset {name!r}: {folder} has no {release.name}, so it is not the current release "
            f"of ogb's {name} folder (ogb would offer to delete it); {how}"
        )
    if not (folder / "processed" / "dgl_data_processed").is_file():
        for rel in _required_files(meta):
            alternatives = [rel]
            if rel == "raw/node_species.csv.gz":  # ogb renames species.csv.gz itself
                alternatives.append("raw/species.csv.gz")
            if not any((folder / a).is_file() for a in alternatives):
                raise DatasetError(
                    f"dataset {name!r}: {folder / rel} is missing (and there is no "
                    f"processed/dgl_data_processed); the folder is incomplete; {how}"
                )
    for alternatives in _split_files(meta):
        if not any((folder / a).is_file() for a in alternatives):
            raise DatasetError(
                f"dataset {name!r}: the official split file {folder / alternatives[-1]} is "
                f"missing; {how}"
            )
    return folder


def _read_split(dataset: Any, folder: Path, meta: dict[str, str]) -> Any:
    """The official split; ``split_dict.pt`` is read weights-only (ogb's own reader would
    unpickle anything in it), the CSV files through ogb (pandas, no pickle)."""
    import torch

    path = folder / "split" / meta["split"] / "split_dict.pt"
    if not path.is_file():
        return dataset.get_idx_split()
    try:
        split = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a refused global, or truncated / garbled bytes
        raise DatasetError(
            f"{path}: refusing to read this split file ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:160] if str(exc).strip() else 'no detail'}); "
            "it must hold a dict of index tensors: replace it with the original"
        ) from None
    parts = ("train", "valid", "test")
    if not isinstance(split, dict) or any(part not in split for part in parts):
        raise DatasetError(f"{path}: expected a dict with the keys {', '.join(parts)}")
    return split


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """ogb prints progress to standard output; keep it off (``--json`` owns stdout)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def load_ogb(name: str, opts: OgbOptions) -> NodeDataset:
    """Read ``name`` from ``opts.root`` through ogb; see the module docstring for what each task becomes."""
    import torch

    from qtrain._compat import import_dgl

    root = Path(opts.root).expanduser() if opts.root else data_dir() / "ogb"
    folder = check_files(name, root)
    meta = _master(name)
    dataset_cls = import_ogb_dataset()
    dgl = import_dgl()
    try:
        with _stdout_to_stderr(), warnings.catch_warnings():
            # ogb hands pandas' read-only arrays to torch.from_numpy; the copy it makes next is fine
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            dataset = dataset_cls(name=name, root=str(root))
            split = _read_split(dataset, folder, meta)
        graph, labels = dataset[0]
    except DatasetError:
        raise
    except (Exception, SystemExit) as exc:
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "no detail"
        raise DatasetError(
            f"dataset {name!r}: ogb could not read {folder} ({type(exc).__name__}: {detail}); "
            f"if {folder / 'processed'} exists, delete it so that ogb rebuilds it from raw/, "
            "otherwise replace the folder with a fresh copy"
        ) from None

    info: dict[str, Any] = {
        "source": "ogb",
        "folder": str(folder),
        "ogb_metric": meta["eval metric"],
    }
    metric = "accuracy"
    if meta["is hetero"] == "True":
        if "paper" not in graph.ntypes or ("paper", "cites", "paper") not in graph.canonical_etypes:
            raise DatasetError(f"dataset {name!r}: {folder} has no paper-cites-paper relation")
        src, dst = graph.edges(etype=("paper", "cites", "paper"))
        paper = graph.nodes["paper"].data
        g = dgl.graph((src, dst), num_nodes=graph.num_nodes("paper"))
        for key, value in paper.items():
            g.ndata[key] = value
        labels = labels["paper"]
        split = {part: split[part]["paper"] for part in ("train", "valid", "test")}
        info["node_type"] = "paper (other node types and relations dropped)"
    else:
        g = graph
    if name == "ogbn-proteins":
        # proteins: 112 binary tasks -> multi-label; node features from incoming edge features
        efeat = g.edata["feat"].float()
        _, dst = g.edges()
        total = torch.zeros(g.num_nodes(), efeat.shape[1]).index_add_(0, dst, efeat)
        g.ndata[FEAT] = total / g.in_degrees().clamp(min=1).unsqueeze(1).float()
        label = labels.float()
        num_classes, metric = int(label.shape[1]), "micro_f1"
    else:
        label = labels.reshape(-1) if labels.dim() == 2 and labels.shape[1] == 1 else labels
        if label.is_floating_point():  # NaN marks unlabelled nodes (papers100M)
            unlabelled = torch.isnan(label)
            info["unlabelled_nodes"] = int(unlabelled.sum())
            label = torch.where(unlabelled, torch.zeros_like(label), label)
        label = label.long()
        num_classes = int(meta["num classes"])
    if opts.to_bidirected:
        g = dgl.to_bidirected(g, copy_ndata=True)
    n = g.num_nodes()
    g.ndata[FEAT] = g.ndata[FEAT].float()
    g.ndata[LABEL] = label
    for key, part in ((TRAIN_MASK, "train"), (VAL_MASK, "valid"), (TEST_MASK, "test")):
        g.ndata[key] = index_mask(n, split[part], f"dataset {name!r}: the {part} split")
    info.update(
        nodes=n,
        edges=int(g.num_edges()),
        to_bidirected=opts.to_bidirected,
        split={"name": meta["split"], **{k: len(v) for k, v in split.items()}},
    )
    return NodeDataset(name, g, num_classes, metric, info).validate()  # type: ignore[arg-type]


for _name, _task in TASKS.items():
    DATASETS.add(
        _name,
        functools.partial(load_ogb, _name),
        options=OgbOptions,
        summary=_task.summary,
        defaults={"to_bidirected": _task.to_bidirected},
    )
