"""Seeded synthetic relational graphs: several node and edge types, shaped like Hector's datasets.

Why this model: a relational model (RGCN, RGAT, HGT) earns its per-relation weights
only where relations carry different information, so the task must be one where a
model that mixes every relation with one weight does worse. The generator:

* splits the nodes into ``node_types`` types of skewed sizes (type 0, the target,
  the largest), node ids grouped by type;
* gives every node a latent class (uniform) and a power-law degree weight;
* makes ``edge_types`` relations, in pairs of a relation and its inverse (every edge
  reversed, as DGL and OGB preprocess their datasets) unless ``inverse_edges`` is
  off; each forward relation joins a source type to a destination type (the first
  one ends at the target type, so messages reach it), and relations get skewed
  shares of the edges, as real knowledge graphs have a few large relations and many
  small ones;
* draws a relation's edges by picking the destination in proportion to the weights,
  then the source among the source type's nodes of the class the relation pairs
  with the destination's (probability ``homophily``) or of any class, in
  proportion to the weights; each relation pairs classes by its own permutation
  (a paper of field c cites field c but is hosted by venues of some other class),
  so a neighbour's class tells the destination's only through its relation;
  duplicates and self-loops are dropped and more drawn until the relation's count
  is exact;
* gives features a centroid per (node type, class), drawn independently for every
  type, plus Gaussian noise: the target type's own centroids are weak
  (``target_signal``), its neighbours' strong (``feature_signal``), and a
  neighbour's class is legible only through its own type's centroids.

Labels are the target nodes' classes; the other nodes' labels are 0 and no mask
selects them. The result follows ``qtrain.data.base.Relations``' contract: one
homogeneous DGL graph, nodes grouped by type, edges by relation (then by
destination and source). Everything is NumPy from one Generator per stage seeded
from ``seed``, in integers where it samples, so the result does not depend on the
machine.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qtrain.config import option
from qtrain.data.base import (
    ETYPE,
    FEAT,
    LABEL,
    NTYPE,
    TEST_MASK,
    TRAIN_MASK,
    VAL_MASK,
    NodeDataset,
    Relations,
    data_dir,
)
from qtrain.data.cache import load_arrays, options_hash, save_arrays
from qtrain.data.registry import DATASETS
from qtrain.data.synthetic import (
    EDGE_CHUNK,
    FEAT_CHUNK,
    MAX_ROUNDS,
    discard_cache,
    node_weights,
    unique_sorted,
)
from qtrain.errors import DatasetError

# Bump when the generator changes what a given option set produces (cache folders key on it).
GENERATOR_VERSION = 1
TYPE_SKEW = 0.8  # node type t gets a share proportional to 1 / (t + 1) ** TYPE_SKEW
RELATION_SKEW = 1.0  # forward relation i gets a share proportional to 1 / (i + 1) ** RELATION_SKEW
MAX_FILL = 0.25  # a relation holds at most this fraction of its (source, destination) pairs


@dataclass(frozen=True)
class SyntheticHeteroOptions:
    """Knobs of the relational generator; every preset is these with other defaults."""

    nodes: int = option(10_000, "number of nodes, all types together", min=1)
    node_types: int = option(
        4, "number of node types; type 0 ('target') is the one whose nodes are classified", min=1
    )
    edges: int = option(
        100_000,
        "number of directed edges, all relations together, inverse edges included (rounded "
        "down to even when every relation has an inverse)",
        min=1,
    )
    edge_types: int = option(8, "number of relations (edge types), inverses included", min=1)
    inverse_edges: bool = option(
        True,
        "relations come in pairs, r and r-inv with every edge reversed (DGL's and OGB's "
        "preprocessing); an odd edge_types leaves the last relation without an inverse",
    )
    features: int = option(64, "feature dimension (every node type has features)", min=1)
    classes: int = option(8, "number of classes of the target nodes", min=2)
    homophily: float = option(
        0.7,
        "probability that an edge's source is drawn from its destination's class (else "
        "from any class); 1/classes = structure carries no label information",
        min=0.0,
        max=1.0,
    )
    feature_signal: float = option(
        2.0,
        "norm of the (node type, class) centroids of the non-target types' features, in "
        "units of the per-dimension noise (std 1)",
        min=0.0,
    )
    target_signal: float = option(
        0.5,
        "norm of the target type's own class centroids: weak, so that a model has to read "
        "the neighbours",
        min=0.0,
    )
    power_law_exponent: float = option(
        2.5,
        "tail exponent of the degree weights (as in the synthetic generator)",
        min=2.05,
        max=50.0,
    )
    train_fraction: float = option(
        0.5, "fraction of the target nodes (random) in train_mask", min=0.0, max=1.0
    )
    val_fraction: float = option(
        0.2, "fraction of the target nodes in val_mask; the rest is test_mask", min=0.0, max=1.0
    )
    scale: float = option(
        1.0,
        "multiply nodes and edges by this (types and proportions stay): a large preset's "
        "shape at a size a small machine trains",
        min=1e-6,
        max=1.0,
    )
    seed: int = option(0, "seed: the same seed and options give the same dataset anywhere", min=0)
    cache: bool = option(
        False,
        "keep the generated dataset under <data dir>/synthetic/<name>-<hash of the options>/ "
        "and read it from there next time",
    )

    @property
    def total_nodes(self) -> int:
        return max(1, round(self.nodes * self.scale))

    @property
    def paired(self) -> int:
        """Relations with an inverse (each pair is two edge types)."""
        return self.edge_types // 2 if self.inverse_edges else 0

    @property
    def total_edges(self) -> int:
        """The exact number of directed edges placed."""
        edges = max(1, round(self.edges * self.scale))
        if self.paired and 2 * self.paired == self.edge_types:
            edges -= edges % 2  # every edge has its reverse
        return edges

    def validate(self) -> None:
        """Reject option sets that cannot be generated (raised as one-line errors)."""
        n = self.total_nodes
        if self.node_types > n:
            raise ValueError(
                f"node_types = {self.node_types} exceeds the {n} nodes (nodes x scale); "
                "every type needs a node"
            )
        if self.total_edges < self.edge_types:
            raise ValueError(
                f"edges = {self.total_edges} (x scale) is fewer than edge_types = "
                f"{self.edge_types}; every relation needs an edge"
            )
        if self.train_fraction + self.val_fraction >= 1.0:
            raise ValueError(
                f"train_fraction + val_fraction = {self.train_fraction + self.val_fraction:g} "
                "must be below 1 (the rest of the target nodes is the test set)"
            )
        target = type_sizes(n, self.node_types)[0]
        if int(self.train_fraction * target) < 1:
            raise ValueError(
                f"train_fraction = {self.train_fraction:g} of the {target} target nodes leaves "
                "no training node"
            )
        if n >= 2**31:
            raise ValueError(f"nodes = {n} is too large; allowed: below 2^31")


# Hector's Table 3 (counts after DGL / OGB preprocessing, inverse edges included)
HECTOR_SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    # name: (nodes, node types, edges, edge types, classes)
    "aifb": (7_300, 7, 49_000, 104, 4),
    "mutag": (27_000, 5, 148_000, 50, 2),
    "bgs": (95_000, 27, 673_000, 122, 2),
    "biokg": (94_000, 5, 4_800_000, 51, 8),
    "am": (1_900_000, 7, 5_700_000, 108, 11),
    "mag": (1_900_000, 4, 21_000_000, 4, 349),
    "fb15k": (15_000, 1, 620_000, 474, 8),
    "wikikg2": (2_500_000, 1, 16_000_000, 535, 8),
}

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "synthetic-hetero": (
        "seeded relational graph: typed nodes and relations, classes on the target type",
        {},
    ),
    "synthetic-hetero-small": (
        "small relational graph (3,000 nodes, 3 node types, 8 relations) that trains in seconds",
        {"nodes": 3_000, "node_types": 3, "edges": 24_000, "edge_types": 8, "classes": 4},
    ),
    **{
        f"synthetic-{name}": (
            f"relational graph shaped like {name} in Hector's Table 3: {nodes:,} nodes "
            f"({ntypes} types), {edges:,} edges ({etypes} types), {classes} classes",
            {
                "nodes": nodes,
                "node_types": ntypes,
                "edges": edges,
                "edge_types": etypes,
                "classes": classes,
                "cache": edges >= 1_000_000,
            },
        )
        for name, (nodes, ntypes, edges, etypes, classes) in HECTOR_SHAPES.items()
    },
}


# --------------------------------------------------------------------------- structure


def type_sizes(n: int, types: int) -> np.ndarray:
    """Node counts per type: skewed shares of ``n``, each at least 1, type 0 the largest."""
    share = 1.0 / np.arange(1, types + 1) ** TYPE_SKEW
    sizes = np.maximum(1, np.floor(n * share / share.sum()).astype(np.int64))
    sizes[0] += n - int(sizes.sum())
    return sizes


@dataclass(frozen=True)
class Relation:
    """One edge type: its ends, its edge count, and the forward relation it reverses."""

    name: str
    src: int
    dst: int
    count: int
    inverse_of: int | None = None  # index of the relation whose edges this one reverses


def relations(
    opts: SyntheticHeteroOptions, sizes: np.ndarray, rng: np.random.Generator
) -> list[Relation]:
    """The edge types in id order (``r0, r0-inv, r1, r1-inv, ...``) with exact edge counts."""
    types = len(sizes)
    forward = opts.paired + (opts.edge_types - 2 * opts.paired)
    ends = []
    for i in range(forward):
        # larger types take part in more relations; the first relation ends at the target
        p = sizes / sizes.sum()
        dst = 0 if i == 0 else int(rng.choice(types, p=p))
        src = int(rng.choice(types, p=p))
        ends.append((src, dst))
    copies = [2 if i < opts.paired else 1 for i in range(forward)]  # edges each forward one makes
    capacity = np.array(
        [max(1, int(MAX_FILL * sizes[s] * (sizes[d] - (s == d)))) for s, d in ends], dtype=np.int64
    )
    share = 1.0 / np.arange(1, forward + 1) ** RELATION_SKEW
    share = share[rng.permutation(forward)]
    counts = _allot(opts.total_edges, np.array(copies), share, capacity, forward)
    out: list[Relation] = []
    for i, ((src, dst), count) in enumerate(zip(ends, counts, strict=True)):
        out.append(Relation(f"r{i}", src, dst, int(count)))
        if copies[i] == 2:
            out.append(Relation(f"r{i}-inv", dst, src, int(count), inverse_of=len(out) - 1))
    return out


def _allot(
    total: int, copies: np.ndarray, share: np.ndarray, capacity: np.ndarray, forward: int
) -> np.ndarray:
    """Forward edge counts, one or more each, in proportion to ``share`` and within
    ``capacity``, whose edges (``count * copies``) add up to exactly ``total``."""
    if int((copies * capacity).sum()) < total:
        raise DatasetError(
            f"{total} edges do not fit the relations' node types (at most "
            f"{int((copies * capacity).sum())} at {MAX_FILL:.0%} of each relation's node "
            "pairs); use fewer edges or more nodes"
        )
    counts = np.ones(forward, dtype=np.int64)
    left = total - int((copies * counts).sum())
    open_ = counts < capacity
    while left > 0 and open_.any():
        weights = np.where(open_, share, 0.0)
        add = np.floor(left / copies * weights / weights.sum()).astype(np.int64)
        add = np.minimum(add, capacity - counts)
        if not add.any():  # rounding left a few edges: one at a time, largest share first
            for i in np.argsort(-weights, kind="stable"):
                if open_[i] and copies[i] <= left:
                    add[i] = 1
                    break
            else:
                break
        counts += add
        left -= int((copies * add).sum())
        open_ = counts < capacity
    if left:
        raise DatasetError(f"could not share {total} edges out among the relations exactly")
    return counts


@dataclass(frozen=True)
class _TypeIndex:
    """One node type's nodes as a relation's sampler reads them, built once per type (a
    graph shaped like wikikg2 has 535 relations over its one type)."""

    nodes: np.ndarray  # the type's node ids
    cum: np.ndarray  # cumulative degree weights of ``nodes``
    by_class: np.ndarray  # the type's node ids sorted by class
    class_cum: np.ndarray  # cumulative degree weights of ``by_class``
    class_lo: np.ndarray  # class c's slice of ``by_class``: [class_lo[c], class_hi[c])
    class_hi: np.ndarray

    @classmethod
    def of(
        cls, nodes: np.ndarray, labels: np.ndarray, weights: np.ndarray, classes: int
    ) -> _TypeIndex:
        by_class = nodes[np.argsort(labels[nodes], kind="stable")]
        sorted_classes = labels[by_class]
        return cls(
            nodes=nodes,
            cum=np.cumsum(weights[nodes]),
            by_class=by_class,
            class_cum=np.cumsum(weights[by_class]),
            class_lo=np.searchsorted(sorted_classes, np.arange(classes), side="left"),
            class_hi=np.searchsorted(sorted_classes, np.arange(classes), side="right"),
        )


class _RelationSampler:
    """Draws one relation's edges as keys ``src * n + dst`` (self-loops come back as -1)."""

    def __init__(
        self,
        src: _TypeIndex,
        dst: _TypeIndex,
        labels: np.ndarray,
        homophily: float,
        n: int,
        pairing: np.ndarray,
    ) -> None:
        self.n, self.homophily = n, homophily
        self.pairing = pairing  # destination class -> the source class it draws from
        self.dst_nodes, self.dst_cum = dst.nodes, dst.cum
        self.src_sorted, self.src_cum = src.by_class, src.class_cum
        self.class_lo, self.class_hi = src.class_lo, src.class_hi
        self.labels = labels

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        keys = np.empty(count, dtype=np.int64)
        for start in range(0, count, EDGE_CHUNK):
            keys[start : start + EDGE_CHUNK] = self._chunk(rng, min(EDGE_CHUNK, count - start))
        return keys

    def _chunk(self, rng: np.random.Generator, k: int) -> np.ndarray:
        v = self.dst_nodes[
            np.searchsorted(self.dst_cum, rng.integers(0, self.dst_cum[-1], size=k), side="right")
        ]
        c = self.pairing[self.labels[v]]
        lo, hi = self.class_lo[c], self.class_hi[c]
        same = (rng.random(k) < self.homophily) & (hi > lo)
        # a point in the cumulative weights: the class's slice of them, or all of them
        base = np.where(same & (lo > 0), self.src_cum[np.maximum(lo - 1, 0)], 0)
        top = np.where(same, self.src_cum[np.maximum(hi - 1, 0)], self.src_cum[-1])
        point = rng.integers(base, top)  # integers: the same draws on every machine
        u = self.src_sorted[
            np.minimum(np.searchsorted(self.src_cum, point, side="right"), len(self.src_cum) - 1)
        ]
        key = u.astype(np.int64) * self.n + v
        key[u == v] = -1
        return key


