"""Cora, Citeseer and Pubmed from the original Planetoid pickles, with the public split.

The files (``ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}``) are
Python 2 pickles, and a pickle can run any code when loaded. They are read
by ``safe_pickle``, which admits only the data these files hold and rebuilds
it through checked constructors, and every array is then checked here
(index ranges, one-hot labels, finite features, sizes against the file and
the machine), so a tampered file fails with a one-line error instead of
executing anything or corrupting memory.

What is built, matching Kipf & Welling's loader and DGL's
``CitationGraphDataset`` (minus self-loops):

* nodes: ``allx`` rows, then the test rows placed at the node ids listed in
  ``test.index``; ids in the test range missing from the list (Citeseer's 15
  isolated nodes) get all-zero features and label rows;
* labels: argmax of the one-hot rows, so an all-zero row (those padded
  Citeseer nodes) becomes label 0; such nodes are in no mask, since the
  split only uses ``range(len(y))``, the 500 nodes after it and
  ``test.index`` (exactly what DGL and PyG do);
* graph: the adjacency lists made symmetric, without self-loops or duplicates;
* features: row-normalised (each row divided by its sum, all-zero rows kept)
  unless ``normalize_features = false``.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qtrain.config import option
from qtrain.data import safe_pickle
from qtrain.data.base import (
    FEAT,
    LABEL,
    TEST_MASK,
    TRAIN_MASK,
    VAL_MASK,
    NodeDataset,
    data_dir,
    memory_budget,
)
from qtrain.data.registry import DATASETS
from qtrain.errors import DatasetError

NAMES = ("cora", "citeseer", "pubmed")
PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")
VAL_SIZE = 500


@dataclass(frozen=True)
class PlanetoidOptions:
    """Where the pickles are and whether features are row-normalised."""

    root: str = option(
        "",
        "folder holding planetoid/<name>/ind.<name>.*; empty = the data directory "
        "($QTRAIN_DATA_DIR, else ~/.cache/qtrain/datasets)",
    )
    normalize_features: bool = option(
        True, "divide each feature row by its sum, as the GCN / GAT papers and DGL do"
    )


# ------------------------------------------------------------------------------ reading


def load_pickle(path: Path) -> Any:
    """Unpickle a Planetoid file into checked records; every failure is one line naming ``path``."""
    if not path.is_file():
        raise DatasetError(_missing(path))
    try:
        return safe_pickle.load(path)
    except safe_pickle.UnsafePickle as exc:
        raise DatasetError(
            f"{path}: refusing to load this pickle: it asks for {exc}, which Planetoid "
            f"files never contain (allowed: {safe_pickle.ALLOWED_NAMES}); replace the file "
            "with the original"
        ) from None
    except safe_pickle.MalformedRecord as exc:
        raise DatasetError(f"{path} is corrupt: {exc}; replace it with the original") from None
    except MemoryError:
        raise DatasetError(f"{path} is corrupt (it asks for more memory than exists)") from None
    except RecursionError:
        raise DatasetError(f"{path} is corrupt (it nests objects too deeply)") from None
    except Exception as exc:  # truncated or garbled data surfaces as many exception types
        raise DatasetError(
            f"{path} is truncated or corrupt ({type(exc).__name__}: {_first_line(exc)}); "
            "replace it with the original file"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else "no detail"


def _missing(path: Path) -> str:
    return (
        f"missing Planetoid file {path.name}: expected it at {path}; put the files "
        f"ind.<name>.{{{','.join(PARTS)},test.index}} in <root>/planetoid/<name>/, where root "
        "is [dataset] root or, when that is empty, $QTRAIN_DATA_DIR (default ~/.cache/qtrain/datasets)"
    )


# ------------------------------------------------------------------------------ loading


def _features(value: Any, path: Path) -> np.ndarray:
    """A feature matrix (sparse or dense) as float32, every index and value checked first."""
    try:
        if isinstance(value, safe_pickle.SparseRecord):
            dense = safe_pickle.sparse_to_dense(value, "its sparse matrix", memory_budget())
        else:
            dense = safe_pickle.as_array(value, "the feature matrix").astype(np.float32)
    except safe_pickle.MalformedRecord as exc:
        raise DatasetError(f"{path} is corrupt: {exc}; replace it with the original") from None
    if dense.ndim != 2:
        raise DatasetError(f"{path}: expected a 2-D feature matrix, found {dense.ndim}-D")
    if not np.isfinite(dense).all():
        raise DatasetError(f"{path}: the features hold NaN or infinite values")
    return dense


def _one_hot(value: Any, path: Path) -> np.ndarray:
    """Label rows: 0/1 entries, at most one 1 per row (all-zero rows are unlabelled nodes)."""
    try:
        array = safe_pickle.as_array(value, "the label matrix")
    except safe_pickle.MalformedRecord as exc:
        raise DatasetError(f"{path}: expected a 2-D one-hot NumPy array ({exc})") from None
    if array.ndim != 2:
        raise DatasetError(f"{path}: expected a 2-D one-hot NumPy array, found {array.ndim}-D")
    if not np.isin(array, (0, 1)).all() or (array.sum(1) > 1).any():
        raise DatasetError(
            f"{path}: label rows must be one-hot (entries 0 or 1, at most one 1 per row)"
        )
    return array


def _test_index(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DatasetError(_missing(path))
    try:
        text = path.read_text(encoding="ascii")
        index = np.asarray(text.split()).astype(np.int64)
    except (UnicodeDecodeError, ValueError, OverflowError, OSError) as exc:
        raise DatasetError(
            f"{path} is corrupt ({_first_line(exc)}); expected one integer node id per line"
        ) from None
    return index


def _edges(graph: Any, n: int, path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """Symmetric, loop-free, duplicate-free (src, dst) sorted by (src, dst), and the self-loop entries dropped."""
    if not isinstance(graph, dict):
        raise DatasetError(
            f"{path}: expected a dict of adjacency lists, found {type(graph).__name__}"
        )
    odd = {type(v).__name__ for v in graph.values() if not isinstance(v, list)}
    if odd:
        raise DatasetError(
            f"{path}: expected a dict of adjacency lists, found values of type {', '.join(sorted(odd))}"
        )
    lengths = np.fromiter((len(v) for v in graph.values()), dtype=np.int64, count=len(graph))
    # every list entry takes at least one byte of the file unless the pickle shares one list
    # between many nodes, which would let a few bytes ask for unbounded memory
    limit = path.stat().st_size
    if int(lengths.sum()) > limit:
        raise DatasetError(
            f"{path} is corrupt: its adjacency lists hold {int(lengths.sum())} entries, more "
            f"than the file's {limit} bytes can store (lists shared between nodes)"
        )
    entries = itertools.chain(graph.keys(), itertools.chain.from_iterable(graph.values()))
    odd = {type(v) for v in entries if type(v) is not int and not isinstance(v, np.integer)}
    if odd:
        raise DatasetError(
            f"{path}: adjacency lists must map node ids to lists of node ids (integers), "
            f"found {', '.join(sorted(t.__name__ for t in odd))}"
        )
    try:
        heads = np.fromiter(graph.keys(), dtype=np.int64, count=len(graph))
        tails = np.fromiter(
            itertools.chain.from_iterable(graph.values()), dtype=np.int64, count=int(lengths.sum())
        )
    except OverflowError as exc:
        raise DatasetError(f"{path}: a node id is out of range ({_first_line(exc)})") from None
    src = np.repeat(heads, lengths)
    ids = np.concatenate([src, tails])
    if len(ids) and (ids.min() < 0 or ids.max() >= n):
        raise DatasetError(
            f"{path}: node id {int(ids.min() if ids.min() < 0 else ids.max())} is outside "
            f"0..{n - 1} (the nodes of allx and tx)"
        )
    loops = src == tails
    a, b = np.minimum(src, tails)[~loops], np.maximum(src, tails)[~loops]
    keys = np.unique(np.concatenate([a * n + b, b * n + a]))
    return keys // n, keys % n, int(loops.sum())


def load_planetoid(name: str, opts: PlanetoidOptions) -> NodeDataset:
    """Read ``<root>/planetoid/<name>/`` into a NodeDataset with the public split."""
    import torch

    from qtrain._compat import import_dgl

    root = Path(opts.root).expanduser() if opts.root else data_dir()
    folder = root / "planetoid" / name
    if not folder.is_dir():
        raise DatasetError(
            f"dataset {name!r}: the folder {folder} does not exist; it must hold the Planetoid files "
            f"ind.{name}.{{{','.join(PARTS)},test.index}}; set [dataset] root or $QTRAIN_DATA_DIR "
            "to the folder that holds planetoid/"
        )
    files = {part: folder / f"ind.{name}.{part}" for part in (*PARTS, "test.index")}
    for path in files.values():  # report a missing file before spending time on the others
        if not path.is_file():
            raise DatasetError(_missing(path))
    obj = {part: load_pickle(files[part]) for part in PARTS}
    x, tx, allx = (_features(obj[p], files[p]) for p in ("x", "tx", "allx"))
    y, ty, ally = (_one_hot(obj[p], files[p]) for p in ("y", "ty", "ally"))
    test = _test_index(files["test.index"])

    n_all, n_classes, n_feat = len(allx), ally.shape[1], allx.shape[1]
    problems = []
    if len(ally) != n_all:
        problems.append(f"allx has {n_all} rows but ally {len(ally)}")
    if len(tx) != len(ty) or len(tx) != len(test):
        problems.append(f"tx has {len(tx)} rows, ty {len(ty)}, test.index {len(test)} entries")
    if tx.shape[1] != n_feat or x.shape[1] != n_feat:
        problems.append(f"feature widths differ: x {x.shape[1]}, tx {tx.shape[1]}, allx {n_feat}")
    if ty.shape[1] != n_classes or y.shape[1] != n_classes:
        problems.append(f"class counts differ: y {y.shape[1]}, ty {ty.shape[1]}, ally {n_classes}")
    if len(y) + VAL_SIZE > n_all:
        problems.append(
            f"y has {len(y)} rows: too many to leave {VAL_SIZE} validation nodes in allx"
        )
    if len(test) and (test.min() < n_all or len(np.unique(test)) != len(test)):
        problems.append(f"test.index must list distinct node ids from {n_all} (after allx) up")
    elif len(test) and int(test.max()) + 1 - n_all > 2 * len(test):
        # ids in the test range that test.index leaves out become featureless padding nodes
        # (Citeseer has 15 of 1,015); far more than listed means a corrupt id, not padding
        problems.append(
            f"test.index lists {len(test)} ids but reaches node {int(test.max())}: the "
            f"{int(test.max()) + 1 - n_all - len(test)} ids it leaves out would become "
            f"featureless nodes (at most {len(test)}, as many as it lists, are allowed)"
        )
    if problems:
        raise DatasetError(f"dataset {name!r} in {folder} is inconsistent: {'; '.join(problems)}")

    # test rows go to the node ids test.index lists; unlisted ids in the range stay all-zero
    n = max(n_all + len(tx), int(test.max()) + 1 if len(test) else 0)
    feat = np.zeros((n, n_feat), dtype=np.float32)
    feat[:n_all], feat[test] = allx, tx
    onehot = np.zeros((n, n_classes), dtype=np.float32)
    onehot[:n_all], onehot[test] = ally, ty
    labels = onehot.argmax(1).astype(np.int64)
    unlabelled = int((onehot.sum(1) == 0).sum())
    if opts.normalize_features:
        rowsum = feat.sum(1, keepdims=True)
        np.divide(feat, rowsum, out=feat, where=rowsum != 0)

    src, dst, self_loops = _edges(obj["graph"], n, files["graph"])
    dgl = import_dgl()
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n)
    g.ndata[FEAT] = torch.from_numpy(feat)
    g.ndata[LABEL] = torch.from_numpy(labels)
    for key, index in (
        (TRAIN_MASK, np.arange(len(y))),
        (VAL_MASK, np.arange(len(y), len(y) + VAL_SIZE)),
        (TEST_MASK, test),
    ):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(index)] = True
        g.ndata[key] = mask
    info = {
        "source": "planetoid",
        "folder": str(folder),
        "nodes": n,
        "edges": len(src),
        "undirected_edges": len(src) // 2,
        "self_loop_entries_removed": self_loops,
        "unlabelled_nodes": unlabelled,
        "normalize_features": opts.normalize_features,
        "split": {"train": len(y), "val": VAL_SIZE, "test": len(test)},
    }
    return NodeDataset(name, g, n_classes, "accuracy", info).validate()


_SUMMARIES = {
    "cora": "Cora citation graph (2,708 nodes, 7 classes), Planetoid public split",
    "citeseer": "Citeseer citation graph (3,327 nodes, 6 classes), Planetoid public split",
    "pubmed": "Pubmed citation graph (19,717 nodes, 3 classes), Planetoid public split",
}
for _name in NAMES:
    DATASETS.add(
        _name,
        functools.partial(load_planetoid, _name),
        options=PlanetoidOptions,
        summary=_SUMMARIES[_name],
    )
