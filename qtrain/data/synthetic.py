"""Seeded synthetic node-classification graphs, from a few thousand nodes to ogbn-products' size.

Why this model: quantization changes accuracy only by a little, so the task
must be one where both the graph and the features matter, otherwise an
accuracy difference says nothing about the quantized aggregation. The graph
is a degree-corrected stochastic block model:

* every node gets a class (uniform) and a power-law weight (Pareto with tail
  exponent ``power_law_exponent``, capped at the Chung-Lu structural cutoff
  so that expected degrees stay below ``sqrt(nodes * avg_degree)``);
* each undirected edge picks one endpoint in proportion to the weights, then
  the other one in proportion to the weights among the nodes of the same
  class (probability ``homophily``) or of the other classes (otherwise);
* self-loops and duplicates are dropped and more edges drawn until exactly
  ``round(avg_degree * nodes / 2)`` distinct undirected edges exist;
* features are a class centroid plus standard Gaussian noise, the centroids
  having norm ``feature_signal``: each node's own features predict its class
  only moderately, the mean of its neighbours' features much better.

Everything is vectorised NumPy in fixed-size chunks (memory stays a few GB at
ogbn-products' size), and every random draw comes from one ``numpy.random``
Generator per stage seeded from ``seed``. The degree weights are rounded to
multiples of 1/256 and all sampling is done in integers, so the result does
not depend on the machine, the thread count or the SIMD variant of ``pow``.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qtrain.config import option
from qtrain.data.base import FEAT, LABEL, TEST_MASK, TRAIN_MASK, VAL_MASK, NodeDataset, data_dir
from qtrain.data.cache import load_arrays, options_hash, save_arrays
from qtrain.data.registry import DATASETS
from qtrain.errors import DatasetError

# Bump when the generator changes what a given option set produces: cached
# folders are keyed by it, so old caches are simply not found any more.
GENERATOR_VERSION = 1

EDGE_CHUNK = (
    1 << 22
)  # edges drawn per chunk: bounds temporary memory, fixed so results never depend on it
FEAT_CHUNK = 1 << 16  # feature rows drawn per chunk
_WEIGHT_SCALE = 256  # degree weights are integers in units of 1/256
MAX_ROUNDS = 40


@dataclass(frozen=True)
class SyntheticOptions:
    """Knobs of the generator; every preset is these with other defaults."""

    nodes: int = option(10_000, "number of nodes", min=2)
    avg_degree: float = option(
        10.0,
        "mean number of distinct neighbours per node: the graph has exactly "
        "round(avg_degree * nodes / 2) undirected edges, stored in both directions "
        "(num_edges() = 2x that), without self-loops or duplicates",
        min=0,
    )
    power_law_exponent: float = option(
        2.5,
        "gamma in P(degree = k) ~ k^-gamma: the tail of the expected-degree distribution "
        "(Chung-Lu weights, capped at sqrt(nodes * avg_degree)); larger = more even degrees",
        min=2.05,
        max=50.0,
    )
    features: int = option(64, "feature dimension", min=1)
    classes: int = option(8, "number of classes (labels drawn uniformly)", min=2)
    homophily: float = option(
        0.7,
        "fraction of edges whose two ends share a class (as drawn, before duplicates are "
        "dropped; info['edge_homophily'] has the measured value); 1/classes = structure "
        "carries no label information",
        min=0.0,
        max=1.0,
    )
    feature_signal: float = option(
        1.0,
        "norm of each class centroid of the features, in units of the per-dimension noise "
        "(std 1): two centroids are about sqrt(2) x this apart; 0 = features carry no label "
        "information",
        min=0.0,
    )
    train_fraction: float = option(
        0.5, "fraction of nodes (random) in train_mask", min=0.0, max=1.0
    )
    val_fraction: float = option(
        0.2, "fraction of nodes (random) in val_mask; the rest is test_mask", min=0.0, max=1.0
    )
    seed: int = option(
        0, "seed: the same seed and options give the same dataset on every machine", min=0
    )
    cache: bool = option(
        False,
        "keep the generated dataset under <data dir>/synthetic/<name>-<hash of the options>/ "
        "and read it from there next time",
    )

    def validate(self) -> None:
        """Reject option sets that cannot be generated (raised as a one-line error)."""
        if self.train_fraction + self.val_fraction >= 1.0:
            raise ValueError(
                f"train_fraction + val_fraction = {self.train_fraction + self.val_fraction:g} "
                "must be below 1 (the rest of the nodes is the test set)"
            )
        if int(self.train_fraction * self.nodes) < 1:
            raise ValueError(
                f"train_fraction = {self.train_fraction:g} of {self.nodes} nodes leaves no training node"
            )
        if self.classes > self.nodes:
            raise ValueError(f"classes = {self.classes} exceeds nodes = {self.nodes}")
        if self.avg_degree > (self.nodes - 1) / 2:
            raise ValueError(
                f"avg_degree = {self.avg_degree:g} is too dense for {self.nodes} nodes; "
                f"allowed: at most (nodes - 1) / 2 = {(self.nodes - 1) / 2:g}"
            )
        if self.nodes >= 2**31:
            raise ValueError(f"nodes = {self.nodes} is too large; allowed: below 2^31")

    @property
    def undirected_edges(self) -> int:
        """The exact number of undirected edges the generator places."""
        return round(self.avg_degree * self.nodes / 2)


PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "synthetic": (
        "seeded degree-corrected SBM with power-law degrees and Gaussian class features",
        {},
    ),
    "synthetic-small": (
        "small synthetic graph (3,000 nodes) that trains in seconds: the default recipe's dataset",
        {
            "nodes": 3_000,
            "avg_degree": 8.0,
            "features": 32,
            "classes": 5,
            "homophily": 0.75,
            "feature_signal": 1.0,
            "train_fraction": 0.3,
            "val_fraction": 0.2,
        },
    ),
    "synthetic-arxiv": (
        "synthetic graph shaped like ogbn-arxiv: 169,343 nodes, 1,166,243 undirected edges, "
        "128 features, 40 classes",
        {
            "nodes": 169_343,
            "avg_degree": 2 * 1_166_243 / 169_343,
            "features": 128,
            "classes": 40,
            "homophily": 0.5,
            "feature_signal": 1.5,
            "train_fraction": 0.54,
            "val_fraction": 0.18,
            "cache": True,
        },
    ),
    "synthetic-products": (
        "synthetic graph shaped like ogbn-products: 2,449,029 nodes, 61,859,140 undirected "
        "edges, 100 features, 47 classes",
        {
            "nodes": 2_449_029,
            "avg_degree": 2 * 61_859_140 / 2_449_029,
            "features": 100,
            "classes": 47,
            "homophily": 0.35,
            "feature_signal": 1.0,
            "train_fraction": 0.08,
            "val_fraction": 0.02,
            "cache": True,
        },
    ),
}


# --------------------------------------------------------------------------- generation


def node_weights(
    rng: np.random.Generator, nodes: int, avg_degree: float, exponent: float
) -> np.ndarray:
    """Integer Chung-Lu weights (units of 1/256) with a power-law tail, capped at the cutoff.

    Pareto(x_m = 1, shape gamma - 1) has density ~ x^-gamma. Expected degree
    is proportional to the weight, so capping the weight at
    sqrt(nodes / avg_degree) x mean caps expected degree near
    sqrt(nodes * avg_degree), where Chung-Lu edge probabilities reach 1.
    """
    shape = exponent - 1.0
    raw = (1.0 - rng.random(nodes)) ** (-1.0 / shape)
    ratio = math.sqrt(nodes / max(avg_degree, 1.0))
    mean = shape / (shape - 1.0) * _WEIGHT_SCALE  # Pareto mean, refined below
    weights = np.floor(np.minimum(raw, 1e9) * _WEIGHT_SCALE).astype(np.int64)
    for _ in range(2):  # the cap lowers the mean, which moves the cap: two passes suffice
        cap = max(_WEIGHT_SCALE, int(ratio * mean))
        weights = np.minimum(weights, cap)
        mean = int(weights.sum()) / nodes
    return weights


class _EdgeSampler:
    """Draws undirected edges of the degree-corrected block model as int64 keys ``a * n + b``, a < b."""

    def __init__(self, labels: np.ndarray, weights: np.ndarray, classes: int, homophily: float):
        self.n = len(labels)
        self.labels = labels
        self.homophily = homophily
        self.cum_all = np.cumsum(weights)
        self.total = int(self.cum_all[-1])
        self.order = np.argsort(labels, kind="stable")
        self.cum_sorted = np.cumsum(weights[self.order])
        # float64 sums of integers below 2^53 are exact, whatever the summation order
        self.class_w = np.bincount(labels, weights=weights, minlength=classes).astype(np.int64)
        self.class_start = np.concatenate([[0], np.cumsum(self.class_w)[:-1]])

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` edge keys (self-loops come back as -1), in fixed-size chunks."""
        keys = np.empty(count, dtype=np.int64)
        for start in range(0, count, EDGE_CHUNK):
            keys[start : start + EDGE_CHUNK] = self._chunk(rng, min(EDGE_CHUNK, count - start))
        return keys

    def _chunk(self, rng: np.random.Generator, k: int) -> np.ndarray:
        # Binary search is cache-friendly only for sorted queries: sort the u draws (they are
        # i.i.d., so their order carries nothing) and search the v positions in sorted order.
        u = np.searchsorted(
            self.cum_all, np.sort(rng.integers(0, self.total, size=k)), side="right"
        )
        cu = self.labels[u]
        other_w = self.total - self.class_w[cu]
        same = (rng.random(k) < self.homophily) | (other_w == 0)
        pos = np.empty(k, dtype=np.int64)
        cs, co = cu[same], cu[~same]
        # same class: a point in the class's slice of the class-sorted cumulative weights
        pos[same] = self.class_start[cs] + rng.integers(0, self.class_w[cs])
        # other classes: a point in the cumulative weights with the class's slice cut out
        t = rng.integers(0, other_w[~same])
        pos[~same] = t + np.where(t >= self.class_start[co], self.class_w[co], 0)
        by_pos = np.argsort(pos)
        slot = np.empty(k, dtype=np.int64)
        slot[by_pos] = np.searchsorted(self.cum_sorted, pos[by_pos], side="right")
        v = self.order[slot]
        key = np.minimum(u, v) * self.n + np.maximum(u, v)
        key[u == v] = -1
        return key