def _relation_edges(
    rng: np.random.Generator, sampler: _RelationSampler, target: int, name: str
) -> np.ndarray:
    """Exactly ``target`` distinct keys: draw, dedupe, top up, trim (as synthetic's edges)."""
    keys = unique_sorted(sampler.draw(rng, target))
    drawn = target
    for _ in range(MAX_ROUNDS):
        if len(keys) >= target:
            break
        need = target - len(keys)
        count = int(need / max(len(keys) / drawn, 0.02) * 1.1) + 64
        keys = unique_sorted(np.concatenate([keys, sampler.draw(rng, count)]))
        drawn += count
    else:
        raise DatasetError(
            f"dataset {name!r}: could place only {len(keys)} of {target} distinct edges in a "
            "relation; use fewer edges or more nodes"
        )
    if len(keys) > target:
        keys = np.delete(keys, rng.choice(len(keys), size=len(keys) - target, replace=False))
    return keys


# --------------------------------------------------------------------------- generation


def generate(opts: SyntheticHeteroOptions, name: str = "synthetic-hetero") -> dict[str, np.ndarray]:
    """The dataset as plain arrays (what the cache stores)."""
    n = opts.total_nodes
    type_seq, node_seq, edge_seq, feat_seq, split_seq = np.random.SeedSequence(opts.seed).spawn(5)
    sizes = type_sizes(n, opts.node_types)
    rels = relations(opts, sizes, np.random.default_rng(type_seq))
    ntype = np.repeat(np.arange(opts.node_types, dtype=np.int64), sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)])

    rng = np.random.default_rng(node_seq)
    labels = rng.integers(0, opts.classes, size=n, dtype=np.int64)
    weights = node_weights(rng, n, opts.total_edges / n, opts.power_law_exponent)

    type_index = [
        _TypeIndex.of(np.arange(starts[t], starts[t + 1]), labels, weights, opts.classes)
        for t in range(opts.node_types)
    ]
    rng = np.random.default_rng(edge_seq)
    srcs, dsts, etypes = [], [], []
    forward_keys: dict[int, np.ndarray] = {}
    for r, rel in enumerate(rels):
        if rel.inverse_of is not None:
            keys = forward_keys.pop(rel.inverse_of)
            u, v = keys % n, keys // n  # reversed
        else:
            pairing = rng.permutation(opts.classes)
            sampler = _RelationSampler(
                type_index[rel.src], type_index[rel.dst], labels, opts.homophily, n, pairing
            )
            keys = _relation_edges(rng, sampler, rel.count, name)
            if r + 1 < len(rels) and rels[r + 1].inverse_of == r:
                forward_keys[r] = keys
            u, v = keys // n, keys % n
        order = np.lexsort((u, v))  # by destination, then source
        srcs.append(u[order])
        dsts.append(v[order])
        etypes.append(np.full(len(u), r, dtype=np.int64))
    index = np.int32 if n < 2**31 else np.int64
    src = np.concatenate(srcs).astype(index)
    dst = np.concatenate(dsts).astype(index)
    etype = np.concatenate(etypes)
    del srcs, dsts, etypes

    rng = np.random.default_rng(feat_seq)
    centroids = rng.standard_normal((opts.node_types, opts.classes, opts.features))
    norms = np.full(opts.node_types, opts.feature_signal)
    norms[0] = opts.target_signal
    centroids *= (norms / math.sqrt(opts.features))[:, None, None]
    feat = np.empty((n, opts.features), dtype=np.float32)
    for start in range(0, n, FEAT_CHUNK):
        stop = min(start + FEAT_CHUNK, n)
        rng.standard_normal(out=feat[start:stop], dtype=np.float32)
        feat[start:stop] += centroids[ntype[start:stop], labels[start:stop]].astype(np.float32)

    target = int(sizes[0])  # node ids 0 .. target - 1
    perm = np.random.default_rng(split_seq).permutation(target)
    n_train, n_val = int(opts.train_fraction * target), int(opts.val_fraction * target)
    masks = {}
    for key, part in (
        (TRAIN_MASK, perm[:n_train]),
        (VAL_MASK, perm[n_train : n_train + n_val]),
        (TEST_MASK, perm[n_train + n_val :]),
    ):
        masks[key] = np.zeros(n, dtype=bool)
        masks[key][part] = True
    label = np.where(ntype == 0, labels, 0)
    return {
        "src": src,
        "dst": dst,
        ETYPE: etype,
        NTYPE: ntype,
        FEAT: feat,
        LABEL: label,
        **masks,
    }


