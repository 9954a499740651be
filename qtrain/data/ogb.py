"""The OGB node-property tasks (ogbn-*), read with the ``ogb`` package from a local folder.

qtrain never downloads: ogb's ``DglNodePropPredDataset`` would fetch a
missing dataset (after asking on standard input) and would ask to delete a
folder without the expected ``RELEASE_v*.txt``. Both would hang or surprise
a batch run, so every file ogb is about to look for is checked first, and a
missing one is a one-line error saying which folder was expected and how to
fill it. ogb's progress prints are sent to standard error (``--json`` keeps
standard output clean), and its import-time version check, a request to
PyPI from a background thread, is kept from starting.

No file is trusted: ogb runs in a forked child (a crash of DGL's reader on
a damaged processed file ends that child, not the run), each raw csv file
is checked as ogb reads it, the split is read here (weights-only for
``split_dict.pt``), and everything the child hands back is checked (edge
ids, lengths, labels, disjoint non-empty splits) before a graph is built.
qtrain records a CRC-32 beside ogb's processed file, which has none.

Per task:

* arxiv, papers100M: directed citations; ``to_bidirected`` (default true)
  adds reverse edges as DGL's examples do. papers100M's unlabelled nodes
  (NaN in ogb) get label 0 and are in no split.
* products: ogb already stores both directions.
* proteins: 112 binary tasks, so the label is float32 [N, 112] and the
  metric micro-F1 (OGB's own leaderboard metric is ROC-AUC). It has no node
  features; as in OGB's and DGL's examples, a node's feature is the mean of
  its 8 incoming edge features (edge features stay in ``edata['feat']``).
* mag: heterogeneous. By default this loads the paper nodes and
  paper-cites-paper edges only (OGB's homogeneous baselines do the same), with
  ``to_bidirected`` true by default. With ``relational = true`` it is a
  relational dataset (``qtrain.data.base.Relations``) of all four node types
  (author, field_of_study, institution, paper) and all four relations, the
  task on the papers; ``to_bidirected`` (default true) then adds, as DGL's
  RGCN examples do, a relation ``rev-<name>`` holding each relation's edges
  reversed (paper-cites-paper too: ``rev-cites`` keeps cited-by apart from
  cites), false keeps the stored directions only. Papers keep their features;
  the other types have none in OGB's files and get zeros (named in ``info``
  and a warning); through the reverse relations they receive their papers'
  features in a model's first layer. Other node and edge data (``year``,
  ``reltype``) is not kept. ``relational`` is refused for the homogeneous tasks.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import warnings
import zlib
from collections.abc import Callable, Iterator
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
    fill_typed_node_data,
    index_mask,
    typed_graph,
)
from qtrain.data.registry import DATASETS
from qtrain.errors import DatasetError


@dataclass(frozen=True)
class OgbOptions:
    """Where ogb's dataset folders are, whether to add reverse edges, and (ogbn-mag) whether
    to keep every node type and relation."""

    root: str = option(
        "",
        "folder holding ogb's dataset folders (ogbn_arxiv/, ogbn_products/, ...); "
        "empty = <data dir>/ogb, the data dir being $QTRAIN_DATA_DIR or ~/.cache/qtrain/datasets",
    )
    to_bidirected: bool = option(
        False,
        "add the reverse of every edge (duplicates merged, edge data dropped), as DGL's "
        "examples do for the directed citation graphs; with relational = true, a reverse "
        "relation rev-<name> per relation instead",
    )
    relational: bool = option(
        False,
        "ogbn-mag only: load all its node types and relations as a relational dataset "
        "classifying the papers (other types get zero features); false = papers and "
        "paper-cites-paper only",
    )


SPLITS = ("train", "valid", "test")
TARGET = "paper"  # mag's node type with labels and the split: the relational target


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
        "OGB MAG, paper nodes and paper-cites-paper edges (736,389 nodes, 349 classes), time "
        "split; relational = true: all 4 node types and relations",
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
    ids = f"{split}/paper" if meta["is hetero"] == "True" else split  # mag: the paper nodes' split
    return [[f"{split}/split_dict.pt", f"{ids}/{part}.csv.gz"] for part in SPLITS]


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


def _read_split(folder: Path, meta: dict[str, str]) -> dict[str, Any]:
    """The official split as node-id lists (validated later by ``_split_masks``).

    ``split_dict.pt`` is read weights-only (ogb's own reader would unpickle
    anything in it); the CSV files are read here rather than by ogb, which
    turns ``2.5`` into node 2 and keeps only the first column of a line.
    """
    import torch

    hetero = meta["is hetero"] == "True"
    base = folder / "split" / meta["split"]
    path = base / "split_dict.pt"
    if not path.is_file():
        return {p: _read_ids(base / "paper" if hetero else base, p) for p in SPLITS}
    try:
        split = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a refused global, or truncated / garbled bytes
        raise DatasetError(
            f"{path}: refusing to read this split file ({type(exc).__name__}: "
            f"{_first_line(exc, 160)}); it must hold a dict of index tensors: replace it with "
            "the original"
        ) from None
    if not isinstance(split, dict) or any(part not in split for part in SPLITS):
        raise DatasetError(f"{path}: expected a dict with the keys {', '.join(SPLITS)}")
    if hetero:  # one dict of index tensors per node type
        if not all(isinstance(split[p], dict) and "paper" in split[p] for p in SPLITS):
            raise DatasetError(f"{path}: expected each split to be a dict with the key 'paper'")
        return {p: split[p]["paper"] for p in SPLITS}
    return {p: split[p] for p in SPLITS}


def _read_ids(base: Path, part: str) -> Any:
    """The node ids in ``base/<part>.csv.gz``: one integer per line, nothing else."""
    import pandas as pd
    import torch

    path = base / f"{part}.csv.gz"
    try:
        frame = pd.read_csv(path, header=None)
    except pd.errors.EmptyDataError:
        raise DatasetError(
            f"{path} is empty; the official {part} split lists at least one node id"
        ) from None
    except Exception as exc:  # gzip / parser errors, bad bytes
        raise DatasetError(
            f"{path} could not be read ({type(exc).__name__}: {_first_line(exc, 160)}); "
            "replace it with the original"
        ) from None
    if frame.shape[1] != 1 or frame.dtypes.iloc[0] != "int64":
        kinds = ", ".join(sorted({str(t) for t in frame.dtypes}))
        raise DatasetError(
            f"{path} must hold one integer node id per line; it has {frame.shape[1]} "
            f"column(s) of {kinds}"
        )
    return torch.from_numpy(frame[0].to_numpy(dtype="int64", copy=True))


def _split_masks(n: int, split: dict[str, Any], name: str) -> dict[str, Any]:
    """The three split masks; every split non-empty, without repeats, and disjoint.

    An official split lists each node once and in one split only; a repeat
    or a node in two splits means a damaged file (and would let test nodes
    into training unnoticed).
    """
    import torch

    masks: dict[str, Any] = {}
    for part in SPLITS:
        what = f"dataset {name!r}: the {part} split"
        mask = index_mask(n, split[part], what)
        listed = len(torch.as_tensor(split[part]))
        if listed == 0:
            raise DatasetError(f"{what} is empty; it must list at least one node id")
        if int(mask.sum()) != listed:
            raise DatasetError(
                f"{what} lists {listed} node ids of which only {int(mask.sum())} are distinct; "
                "each node may appear once"
            )
        for other, seen in masks.items():
            both = torch.nonzero(mask & seen).flatten()
            if len(both):
                raise DatasetError(
                    f"{what} and the {other} split both hold node {int(both[0])}; the splits "
                    "must be disjoint"
                )
        masks[part] = mask
    return masks


def _labels(
    raw: Any, n: int, meta: dict[str, str], labelled: Any, where: str
) -> tuple[Any, int, int]:
    """(label tensor, number of classes, unlabelled nodes) from ogb's label tensor.

    Single-label tasks: integers [N] or [N, 1], or floats holding whole
    numbers with NaN for unlabelled nodes (papers100M), none of them inside
    a split; proteins: 0/1 [N, tasks]. Checked here because ogb converts
    floats with ``.long()``, which would turn a label of 2.5 into 2.
    """
    import torch

    if not isinstance(raw, torch.Tensor) or raw.is_complex() or raw.dtype == torch.bool:
        raise DatasetError(f"{where}: the labels are {_describe(raw)}; expected a numeric tensor")
    if meta["eval metric"] == "rocauc":  # proteins: one binary task per column
        tasks = int(meta["num tasks"])
        if raw.shape != (n, tasks) or not bool(((raw == 0) | (raw == 1)).all()):
            raise DatasetError(
                f"{where}: the labels are {_describe(raw)}; expected 0/1 values [{n}, {tasks}]"
            )
        return raw.float(), tasks, 0
    label = raw.reshape(-1) if raw.dim() == 2 and raw.shape[1] == 1 else raw
    if label.shape != (n,):
        raise DatasetError(f"{where}: the labels are {_describe(raw)}; expected [{n}] or [{n}, 1]")
    num_classes = int(meta["num classes"])
    unlabelled = (
        torch.isnan(label)
        if label.is_floating_point()
        else torch.zeros_like(label, dtype=torch.bool)
    )
    known = label[~unlabelled]
    if len(known) and (
        not bool((known == known.round()).all()) or known.min() < 0 or known.max() >= num_classes
    ):
        raise DatasetError(
            f"{where}: a label is not a class id in 0..{num_classes - 1} (values span "
            f"{float(known.min()):g}..{float(known.max()):g}, whole numbers only)"
        )
    inside = torch.nonzero(unlabelled & labelled).flatten()
    if len(inside):
        raise DatasetError(
            f"{where}: node {int(inside[0])} is in a split but has no label (NaN); only nodes "
            "outside the splits may be unlabelled"
        )
    label = torch.where(unlabelled, torch.zeros_like(label), label).long()
    return label, num_classes, int(unlabelled.sum())


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    return f"{str(getattr(value, 'dtype', '')).replace('torch.', '')} {list(shape)}"


def _first_line(exc: BaseException, limit: int) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else "no detail"


def _strict_read_csv(read_csv: Callable[..., Any], folder: Path) -> Callable[..., Any]:
    """``pandas.read_csv`` with the checks ogb leaves out, for the reading child.

    ogb casts ids with ``astype(int64)`` (2.5 becomes 2, NaN a huge negative
    id), takes the edges of a graph as the first ``num-edge-list`` lines of
    edge.csv whatever the file holds, and DGL accepts negative node ids. So
    each raw file is checked as it is read, before ogb uses (or caches) it.
    """
    import numpy as np

    edge_counts: dict[Path, dict[str, int]] = {}
    type_sizes: dict[str, int] = {}  # a heterograph's node counts, from num-node-dict

    def strict(path: Any, *args: Any, **kwargs: Any) -> Any:
        path = Path(path)
        rel = path.relative_to(folder) if path.is_relative_to(folder) else path

        def bad(problem: str) -> DatasetError:
            return DatasetError(
                f"is corrupt: {rel} {problem}; replace the folder with a fresh copy"
            )

        try:
            frame = read_csv(path, *args, **kwargs)
        except FileNotFoundError:
            raise  # ogb looks for optional files this way
        except Exception as exc:
            raise bad(
                f"could not be read ({type(exc).__name__}: {_first_line(exc, 160)})"
            ) from None
        ints = all(t == "int64" for t in frame.dtypes)
        name = path.name
        if name == "edge.csv.gz":
            if frame.shape[1] != 2 or not ints:
                raise bad("must hold two integer node ids per line")
            if len(frame) and int(frame.to_numpy().min()) < 0:
                raise bad("holds a negative node id; node ids are 0 and up")
            triplet = path.parent.name.split("___")  # a heterograph's relations/<s>___<r>___<d>/
            if path.parent.parent.name == "relations" and len(triplet) == 3 and len(frame):
                for column, ntype in ((0, triplet[0]), (1, triplet[2])):
                    top, size = int(frame.iloc[:, column].max()), type_sizes.get(ntype)
                    if size is not None and top >= size:
                        raise bad(
                            f"names {ntype} node {top}, but num-node-dict.csv.gz gives "
                            f"{ntype} {size} nodes (0..{size - 1})"
                        )
            edge_counts.setdefault(path.parent, {})["lines"] = len(frame)
        elif name in ("num-node-list.csv.gz", "num-edge-list.csv.gz", "num-node-dict.csv.gz"):
            wide = name == "num-node-dict.csv.gz"  # one column per node type
            if len(frame) != 1 or not ints or (frame.shape[1] != 1 and not wide):
                raise bad("must hold one count (a graph's size) per column")
            if int(frame.to_numpy().min()) < 0:
                raise bad("holds a negative count")
            if wide:
                type_sizes.update({str(t): int(frame[t].iloc[0]) for t in frame.columns})
            if name == "num-edge-list.csv.gz":
                edge_counts.setdefault(path.parent, {})["declared"] = int(frame.iloc[0, 0])
        elif name.startswith(("node-feat", "edge-feat", "node-label", "node_", "edge_")):
            if not all(t.kind in "if" for t in frame.dtypes):
                raise bad("must hold numbers only")
            if "feat" in name and not np.isfinite(frame.to_numpy()).all():
                raise bad("holds NaN or infinite values; features must be finite")
            if name.startswith("node-label"):
                values = frame.to_numpy(dtype=np.float64)
                known = values[~np.isnan(values)]
                if not np.isfinite(known).all() or not bool((known == np.round(known)).all()):
                    raise bad("holds a label that is not a whole number")
        counts = edge_counts.get(path.parent, {})
        if len(counts) == 2 and counts["lines"] != counts["declared"]:
            raise bad(
                f"does not match: num-edge-list.csv.gz says {counts['declared']} edges, "
                f"edge.csv.gz has {counts['lines']}"
            )
        return frame

    return strict


PROCESSED = "processed/dgl_data_processed"
# qtrain's record of the processed file's CRC-32: ogb's format has no checksum of its own
CHECKSUM = "processed/dgl_data_processed.crc32"


def _file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def _read_in_child(name: str, root: str, processed: bool, relational: bool, out: str) -> str | None:
    """ogb reads the dataset (in the child that ``run_reader`` forks); the homogeneous graph
    (mag: the paper nodes and paper-cites-paper edges) and the labels go to ``out``, or
    with ``relational`` (mag) every node type's size and features, every relation's edges
    and the papers' labels, in the form ``build_heterograph`` checks.

    A processed file is read by DGL's C++ reader, which trusts the lengths
    written in it: a crash kills this child only, and its memory is capped by
    the file's size. Its CRC-32 is recorded beside it (when ogb writes it,
    or at its first read), so that a changed byte is refused instead of
    loaded. Raw files go through ``_strict_read_csv``.
    """
    import pandas
    import torch

    from qtrain.data.dgl_reader import dgl_detail, limit_memory

    meta = _master(name)
    folder = check_files(name, Path(root))
    remedy = _remedy(folder, processed)
    checksum = folder / CHECKSUM
    crc: int | None = None
    if processed:
        crc = _file_crc(folder / PROCESSED)
        if checksum.is_file():
            with open(checksum) as f:
                recorded = f.read(32).strip()
            if recorded != str(crc):
                return (
                    f"is corrupt: it does not match the checksum qtrain recorded in "
                    f"{checksum.name} when it was written; {remedy}"
                )
        limit_memory(str(folder / PROCESSED))
    else:
        pandas.read_csv = _strict_read_csv(pandas.read_csv, folder)
    dataset_cls = import_ogb_dataset()
    try:
        with _stdout_to_stderr(), warnings.catch_warnings():
            # ogb hands pandas' read-only arrays to torch.from_numpy; the copy it makes next is fine
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            graph, labels = dataset_cls(name=name, root=root)[0]
    except DatasetError as exc:
        return str(exc)
    except MemoryError:
        return f"is corrupt: ogb asked for more memory than its files justify; {remedy}"
    except (Exception, SystemExit) as exc:
        return (
            f"is corrupt: ogb could not read it ({type(exc).__name__}: {dgl_detail(exc)}); {remedy}"
        )
    if crc is None or not checksum.exists():  # ogb has just written it, or a first read
        with contextlib.suppress(OSError):
            _record(checksum, crc if crc is not None else _file_crc(folder / PROCESSED))
    if meta["is hetero"] == "True" and relational:
        if not isinstance(labels, dict) or TARGET not in labels or TARGET not in graph.ntypes:
            return f"is corrupt: it has no {TARGET} nodes with labels; {remedy}"
        canonical = [tuple(c) for c in graph.canonical_etypes]
        torch.save(
            {
                "ntypes": len(graph.ntypes),
                "ntype_names": list(graph.ntypes),
                "etypes": len(canonical),
                "type_sizes": [int(graph.num_nodes(t)) for t in graph.ntypes],
                "canonical_etypes": canonical,
                "type_edges": [
                    tuple(ids.to(torch.int64) for ids in graph.edges(etype=c)) for c in canonical
                ],
                "type_ndata": {
                    t: {FEAT: graph.nodes[t].data[FEAT]}
                    for t in graph.ntypes
                    if FEAT in graph.nodes[t].data
                },
                "labels": labels[TARGET],
            },
            out,
        )
        return None
    if meta["is hetero"] == "True":
        cites = ("paper", "cites", "paper")
        if (
            not isinstance(labels, dict)
            or "paper" not in labels
            or cites not in graph.canonical_etypes
        ):
            return f"is corrupt: it has no paper-cites-paper relation with paper labels; {remedy}"
        src, dst = graph.edges(etype=cites)
        n, ndata, edata = graph.num_nodes("paper"), dict(graph.nodes["paper"].data), {}
        labels = labels["paper"]
    else:
        if len(graph.ntypes) != 1 or len(graph.canonical_etypes) != 1:
            return f"is corrupt: it holds a heterogeneous graph; {remedy}"
        src, dst = graph.edges()
        n, ndata, edata = graph.num_nodes(), dict(graph.ndata), dict(graph.edata)
    torch.save(
        {
            "ntypes": 1,
            "ntype_names": ["_N"],
            "etypes": 1,
            "num_nodes": int(n),
            "src": src.to(torch.int64),
            "dst": dst.to(torch.int64),
            "ndata": ndata,
            "edata": edata,
            "labels": labels,
        },
        out,
    )
    return None


def _record(checksum: Path, crc: int) -> None:
    """Write ``crc`` to ``checksum`` (atomically); a read-only folder just goes unrecorded."""
    tmp = checksum.with_name(f".{checksum.name}.{os.getpid()}")
    try:
        tmp.write_text(f"{crc}\n")
        os.replace(tmp, checksum)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _remedy(folder: Path, processed: bool) -> str:
    if processed:
        return (
            f"delete it ({folder / PROCESSED}) so that ogb rebuilds it "
            "from raw/, or replace the folder with a fresh copy"
        )
    return "replace the folder with a fresh copy"


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """ogb prints progress to standard output; keep it off (``--json`` owns stdout)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def load_ogb(name: str, opts: OgbOptions) -> NodeDataset:
    """Read ``name`` from ``opts.root`` through ogb; see the module docstring for what each task becomes.

    ogb runs in a child process (``qtrain.data.dgl_reader.run_reader``); what
    it hands back is checked here (edge ids, lengths, labels, the split)
    before a graph is built from it.
    """
    import torch

    from qtrain._compat import import_dgl
    from qtrain.data.dgl_reader import build_graph, run_reader

    root = Path(opts.root).expanduser() if opts.root else data_dir() / "ogb"
    meta = _master(name)
    if opts.relational and meta["is hetero"] != "True":
        raise DatasetError(
            f"dataset {name!r}: relational = true needs a heterogeneous dataset (ogbn-mag), "
            f"but {name} has one node type and one edge type; leave relational false"
        )
    folder = check_files(name, root)
    processed = (folder / PROCESSED).is_file()
    source = folder / PROCESSED if processed else folder
    where, remedy = f"dataset {name!r}: {source}", _remedy(folder, processed)
    contents = run_reader(
        _read_in_child,
        (name, str(root), processed, opts.relational),
        where,
        "ogb's reader",
        remedy,
    )
    if opts.relational:
        return _load_relational(name, contents, opts, folder, meta, where, remedy)
    labels = contents.pop("labels")
    n = int(contents["num_nodes"])
    if tuple(getattr(labels, "shape", ()))[:1] != (n,):  # before anything is sized by n
        raise DatasetError(
            f"{where} is corrupt: {_describe(labels)} labels for {n} nodes; {remedy}"
        )
    try:
        g = build_graph(contents, where)
    except DatasetError as exc:
        raise DatasetError(f"{exc}; {remedy}") from None
    dgl = import_dgl()
    masks = _split_masks(n, _read_split(folder, meta), name)
    labelled = masks["train"] | masks["valid"] | masks["test"]
    try:
        label, num_classes, unlabelled = _labels(labels, n, meta, labelled, f"{where} is corrupt")
    except DatasetError as exc:
        raise DatasetError(f"{exc}; {remedy}") from None

    info: dict[str, Any] = {
        "source": "ogb",
        "folder": str(folder),
        "ogb_metric": meta["eval metric"],
    }
    if meta["is hetero"] == "True":
        info["node_type"] = "paper (other node types and relations dropped)"
    if unlabelled:
        info["unlabelled_nodes"] = unlabelled
    metric = "micro_f1" if meta["eval metric"] == "rocauc" else "accuracy"
    if name == "ogbn-proteins":
        # proteins: 112 binary tasks -> multi-label; node features from incoming edge features
        efeat = g.edata.get("feat")
        if efeat is None or efeat.dim() != 2 or efeat.is_complex():
            raise DatasetError(f"{where} is corrupt: no edge features [E, k]; {remedy}")
        efeat = efeat.float()
        _, dst = g.edges()
        total = torch.zeros(n, efeat.shape[1]).index_add_(0, dst, efeat)
        g.ndata[FEAT] = total / g.in_degrees().clamp(min=1).unsqueeze(1).float()
    feat = g.ndata.get(FEAT)
    if feat is None or feat.dim() != 2 or feat.is_complex():
        raise DatasetError(
            f"{where} is corrupt: the node features are {_describe(feat)}, expected numbers "
            f"[{n}, F]; {remedy}"
        )
    if not bool(torch.isfinite(feat).all()):
        raise DatasetError(
            f"{where} is corrupt: a node feature is NaN or infinite (finite numbers only); {remedy}"
        )
    g.ndata[FEAT] = feat.float()
    if opts.to_bidirected:
        g = dgl.to_bidirected(g, copy_ndata=True)
    g.ndata[LABEL] = label
    g.ndata[TRAIN_MASK], g.ndata[VAL_MASK], g.ndata[TEST_MASK] = (
        masks["train"],
        masks["valid"],
        masks["test"],
    )
    info.update(
        nodes=n,
        edges=int(g.num_edges()),
        to_bidirected=opts.to_bidirected,
        split={"name": meta["split"], **{k: int(v.sum()) for k, v in masks.items()}},
    )
    return NodeDataset(name, g, num_classes, metric, info).validate()  # type: ignore[arg-type]


