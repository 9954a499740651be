"""The relational generator and the relational dataset contract: shapes of Hector's presets,
exact counts, determinism, inverse edges, a task that needs the relations, the cache, and
``NodeDataset.validate`` refusing graphs that break the contract."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from learnability import logistic_accuracy

from qtrain._compat import import_dgl
from qtrain.data import DATASETS, load_dataset
from qtrain.data.base import ETYPE, NTYPE, NodeDataset, Relations
from qtrain.data.cache import save_arrays
from qtrain.data.hetero import (
    HECTOR_SHAPES,
    SyntheticHeteroOptions,
    cache_folder,
    generate,
    load_synthetic_hetero,
    type_sizes,
)
from qtrain.errors import DatasetError, RecipeError


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own data directory, so nothing is written into the user's home."""
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def options(name: str = "synthetic-hetero-small", **changes: object) -> SyntheticHeteroOptions:
    return dataclasses.replace(DATASETS.get(name).parse({}, "dataset"), **changes)


@pytest.fixture(scope="module")
def small() -> NodeDataset:
    return load_dataset("synthetic-hetero-small")


def test_small_preset_follows_the_contract(small: NodeDataset) -> None:
    rel, g = small.relations, small.graph
    assert rel is not None and rel.target == "target" and rel.ntypes[0] == "target"
    assert (rel.num_ntypes, rel.num_etypes) == (3, 8)
    assert (g.num_nodes(), g.num_edges()) == (3000, 24000)
    ntype, etype = g.ndata[NTYPE], g.edata[ETYPE]
    assert bool((ntype[1:] >= ntype[:-1]).all()) and bool((etype[1:] >= etype[:-1]).all())
    # within a relation: by destination, then source, and no pair twice
    src, dst = g.edges()
    key = (etype * g.num_nodes() + dst) * g.num_nodes() + src
    assert bool((key[1:] > key[:-1]).all())
    # the task lives on the target type only
    target = ntype == 0
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert not bool((g.ndata[mask] & ~target).any())
    assert int((g.ndata["train_mask"] | g.ndata["val_mask"] | g.ndata["test_mask"]).sum()) == int(
        target.sum()
    )
    assert int(g.ndata["label"][~target].abs().sum()) == 0
    assert small.info["nodes_per_type"] == dict(
        zip(rel.ntypes, torch.bincount(ntype).tolist(), strict=True)
    )
    assert sum(small.info["edges_per_type"].values()) == 24000
    # messages reach the target type
    assert any(d == "target" for _, _, d in rel.etypes)


def test_inverse_relations_reverse_every_edge(small: NodeDataset) -> None:
    rel, g = small.relations, small.graph
    src, dst = g.edges()
    etype = g.edata[ETYPE]
    for r, (s, name, d) in enumerate(rel.etypes):
        if not name.endswith("-inv"):
            continue
        forward = rel.etypes[r - 1]
        assert forward == (d, name[: -len("-inv")], s)
        there = set(zip(src[etype == r - 1].tolist(), dst[etype == r - 1].tolist(), strict=True))
        back = set(zip(dst[etype == r].tolist(), src[etype == r].tolist(), strict=True))
        assert there == back and there


@pytest.mark.parametrize("name", list(HECTOR_SHAPES))
def test_hector_shapes_at_a_small_scale(name: str) -> None:
    nodes, ntypes, edges, etypes, classes = HECTOR_SHAPES[name]
    scale = min(1.0, 6000 / edges, 3000 / nodes)
    opts = options(f"synthetic-{name}", scale=scale, cache=False)
    data = load_synthetic_hetero(opts, f"synthetic-{name}")
    rel, g = data.relations, data.graph
    assert (rel.num_ntypes, rel.num_etypes, data.num_classes) == (ntypes, etypes, classes)
    assert g.num_nodes() == round(nodes * scale)
    expected = round(edges * scale)
    if etypes % 2 == 0:
        expected -= expected % 2
    assert g.num_edges() == expected
    assert set(torch.unique(g.edata[ETYPE]).tolist()) == set(range(etypes))  # none empty
    assert set(torch.unique(g.ndata[NTYPE]).tolist()) == set(range(ntypes))