def unique_sorted(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct non-negative keys (sorts ``keys`` in place to save a copy)."""
    keys.sort()
    keys = keys[np.searchsorted(keys, 0) :]
    if len(keys) == 0:
        return keys
    keep = np.empty(len(keys), dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def _edges(rng: np.random.Generator, sampler: _EdgeSampler, target: int, name: str) -> np.ndarray:
    """Exactly ``target`` distinct undirected edge keys: draw, dedupe, top up, trim."""
    if target == 0:
        return np.empty(0, dtype=np.int64)
    keys = unique_sorted(sampler.draw(rng, target))
    drawn = target
    for _ in range(MAX_ROUNDS):
        if len(keys) >= target:
            break
        need = target - len(keys)
        yield_rate = max(len(keys) / drawn, 0.02)
        count = int(need / yield_rate * 1.1) + 64
        new = unique_sorted(sampler.draw(rng, count))
        drawn += count
        pos = np.minimum(np.searchsorted(keys, new), max(len(keys) - 1, 0))
        new = new[keys[pos] != new] if len(keys) else new
        keys = np.concatenate([keys, new])
        keys.sort(kind="stable")  # two sorted runs: timsort merges them in linear time
    else:
        raise DatasetError(
            f"dataset {name!r}: could place only {len(keys)} of {target} distinct edges; "
            "lower avg_degree or homophily, or use more nodes or fewer classes"
        )
    if len(keys) > target:  # drop a random excess so the count is exact
        keys = np.delete(keys, rng.choice(len(keys), size=len(keys) - target, replace=False))
    return keys


def _index_dtype(n: int) -> type[np.integer]:
    """The dtype of the stored node ids: int32 while it can hold them."""
    return np.int32 if n < 2**31 else np.int64


def generate(opts: SyntheticOptions, name: str = "synthetic") -> dict[str, np.ndarray]:
    """The dataset as plain arrays (what the cache stores): half edges, features, labels, masks."""
    n = opts.nodes
    node_seq, edge_seq, feat_seq, split_seq = np.random.SeedSequence(opts.seed).spawn(4)
    rng = np.random.default_rng(node_seq)
    labels = rng.integers(0, opts.classes, size=n, dtype=np.int64)
    weights = node_weights(rng, n, opts.avg_degree, opts.power_law_exponent)

    sampler = _EdgeSampler(labels, weights, opts.classes, opts.homophily)
    keys = _edges(np.random.default_rng(edge_seq), sampler, opts.undirected_edges, name)
    del sampler
    edge_u = (keys // n).astype(_index_dtype(n))
    edge_v = (keys % n).astype(_index_dtype(n))
    del keys

    rng = np.random.default_rng(feat_seq)
    centroids = rng.standard_normal((opts.classes, opts.features))
    centroids = (centroids * (opts.feature_signal / math.sqrt(opts.features))).astype(np.float32)
    feat = np.empty((n, opts.features), dtype=np.float32)
    for start in range(0, n, FEAT_CHUNK):
        stop = min(start + FEAT_CHUNK, n)
        rng.standard_normal(out=feat[start:stop], dtype=np.float32)
        feat[start:stop] += centroids[labels[start:stop]]

    perm = np.random.default_rng(split_seq).permutation(n)
    n_train, n_val = int(opts.train_fraction * n), int(opts.val_fraction * n)
    masks = {}
    for key, part in (
        (TRAIN_MASK, perm[:n_train]),
        (VAL_MASK, perm[n_train : n_train + n_val]),
        (TEST_MASK, perm[n_train + n_val :]),
    ):
        masks[key] = np.zeros(n, dtype=bool)
        masks[key][part] = True
    return {"edge_u": edge_u, "edge_v": edge_v, FEAT: feat, LABEL: labels, **masks}


def _graph(arrays: dict[str, np.ndarray], n: int) -> Any:
    """A DGL graph holding both directions of every undirected edge, plus the node data.

    Takes the half-edge arrays out of ``arrays`` so they can be freed early.
    """
    import torch

    from qtrain._compat import import_dgl

    dgl = import_dgl()
    u, v = arrays.pop("edge_u"), arrays.pop("edge_v")  # dropped as soon as copied: peak memory
    m = len(u)
    src = np.empty(2 * m, dtype=np.int64)
    dst = np.empty(2 * m, dtype=np.int64)
    src[:m], src[m:] = u, v
    dst[:m], dst[m:] = v, u
    del u, v
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n)
    for key in (FEAT, LABEL, TRAIN_MASK, VAL_MASK, TEST_MASK):
        g.ndata[key] = torch.from_numpy(arrays[key])
    return g


def cache_folder(opts: SyntheticOptions, name: str) -> Path:
    """Where ``name`` with ``opts`` is cached: the hash covers every option that shapes the data."""
    return data_dir() / "synthetic" / f"{name}-{options_hash(_identity(opts))}"


def _identity(opts: SyntheticOptions) -> dict[str, Any]:
    fields = dataclasses.asdict(opts)
    fields.pop("cache")
    return {"generator": GENERATOR_VERSION, **fields}


def _homophily(arrays: dict[str, np.ndarray]) -> float:
    """Fraction of edges whose ends share a label (NaN without edges)."""
    same = arrays[LABEL][arrays["edge_u"]] == arrays[LABEL][arrays["edge_v"]]
    return float(same.mean()) if len(same) else float("nan")


def _read_cache(folder: Path, opts: SyntheticOptions) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when there is no usable cache.

    The cache holds nothing but what ``generate`` computes from the options,
    so a corrupt or inconsistent folder (bad bytes, another option set's
    files, arrays that break the generator's invariants) is deleted, with a
    one-line warning naming it and the problem, and generated again: what a
    user expects of a cache, and no wrong value is ever used.
    """
    try:
        cached = load_arrays(folder)
        if cached is None:
            return None
        arrays, meta = cached
        problem = _cache_problem(arrays, meta, opts)
        if problem is None:
            return arrays
        message = f"the dataset cache {folder} is unusable ({problem})"
    except DatasetError as exc:
        message = str(exc)
    discard_cache(folder, message)
    return None


def discard_cache(folder: Path, message: str) -> None:
    """Delete an unusable cache folder, with a one-line warning saying why and what next."""
    action = "deleted it; generating the dataset again"
    try:
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
        else:
            folder.unlink()
    except FileNotFoundError:  # another process deleted it first
        pass
    except OSError as exc:
        action = f"could not delete it ({exc}); generating the dataset without the cache"
    warnings.warn(f"{message}; {action}", stacklevel=4)


def _cache_problem(
    arrays: dict[str, np.ndarray], meta: dict[str, Any], opts: SyntheticOptions
) -> str | None:
    """What makes cached ``arrays`` differ from what ``generate(opts)`` returns, or None.

    meta.json sits in the same folder as the arrays, so shapes and dtypes are
    checked against the options, and every invariant of the generator is
    checked too: node ids in range, edges sorted, distinct and without
    self-loops, labels in range, finite features, masks a partition of the
    nodes with the sizes the fractions give.
    """
    if meta.get("identity") != _identity(opts):
        return "it was made with other options"
    n, m = opts.nodes, opts.undirected_edges
    index = np.dtype(_index_dtype(n))
    expected = {
        "edge_u": ((m,), index),
        "edge_v": ((m,), index),
        FEAT: ((n, opts.features), np.dtype(np.float32)),
        LABEL: ((n,), np.dtype(np.int64)),
        **{key: ((n,), np.dtype(bool)) for key in (TRAIN_MASK, VAL_MASK, TEST_MASK)},
    }
    if set(arrays) != set(expected):
        return f"it holds the arrays {sorted(arrays)}, expected {sorted(expected)}"
    for key, (shape, dtype) in expected.items():
        if arrays[key].shape != shape or arrays[key].dtype != dtype:
            return f"{key} is {arrays[key].dtype} {list(arrays[key].shape)}, expected {dtype} {list(shape)}"
    for start in range(0, m, EDGE_CHUNK):  # in chunks, overlapping by one: bounded memory
        u = arrays["edge_u"][start : start + EDGE_CHUNK + 1].astype(np.int64)
        v = arrays["edge_v"][start : start + EDGE_CHUNK + 1].astype(np.int64)
        if u.min() < 0 or v.max() >= n or not bool(np.all(u < v)):
            return f"an edge is not a pair u < v of node ids in 0..{n - 1}"
        if not bool(np.all(np.diff(u * n + v) > 0)):
            return "the edges are not sorted and distinct"
    label = arrays[LABEL]
    if label.min() < 0 or label.max() >= opts.classes:
        return f"a label is outside 0..{opts.classes - 1}"
    for start in range(0, n, FEAT_CHUNK):
        if not bool(np.isfinite(arrays[FEAT][start : start + FEAT_CHUNK]).all()):
            return "a feature is NaN or infinite"
    train, val, test = (arrays[k] for k in (TRAIN_MASK, VAL_MASK, TEST_MASK))
    sizes = (int(train.sum()), int(val.sum()))
    if not bool(np.all(train.astype(np.int8) + val + test == 1)) or sizes != (
        int(opts.train_fraction * n),
        int(opts.val_fraction * n),
    ):
        return "the train/val/test masks are not the partition the options give"
    return None


def load_synthetic(opts: SyntheticOptions, name: str = "synthetic") -> NodeDataset:
    """Generate (or read from the cache) the synthetic dataset ``name`` described by ``opts``."""
    try:
        opts.validate()
    except ValueError as exc:
        raise DatasetError(f"dataset {name!r}: {exc}") from None
    folder = cache_folder(opts, name) if opts.cache else None
    started = time.perf_counter()
    arrays = _read_cache(folder, opts) if folder is not None else None
    from_cache = arrays is not None
    if arrays is None:
        arrays = generate(opts, name)
    homophily = _homophily(arrays)  # measured, never read from the cache's meta.json
    if folder is not None and not from_cache:
        meta = {"name": name, "identity": _identity(opts), "edge_homophily": homophily}
        save_arrays(folder, arrays, meta)
    seconds = time.perf_counter() - started
    n = opts.nodes
    info = {
        "source": "synthetic",
        "seed": opts.seed,
        "options": _identity(opts),
        "nodes": n,
        "edges": 2 * len(arrays["edge_u"]),
        "undirected_edges": len(arrays["edge_u"]),
        "edge_homophily": homophily,
        "cache": str(folder) if folder is not None else None,
        "from_cache": from_cache,
        "seconds": round(seconds, 3),
    }
    graph = _graph(arrays, n)
    return NodeDataset(name, graph, opts.classes, "accuracy", info).validate()


def _factory(name: str) -> Any:
    def load(options: SyntheticOptions) -> NodeDataset:
        return load_synthetic(options, name)

    load.__name__ = load.__qualname__ = f"load_{name.replace('-', '_')}"
    load.__doc__ = f"Load the {name!r} preset of the synthetic generator."
    return load


for _name, (_summary, _defaults) in PRESETS.items():
    DATASETS.add(
        _name, _factory(_name), options=SyntheticOptions, summary=_summary, defaults=_defaults
    )