def _load_relational(
    name: str,
    contents: dict[str, Any],
    opts: OgbOptions,
    folder: Path,
    meta: dict[str, str],
    where: str,
    remedy: str,
) -> NodeDataset:
    """mag as a relational dataset, from what the child handed back: the sizes, relations
    and features checked (``build_heterograph``), reverse relations added with
    ``to_bidirected``, then the ``Relations`` form (``typed_graph``), the task on papers."""
    import torch

    from qtrain.data.dgl_reader import build_heterograph

    labels = contents.pop("labels")
    names, sizes = list(contents["ntype_names"]), list(contents["type_sizes"])
    if TARGET not in names or len(names) != len(sizes):
        raise DatasetError(f"{where} is corrupt: it has no {TARGET!r} node type; {remedy}")
    n = int(sizes[names.index(TARGET)])
    if tuple(getattr(labels, "shape", ()))[:1] != (n,):  # before anything is sized by n
        raise DatasetError(
            f"{where} is corrupt: {_describe(labels)} labels for {n} papers; {remedy}"
        )
    if opts.to_bidirected:
        contents = _with_reverse_relations(contents, where, remedy)
    try:
        hetero = build_heterograph(contents, where)
    except DatasetError as exc:
        raise DatasetError(f"{exc}; {remedy}") from None
    feats = {}
    for t in hetero.ntypes:
        if FEAT not in hetero.nodes[t].data:
            continue
        feat = hetero.nodes[t].data[FEAT]
        if feat.dim() != 2 or feat.is_complex() or feat.dtype == torch.bool:
            raise DatasetError(
                f"{where} is corrupt: the {t!r} features are {_describe(feat)}, expected "
                f"numbers [{hetero.num_nodes(t)}, F]; {remedy}"
            )
        if not bool(torch.isfinite(feat).all()):
            raise DatasetError(
                f"{where} is corrupt: a {t!r} feature is NaN or infinite (finite numbers "
                f"only); {remedy}"
            )
        feats[t] = feat.float()
    if TARGET not in feats:
        raise DatasetError(f"{where} is corrupt: the papers have no features; {remedy}")
    masks = _split_masks(n, _read_split(folder, meta), name)
    labelled = masks["train"] | masks["valid"] | masks["test"]
    try:
        label, num_classes, unlabelled = _labels(labels, n, meta, labelled, f"{where} is corrupt")
    except DatasetError as exc:
        raise DatasetError(f"{exc}; {remedy}") from None
    g, relations = typed_graph(hetero, TARGET)
    split = {TRAIN_MASK: masks["train"], VAL_MASK: masks["valid"], TEST_MASK: masks["test"]}
    try:
        featureless = fill_typed_node_data(g, relations, feats, label, split, where)
    except DatasetError as exc:
        raise DatasetError(f"{exc}; {remedy}") from None
    if featureless:
        warnings.warn(
            f"dataset {name!r}: node types {featureless} have no features in ogb's files; "
            "their features are zeros",
            stacklevel=3,
        )
    info: dict[str, Any] = {
        "source": "ogb",
        "folder": str(folder),
        "ogb_metric": meta["eval metric"],
        "target": TARGET,
        "nodes": int(g.num_nodes()),
        "edges": int(g.num_edges()),
        "nodes_per_type": {t: int(hetero.num_nodes(t)) for t in hetero.ntypes},
        "edges_per_relation": {
            "/".join(c): int(hetero.num_edges(c)) for c in hetero.canonical_etypes
        },
        "featureless_ntypes": featureless,
        "to_bidirected": opts.to_bidirected,
        "split": {"name": meta["split"], **{k: int(v.sum()) for k, v in masks.items()}},
    }
    if unlabelled:
        info["unlabelled_nodes"] = unlabelled
    return NodeDataset(name, g, num_classes, "accuracy", info, relations).validate()


