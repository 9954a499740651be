"""The one shape every dataset loader returns: a DGL graph with its task.

Loaders put features and labels into the graph's node data under fixed
keys, so the trainer and the plugins never care where a graph came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from qtrain.errors import DatasetError

FEAT, LABEL = "feat", "label"
TRAIN_MASK, VAL_MASK, TEST_MASK = "train_mask", "val_mask", "test_mask"
NTYPE, ETYPE = "ntype", "etype"  # a relational graph's node / edge type ids (int64)


def data_dir() -> Path:
    """Where on-disk datasets live: ``$QTRAIN_DATA_DIR`` or ``~/.cache/qtrain/datasets``."""
    env = os.environ.get("QTRAIN_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qtrain" / "datasets"


def memory_budget() -> int:
    """Bytes one dense array read from a file may take: half of this machine's memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 8 << 30


@dataclass(frozen=True)
class Relations:
    """The node and edge types of a relational (heterogeneous) graph.

    The graph itself stays one homogeneous DGL graph, whose ``ndata["ntype"]`` and
    ``edata["etype"]`` index ``ntypes`` and ``etypes``, with its edges grouped by edge
    type (sorted by ``etype``) and its nodes by node type (sorted by ``ntype``): the
    form DGL's ``RelGraphConv``, ``HGTConv`` and
    ``TypedLinear`` take, that typed kernels cut into one segment per relation, and that
    every homogeneous model can still train on. Labels and the train / val / test masks
    belong to the ``target`` node type only.
    """

    ntypes: tuple[str, ...]
    etypes: tuple[tuple[str, str, str], ...]  # canonical: (source type, relation, destination type)
    target: str

    @property
    def num_ntypes(self) -> int:
        return len(self.ntypes)

    @property
    def num_etypes(self) -> int:
        return len(self.etypes)

    @property
    def target_id(self) -> int:
        return self.ntypes.index(self.target)

    def problem(self) -> str | None:
        """What makes the type names inconsistent, or None."""
        if not self.ntypes or not self.etypes:
            return "a relational graph needs at least one node type and one edge type"
        if len(set(self.ntypes)) != len(self.ntypes):
            return f"node types repeat: {list(self.ntypes)}"
        if len(set(self.etypes)) != len(self.etypes):
            return "canonical edge types repeat"
        for src, rel, dst in self.etypes:
            if src not in self.ntypes or dst not in self.ntypes:
                return f"edge type ({src!r}, {rel!r}, {dst!r}) names a node type not in {list(self.ntypes)}"
        if self.target not in self.ntypes:
            return f"the target node type {self.target!r} is not one of {list(self.ntypes)}"
        return None