def relation_names(opts: SyntheticHeteroOptions) -> Relations:
    """The type names of a generated graph (what ``generate``'s ids index)."""
    sizes = type_sizes(opts.total_nodes, opts.node_types)
    type_seq = np.random.SeedSequence(opts.seed).spawn(5)[0]
    rels = relations(opts, sizes, np.random.default_rng(type_seq))
    ntypes = ("target", *(f"type{t}" for t in range(1, opts.node_types)))
    return Relations(
        ntypes=ntypes,
        etypes=tuple((ntypes[r.src], r.name, ntypes[r.dst]) for r in rels),
        target="target",
    )


def _graph(arrays: dict[str, np.ndarray], n: int) -> Any:
    import torch

    from qtrain._compat import import_dgl

    dgl = import_dgl()
    src = torch.from_numpy(arrays.pop("src").astype(np.int64))
    dst = torch.from_numpy(arrays.pop("dst").astype(np.int64))
    g = dgl.graph((src, dst), num_nodes=n)
    del src, dst
    g.edata[ETYPE] = torch.from_numpy(arrays[ETYPE])
    for key in (NTYPE, FEAT, LABEL, TRAIN_MASK, VAL_MASK, TEST_MASK):
        g.ndata[key] = torch.from_numpy(arrays[key])
    return g