def _with_reverse_relations(contents: dict[str, Any], where: str, remedy: str) -> dict[str, Any]:
    """``contents`` with a relation ``(dst, rev-<name>, src)`` per relation, holding its edges
    reversed (edge for edge), as DGL's RGCN examples prepare ogbn-mag."""
    canonical, edges = list(contents["canonical_etypes"]), list(contents["type_edges"])
    if len(canonical) != len(edges):
        raise DatasetError(f"{where} is corrupt: its relations and edge lists disagree; {remedy}")
    taken = {tuple(c) for c in canonical}
    for (s, r, d), (src, dst) in zip(list(canonical), list(edges), strict=True):
        reverse = (d, f"rev-{r}", s)
        if reverse in taken:
            raise DatasetError(
                f"{where}: relation {reverse} is stored already, so the reverse of {r!r} "
                "cannot take its name; set to_bidirected = false"
            )
        taken.add(reverse)
        canonical.append(reverse)
        edges.append((dst, src))
    return {**contents, "canonical_etypes": canonical, "type_edges": edges}


for _name, _task in TASKS.items():
    DATASETS.add(
        _name,
        functools.partial(load_ogb, _name),
        options=OgbOptions,
        summary=_task.summary,
        defaults={"to_bidirected": _task.to_bidirected},
    )