@dataclass
class NodeDataset:
    """A node-classification task on one graph.

    ``graph.ndata`` holds ``feat`` (float32, N x F), ``label`` (int64 N for
    single-label tasks, float32 N x C of 0/1 for multi-label ones) and the
    boolean ``train_mask`` / ``val_mask`` / ``test_mask``.
    """

    name: str
    graph: Any  # dgl.DGLGraph
    num_classes: int
    metric: Literal["accuracy", "micro_f1"] = "accuracy"
    info: dict[str, Any] | None = None  # provenance for the run log (files, seed, sizes)
    relations: Relations | None = None  # node / edge types, for relational graphs

    @property
    def multilabel(self) -> bool:
        return self.metric == "micro_f1"

    @property
    def num_features(self) -> int:
        return int(self.graph.ndata[FEAT].shape[1])

    def validate(self) -> NodeDataset:
        """Check the contract every loader promises; raise DatasetError naming the breach.

        Loaders call this last, so a trainer never meets a wrong dtype or a
        mask of the wrong length deep inside an epoch.
        """
        import torch

        g, where = self.graph, f"dataset {self.name!r}"
        ntypes = getattr(g, "ntypes", ["_N"])
        if len(ntypes) != 1 or len(getattr(g, "canonical_etypes", [None])) != 1:
            raise DatasetError(
                f"{where}: the graph must be homogeneous, it has node types {ntypes}"
            )
        n = int(g.num_nodes())
        missing = [k for k in (FEAT, LABEL, TRAIN_MASK, VAL_MASK, TEST_MASK) if k not in g.ndata]
        if missing:
            raise DatasetError(f"{where}: node data lacks {', '.join(missing)}")
        feat, label = g.ndata[FEAT], g.ndata[LABEL]
        if feat.dtype != torch.float32 or feat.dim() != 2 or feat.shape[0] != n:
            raise DatasetError(
                f"{where}: feat must be float32 [{n}, F], got {feat.dtype} {list(feat.shape)}"
            )
        if feat.shape[1] == 0:
            raise DatasetError(
                f"{where}: the nodes have no features (width 0); at least 1 is needed"
            )
        if not bool(torch.isfinite(feat).all()):
            raise DatasetError(f"{where}: the features hold NaN or infinite values")
        if self.multilabel:
            ok = label.dtype == torch.float32 and label.shape == (n, self.num_classes)
            expected = f"float32 [{n}, {self.num_classes}]"
        else:
            ok = label.dtype == torch.int64 and label.shape == (n,)
            expected = f"int64 [{n}]"
        if not ok:
            raise DatasetError(
                f"{where}: label must be {expected}, got {label.dtype} {list(label.shape)}"
            )
        for key in (TRAIN_MASK, VAL_MASK, TEST_MASK):
            mask = g.ndata[key]
            if mask.dtype != torch.bool or mask.shape != (n,):
                raise DatasetError(
                    f"{where}: {key} must be bool [{n}], got {mask.dtype} {list(mask.shape)}"
                )
        if self.relations is not None:
            self._validate_relations(where)
            on_target = g.ndata[NTYPE] == self.relations.target_id
        else:
            on_target = None
        if not self.multilabel and n:
            labelled = label if on_target is None else label[on_target]
            if len(labelled):
                low, high = int(labelled.min()), int(labelled.max())
                if low < 0 or high >= self.num_classes:
                    raise DatasetError(
                        f"{where}: labels span {low}..{high}, outside 0..{self.num_classes - 1}"
                    )
        return self

    def _validate_relations(self, where: str) -> None:
        """The type ids of a relational graph: in range, edges grouped by type, each edge's
        ends of the node types its edge type names, the task on the target type only."""
        import torch

        rel, g = self.relations, self.graph
        assert rel is not None
        problem = rel.problem()
        if problem is not None:
            raise DatasetError(f"{where}: {problem}")
        n, m = int(g.num_nodes()), int(g.num_edges())
        for key, data, count, size in (
            (NTYPE, g.ndata, rel.num_ntypes, n),
            (ETYPE, g.edata, rel.num_etypes, m),
        ):
            ids = data.get(key) if key in data else None
            if ids is None or ids.dtype != torch.int64 or ids.shape != (size,):
                got = "nothing" if ids is None else f"{ids.dtype} {list(ids.shape)}"
                raise DatasetError(f"{where}: {key} must be int64 [{size}], got {got}")
            if size and (int(ids.min()) < 0 or int(ids.max()) >= count):
                raise DatasetError(
                    f"{where}: {key} ids span {int(ids.min())}..{int(ids.max())}, "
                    f"outside 0..{count - 1}"
                )
        ntype, etype = g.ndata[NTYPE], g.edata[ETYPE]
        if m and not bool((etype[1:] >= etype[:-1]).all()):
            raise DatasetError(f"{where}: the edges must be grouped by edge type (sorted by etype)")
        if n and not bool((ntype[1:] >= ntype[:-1]).all()):
            raise DatasetError(f"{where}: the nodes must be grouped by node type (sorted by ntype)")
        if m:
            src, dst = g.edges()
            ends = torch.tensor(
                [[rel.ntypes.index(s), rel.ntypes.index(d)] for s, _, d in rel.etypes],
                dtype=torch.int64,
            )
            wrong = (ntype[src.long()] != ends[etype, 0]) | (ntype[dst.long()] != ends[etype, 1])
            if bool(wrong.any()):
                e = int(wrong.nonzero()[0])
                s, r, d = rel.etypes[int(etype[e])]
                raise DatasetError(
                    f"{where}: edge {e} has type ({s!r}, {r!r}, {d!r}) but joins a "
                    f"{rel.ntypes[int(ntype[src[e]])]!r} node to a "
                    f"{rel.ntypes[int(ntype[dst[e]])]!r} node"
                )
        off_target = ntype != rel.target_id
        for key in (TRAIN_MASK, VAL_MASK, TEST_MASK):
            if bool((g.ndata[key] & off_target).any()):
                raise DatasetError(
                    f"{where}: {key} selects nodes outside the target type {rel.target!r}"
                )