def cache_folder(opts: SyntheticHeteroOptions, name: str) -> Path:
    return data_dir() / "synthetic" / f"{name}-{options_hash(_identity(opts))}"


def _identity(opts: SyntheticHeteroOptions) -> dict[str, Any]:
    fields = dataclasses.asdict(opts)
    fields.pop("cache")
    return {"generator": f"hetero-{GENERATOR_VERSION}", **fields}


def _cache_problem(
    arrays: dict[str, np.ndarray], meta: dict[str, Any], opts: SyntheticHeteroOptions
) -> str | None:
    """What makes cached ``arrays`` differ in shape or kind from what ``generate(opts)``
    returns, or None; the dataset contract's invariants are checked by ``validate``."""
    if meta.get("identity") != _identity(opts):
        return "it was made with other options"
    n, m = opts.total_nodes, opts.total_edges
    index = np.dtype(np.int32 if n < 2**31 else np.int64)
    expected = {
        "src": ((m,), index),
        "dst": ((m,), index),
        ETYPE: ((m,), np.dtype(np.int64)),
        NTYPE: ((n,), np.dtype(np.int64)),
        FEAT: ((n, opts.features), np.dtype(np.float32)),
        LABEL: ((n,), np.dtype(np.int64)),
        **{key: ((n,), np.dtype(bool)) for key in (TRAIN_MASK, VAL_MASK, TEST_MASK)},
    }
    if set(arrays) != set(expected):
        return f"it holds the arrays {sorted(arrays)}, expected {sorted(expected)}"
    for key, (shape, dtype) in expected.items():
        if arrays[key].shape != shape or arrays[key].dtype != dtype:
            return f"{key} is {arrays[key].dtype} {list(arrays[key].shape)}, expected {dtype} {list(shape)}"
    src, dst = arrays["src"], arrays["dst"]
    if m and (min(int(src.min()), int(dst.min())) < 0 or max(int(src.max()), int(dst.max())) >= n):
        return f"an edge end is outside the node ids 0..{n - 1}"
    return None