def test_full_size_presets_have_hectors_counts() -> None:
    """Without generating them: the options of every preset give Table 3's counts."""
    for name, (nodes, ntypes, edges, etypes, _) in HECTOR_SHAPES.items():
        opts = options(f"synthetic-{name}")
        assert (opts.total_nodes, opts.node_types, opts.edge_types) == (nodes, ntypes, etypes)
        assert opts.total_edges == edges
        assert opts.cache == (edges >= 1_000_000)
        sizes = type_sizes(opts.total_nodes, ntypes)
        assert sizes.sum() == nodes and sizes.min() >= 1 and sizes.argmax() == 0


def test_same_seed_same_graph_other_seed_other_graph() -> None:
    opts = options(nodes=600, edges=4000)
    a, b, c = generate(opts), generate(opts), generate(dataclasses.replace(opts, seed=1))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert not np.array_equal(a["src"], c["src"]) or not np.array_equal(a["feat"], c["feat"])


def test_odd_edge_types_leave_the_last_relation_without_an_inverse() -> None:
    opts = options(nodes=500, edges=3001, edge_types=5)
    data = load_synthetic_hetero(opts)
    names = [e[1] for e in data.relations.etypes]
    assert names == ["r0", "r0-inv", "r1", "r1-inv", "r2"]
    assert data.graph.num_edges() == 3001  # one relation without an inverse: any count
    plain = load_synthetic_hetero(dataclasses.replace(opts, inverse_edges=False))
    assert [e[1] for e in plain.relations.etypes] == ["r0", "r1", "r2", "r3", "r4"]