def typed_graph(hetero: Any, target: str) -> tuple[Any, Relations]:
    """A DGL heterograph's structure in the ``Relations`` form: one homogeneous graph, the
    nodes grouped by type in the heterograph's type order (type t's node i is node
    ``offset[t] + i``), the edges by relation, with ``ntype`` / ``etype`` ids. Node data is
    left to the caller (features, labels and masks differ by loader)."""
    import torch

    from qtrain._compat import import_dgl

    ntypes = list(hetero.ntypes)
    sizes = [int(hetero.num_nodes(t)) for t in ntypes]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    canonical = [tuple(c) for c in hetero.canonical_etypes]
    srcs, dsts, etypes = [], [], []
    for r, (s, rel, d) in enumerate(canonical):
        u, v = hetero.edges(etype=(s, rel, d))
        srcs.append(u.long() + offsets[ntypes.index(s)])
        dsts.append(v.long() + offsets[ntypes.index(d)])
        etypes.append(torch.full((len(u),), r, dtype=torch.int64))
    empty = torch.zeros(0, dtype=torch.int64)
    graph = import_dgl().graph(
        (torch.cat(srcs) if srcs else empty, torch.cat(dsts) if dsts else empty),
        num_nodes=offsets[-1],
    )
    graph.ndata[NTYPE] = torch.repeat_interleave(
        torch.arange(len(ntypes), dtype=torch.int64), torch.tensor(sizes, dtype=torch.int64)
    )
    graph.edata[ETYPE] = torch.cat(etypes) if etypes else empty
    return graph, Relations(tuple(ntypes), tuple(canonical), target)  # type: ignore[arg-type]


def fill_typed_node_data(
    graph: Any,
    relations: Relations,
    feats: Mapping[str, Any],
    label: Any,
    masks: Mapping[str, Any],
    where: str,
    field: str = FEAT,
) -> list[str]:
    """The node data of a ``typed_graph`` result, for loaders of relational datasets.

    ``feats`` maps node types to their features ([that type's size, F], one F for all);
    a type missing from it gets zero features, and the names of those types come back
    (for the caller's ``info`` and warning). ``label`` and ``masks`` (keyed ``TRAIN_MASK``,
    ``VAL_MASK``, ``TEST_MASK``) are the target type's, in its node order; elsewhere the
    label is 0 and the masks are false. ``where`` starts every error, and ``field`` names
    the features in them.
    """
    import torch

    ntypes = list(relations.ntypes)
    sizes = torch.bincount(graph.ndata[NTYPE], minlength=len(ntypes)).tolist()
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    for t, f in feats.items():
        size = sizes[ntypes.index(t)] if t in ntypes else -1
        if f.dim() != 2 or f.shape[0] != size or f.is_complex():
            raise DatasetError(
                f"{where}: the {field!r} features of node type {t!r} are "
                f"{str(f.dtype).replace('torch.', '')} {list(f.shape)}; expected numbers "
                f"[{size}, F]"
            )
    widths = {t: int(f.shape[1]) for t, f in feats.items()}
    if not widths:
        raise DatasetError(f"{where}: no node type has the feature field {field!r}")
    if len(set(widths.values())) > 1:
        raise DatasetError(
            f"{where}: the node types' {field!r} fields have different widths ({widths}); "
            "they must agree"
        )
    n, target = offsets[-1], relations.target_id
    lo, hi = offsets[target], offsets[target + 1]
    for what, value in ((LABEL, label), *masks.items()):
        if value.shape[:1] != (hi - lo,):
            raise DatasetError(
                f"{where}: the {what} of the target type {relations.target!r} has "
                f"{list(value.shape)[:1]} rows for its {hi - lo} nodes"
            )
    feat = torch.zeros(n, next(iter(widths.values())))
    for t, f in feats.items():
        i = ntypes.index(t)
        feat[offsets[i] : offsets[i + 1]] = f
    graph.ndata[FEAT] = feat
    graph.ndata[LABEL] = label.new_zeros((n, *label.shape[1:]))
    graph.ndata[LABEL][lo:hi] = label
    for key, mask in masks.items():
        graph.ndata[key] = torch.zeros(n, dtype=torch.bool)
        graph.ndata[key][lo:hi] = mask
    return [t for t in ntypes if t not in feats]


def index_mask(num_nodes: int, index: Any, what: str) -> Any:
    """A boolean mask of ``num_nodes`` with ``index`` set: splits come as index lists.

    ``index`` comes from a file, so its type, shape and range are checked here
    (``what`` names it in the error) before anything is written through it.
    """
    import torch

    try:
        index = torch.as_tensor(index)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DatasetError(f"{what} is not a list of node ids ({exc})") from None
    if (
        index.dim() != 1
        or index.dtype.is_floating_point
        or index.dtype.is_complex
        or index.dtype == torch.bool  # a mask where ids belong: 0/1 would become ids
    ):
        raise DatasetError(
            f"{what} must be a 1-D list of integer node ids, got {index.dtype} {list(index.shape)}"
        )
    index = index.to(torch.int64)
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= num_nodes):
        raise DatasetError(
            f"{what} holds node id {int(index.min()) if int(index.min()) < 0 else int(index.max())}, "
            f"outside 0..{num_nodes - 1}"
        )
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[index] = True
    return mask