def load_synthetic_hetero(
    opts: SyntheticHeteroOptions, name: str = "synthetic-hetero"
) -> NodeDataset:
    """Generate (or read from the cache) the relational dataset ``name`` described by ``opts``."""
    try:
        opts.validate()
    except ValueError as exc:
        raise DatasetError(f"dataset {name!r}: {exc}") from None
    folder = cache_folder(opts, name) if opts.cache else None
    started = time.perf_counter()
    arrays = None
    if folder is not None:
        try:
            cached = load_arrays(folder)
            if cached is not None:
                problem = _cache_problem(*cached, opts)
                if problem is None:
                    arrays = cached[0]
                else:
                    discard_cache(folder, f"the dataset cache {folder} is unusable ({problem})")
        except DatasetError as exc:
            discard_cache(folder, str(exc))
    from_cache = arrays is not None
    if arrays is None:
        arrays = generate(opts, name)
        if folder is not None:
            save_arrays(folder, arrays, {"name": name, "identity": _identity(opts)})
    rel = relation_names(opts)
    n = opts.total_nodes
    info = {
        "source": "synthetic-hetero",
        "seed": opts.seed,
        "options": _identity(opts),
        "nodes": n,
        "edges": len(arrays["src"]),
        "nodes_per_type": dict(
            zip(
                rel.ntypes,
                np.bincount(arrays[NTYPE], minlength=rel.num_ntypes).tolist(),
                strict=True,
            )
        ),
        "edges_per_type": dict(
            zip(
                (e[1] for e in rel.etypes),
                np.bincount(arrays[ETYPE], minlength=rel.num_etypes).tolist(),
                strict=True,
            )
        ),
        "cache": str(folder) if folder is not None else None,
        "from_cache": from_cache,
        "seconds": round(time.perf_counter() - started, 3),
    }
    graph = _graph(arrays, n)
    dataset = NodeDataset(name, graph, opts.classes, "accuracy", info, relations=rel)
    try:
        return dataset.validate()
    except DatasetError:
        if not from_cache or folder is None:
            raise
    # a cache that breaks the contract (edges out of order, types that do not match)
    discard_cache(folder, f"the dataset cache {folder} breaks the dataset contract")
    return load_synthetic_hetero(opts, name)


def _factory(name: str) -> Any:
    def load(options: SyntheticHeteroOptions) -> NodeDataset:
        return load_synthetic_hetero(options, name)

    load.__name__ = load.__qualname__ = f"load_{name.replace('-', '_')}"
    load.__doc__ = f"Load the {name!r} preset of the relational generator."
    return load


for _name, (_summary, _defaults) in PRESETS.items():
    DATASETS.add(
        _name,
        _factory(_name),
        options=SyntheticHeteroOptions,
        summary=_summary,
        defaults=_defaults,
    )