def test_the_task_needs_the_relations(small: NodeDataset) -> None:
    """Own features are weak; the neighbours' mean per relation is strong; one mean over all
    relations (what a model with one weight for every relation sees) is in between."""
    g = small.graph
    x, y = g.ndata["feat"], g.ndata["label"]
    train, test = g.ndata["train_mask"], g.ndata["test_mask"]
    src, dst = g.edges()
    etype = g.edata[ETYPE]

    def mean_in(edges: torch.Tensor) -> torch.Tensor:
        degree = torch.bincount(dst[edges], minlength=g.num_nodes()).clamp(min=1).unsqueeze(1)
        return torch.zeros_like(x).index_add_(0, dst[edges], x[src[edges]]) / degree

    everything = torch.ones_like(etype, dtype=torch.bool)
    per_relation = [mean_in(etype == r) for r in range(small.relations.num_etypes)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        acc = {
            "alone": logistic_accuracy(x, y, train, test, small.num_classes),
            "mixed": logistic_accuracy(
                torch.cat([x, mean_in(everything)], 1), y, train, test, small.num_classes
            ),
            "typed": logistic_accuracy(
                torch.cat([x, *per_relation], 1), y, train, test, small.num_classes
            ),
        }
    finally:
        torch.set_num_threads(threads)
    chance = 1.0 / small.num_classes
    assert acc["alone"] < chance + 0.25, acc
    assert acc["typed"] > acc["alone"] + 0.2, acc
    assert acc["typed"] > acc["mixed"] + 0.05, acc


def test_cache_round_trip_and_a_corrupt_cache_is_rebuilt(_data_dir: Path) -> None:
    opts = options(nodes=800, edges=5000, cache=True)
    first = load_synthetic_hetero(opts, "synthetic-hetero-small")
    folder = cache_folder(opts, "synthetic-hetero-small")
    assert (folder / "meta.json").is_file() and not first.info["from_cache"]
    second = load_synthetic_hetero(opts, "synthetic-hetero-small")
    assert second.info["from_cache"]
    assert torch.equal(torch.stack(first.graph.edges()), torch.stack(second.graph.edges()))
    assert torch.equal(first.graph.edata[ETYPE], second.graph.edata[ETYPE])
    # a cache that passes its checksums but breaks the contract is noticed and rebuilt
    etype = folder / "etype.npy"
    data = np.load(etype)
    data[0], data[-1] = data[-1], data[0]  # edges no longer grouped by relation
    arrays = {p.stem: np.load(p) for p in folder.glob("*.npy")}
    arrays["etype"] = data
    meta = json.loads((folder / "meta.json").read_text())
    meta.pop("arrays")
    shutil.rmtree(folder)
    save_arrays(folder, arrays, meta)
    with pytest.warns(UserWarning, match="breaks the dataset contract"):
        third = load_synthetic_hetero(opts, "synthetic-hetero-small")
    assert not third.info["from_cache"]
    assert torch.equal(first.graph.edata[ETYPE], third.graph.edata[ETYPE])
    # bytes cut short: the checksums catch it, one warning line, rebuilt
    feat = folder / "feat.npy"
    feat.write_bytes(feat.read_bytes()[: feat.stat().st_size // 2])
    with pytest.warns(UserWarning, match="generating the dataset again"):
        fourth = load_synthetic_hetero(opts, "synthetic-hetero-small")
    assert torch.equal(first.graph.ndata["feat"], fourth.graph.ndata["feat"])


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ({"nodes": 3, "node_types": 5}, "every type needs a node"),
        ({"edges": 4, "edge_types": 8}, "every relation needs an edge"),
        ({"train_fraction": 0.8, "val_fraction": 0.2}, "must be below 1"),
        ({"nodes": 40, "edges": 4000, "node_types": 2}, "do not fit"),
    ],
)
def test_impossible_options_are_one_line_errors(table: dict, fragment: str) -> None:
    with pytest.raises((RecipeError, DatasetError), match=fragment) as caught:
        load_dataset("synthetic-hetero", table)
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------- the contract, refused


def _broken(small: NodeDataset, change: str) -> NodeDataset:
    g = small.graph.clone()
    rel = small.relations
    if change == "etype out of range":
        g.edata[ETYPE] = g.edata[ETYPE].clone()
        g.edata[ETYPE][-1] = rel.num_etypes
    elif change == "edges not grouped":
        g.edata[ETYPE] = g.edata[ETYPE].flip(0)
    elif change == "nodes not grouped":
        g.ndata[NTYPE] = g.ndata[NTYPE].flip(0)
    elif change == "wrong end types":
        etype = g.edata[ETYPE].clone()
        first, second = etype == 0, etype == 1  # r0 and its inverse swap names
        etype[first], etype[second] = 1, 0
        order = torch.argsort(etype, stable=True)
        src, dst = g.edges()
        h = import_dgl().graph((src[order], dst[order]), num_nodes=g.num_nodes())
        h.ndata.update(g.ndata)
        h.edata[ETYPE] = etype[order]
        g = h
    elif change == "mask off target":
        g.ndata["train_mask"] = g.ndata["train_mask"].clone()
        g.ndata["train_mask"][-1] = True
    elif change == "etype dtype":
        g.edata[ETYPE] = g.edata[ETYPE].int()
    return NodeDataset("broken", g, small.num_classes, relations=rel)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("etype out of range", "etype ids span 0..8, outside 0..7"),
        ("edges not grouped", "grouped by edge type"),
        ("nodes not grouped", "grouped by node type"),
        ("wrong end types", "has type .* but joins"),
        ("mask off target", "train_mask selects nodes outside the target type 'target'"),
        ("etype dtype", "etype must be int64"),
    ],
)
def test_validate_refuses_what_breaks_the_contract(
    small: NodeDataset, change: str, says: str
) -> None:
    with pytest.raises(DatasetError, match=says):
        _broken(small, change).validate()


@pytest.mark.parametrize(
    ("relations", "says"),
    [
        (Relations((), (("a", "r", "a"),), "a"), "at least one node type"),
        (Relations(("a", "a"), (("a", "r", "a"),), "a"), "node types repeat"),
        (Relations(("a",), (("a", "r", "b"),), "a"), "names a node type not in"),
        (Relations(("a",), (("a", "r", "a"),), "b"), "target node type 'b'"),
    ],
)
def test_validate_refuses_inconsistent_type_names(
    small: NodeDataset, relations: Relations, says: str
) -> None:
    with pytest.raises(DatasetError, match=says):
        NodeDataset("broken", small.graph, small.num_classes, relations=relations).validate()
