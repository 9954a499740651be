"""The synthetic generator: contract, exact sizes, determinism, cache, and that the task is learnable."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from learnability import logistic_accuracy

from qtrain.data import DATASETS, load_dataset
from qtrain.data.synthetic import SyntheticOptions, cache_folder, generate, load_synthetic
from qtrain.errors import DatasetError, RecipeError


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own data directory, so nothing is written into the user's home."""
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def small(**changes: object) -> SyntheticOptions:
    """synthetic-small's options with ``changes``."""
    entry = DATASETS.get("synthetic-small")
    return dataclasses.replace(entry.parse({}, "dataset"), **changes)


def test_registered_presets() -> None:
    names = DATASETS.names()
    for name in ("synthetic", "synthetic-small", "synthetic-arxiv", "synthetic-products"):
        assert name in names
    arxiv = {o.name: o.default for o in DATASETS.get("synthetic-arxiv").describe()}
    assert arxiv["nodes"] == 169_343 and arxiv["features"] == 128 and arxiv["classes"] == 40
    assert (
        SyntheticOptions(**{k: arxiv[k] for k in ("nodes", "avg_degree")}).undirected_edges
        == 1_166_243
    )
    products = {o.name: o.default for o in DATASETS.get("synthetic-products").describe()}
    assert (
        products["nodes"] == 2_449_029 and products["features"] == 100 and products["classes"] == 47
    )
    assert (
        SyntheticOptions(
            nodes=products["nodes"], avg_degree=products["avg_degree"]
        ).undirected_edges
        == 61_859_140
    )
    assert arxiv["cache"] is True and products["cache"] is True
    assert all(o.help for o in DATASETS.get("synthetic").describe())


def test_small_graph_contract() -> None:
    ds = load_dataset("synthetic-small")
    opts = small()
    g = ds.graph
    n = opts.nodes
    assert (
        ds.name == "synthetic-small" and ds.metric == "accuracy" and ds.num_classes == opts.classes
    )
    assert g.num_nodes() == n
    assert g.num_edges() == 2 * opts.undirected_edges == round(opts.avg_degree * n)
    assert g.ndata["feat"].dtype == torch.float32 and g.ndata["feat"].shape == (n, opts.features)
    assert g.ndata["label"].dtype == torch.int64
    src, dst = (t.numpy() for t in g.edges())
    assert not np.any(src == dst), "self-loops"
    keys = src.astype(np.int64) * n + dst
    assert len(np.unique(keys)) == len(keys), "duplicate edges"
    assert np.array_equal(np.sort(keys), np.sort(dst.astype(np.int64) * n + src)), "not symmetric"
    masks = [g.ndata[k].numpy() for k in ("train_mask", "val_mask", "test_mask")]
    assert np.array_equal(masks[0].astype(int) + masks[1] + masks[2], np.ones(n, dtype=int))
    assert masks[0].sum() == int(opts.train_fraction * n) and masks[1].sum() == int(
        opts.val_fraction * n
    )
    assert (
        ds.info["source"] == "synthetic"
        and ds.info["seed"] == 0
        and ds.info["edges"] == g.num_edges()
    )


def test_degrees_are_heavy_tailed_and_homophily_holds() -> None:
    opts = small(nodes=20_000, avg_degree=10.0)
    arrays = generate(opts)
    u, v, labels = arrays["edge_u"], arrays["edge_v"], arrays["label"]
    degree = np.bincount(np.concatenate([u, v]), minlength=opts.nodes)
    assert degree.mean() == pytest.approx(10.0)
    assert degree.max() > 8 * degree.mean()  # power-law tail
    assert degree.max() < 3 * np.sqrt(opts.nodes * opts.avg_degree)  # capped near the cutoff
    assert np.median(degree) < degree.mean()
    homophily = (labels[u] == labels[v]).mean()
    assert abs(homophily - opts.homophily) < 0.02
    steeper = generate(dataclasses.replace(opts, power_law_exponent=4.0))
    steep_degree = np.bincount(np.concatenate([steeper["edge_u"], steeper["edge_v"]]))
    assert steep_degree.max() < degree.max()


def test_same_seed_same_dataset_other_seed_other_dataset() -> None:
    first, again = generate(small()), generate(small())
    assert first.keys() == again.keys()
    for key in first:
        assert np.array_equal(first[key], again[key]), key
    other = generate(small(seed=1))
    assert not np.array_equal(first["edge_u"], other["edge_u"])
    assert not np.array_equal(first["feat"], other["feat"])


def test_fixed_seed_reference_values() -> None:
    """Pin a few numbers so a change in the generator (or NumPy's streams) is noticed."""
    arrays = generate(small(nodes=200, avg_degree=4.0, features=3, classes=3))
    assert arrays["label"][:8].tolist() == REFERENCE_LABELS
    assert arrays["edge_u"][:5].tolist() == REFERENCE_EDGE_U
    assert arrays["edge_v"][:5].tolist() == REFERENCE_EDGE_V
    assert np.allclose(arrays["feat"][0], REFERENCE_FEAT0, atol=1e-4)


REFERENCE_LABELS = [2, 2, 0, 0, 2, 2, 0, 0]
REFERENCE_EDGE_U = [0, 1, 1, 2, 2]
REFERENCE_EDGE_V = [109, 8, 166, 170, 175]
REFERENCE_FEAT0 = [-1.075, 0.6458, 0.7679]


def test_learnable_from_features_and_structure_together() -> None:
    """Logistic regression on features alone vs. with the mean of the neighbours' features."""
    ds = load_dataset("synthetic-small")
    g = ds.graph
    x, y = g.ndata["feat"], g.ndata["label"]
    train, test = g.ndata["train_mask"], g.ndata["test_mask"]
    src, dst = g.edges()
    degree = torch.bincount(dst, minlength=g.num_nodes()).clamp(min=1).unsqueeze(1)
    neighbours = torch.zeros_like(x).index_add_(0, dst, x[src]) / degree
    chance = 1.0 / ds.num_classes
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only contend on a busy machine
    try:
        alone = logistic_accuracy(x, y, train, test, ds.num_classes)
        with_neighbours = torch.cat([x, neighbours], 1)
        together = logistic_accuracy(with_neighbours, y, train, test, ds.num_classes)
    finally:
        torch.set_num_threads(threads)
    assert alone > chance + 0.1, alone
    assert together > alone + 0.15, (alone, together)


def test_cache_round_trip_and_corruption(_data_dir: Path) -> None:
    opts = small(cache=True)
    first = load_synthetic(opts, "synthetic-small")
    folder = cache_folder(opts, "synthetic-small")
    assert folder.parent == _data_dir / "synthetic" and folder.name.startswith("synthetic-small-")
    assert (folder / "meta.json").is_file() and not first.info["from_cache"]
    second = load_synthetic(opts, "synthetic-small")
    assert second.info["from_cache"] and second.info["cache"] == str(folder)
    for key in ("feat", "label", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(first.graph.ndata[key], second.graph.ndata[key]), key
    assert torch.equal(torch.stack(first.graph.edges()), torch.stack(second.graph.edges()))

    # a different option gets its own folder; `cache` itself does not change the hash
    assert cache_folder(small(seed=5, cache=True), "synthetic-small") != folder
    assert cache_folder(small(cache=False), "synthetic-small") == folder

    # a corrupt cache is noticed (one warning line naming the folder), deleted and generated
    # again: the cache holds nothing the options do not determine
    feat = folder / "feat.npy"
    feat.write_bytes(feat.read_bytes()[: feat.stat().st_size // 2])
    with pytest.warns(UserWarning) as caught:
        third = load_synthetic(opts, "synthetic-small")
    message = str(caught[0].message)
    assert str(folder) in message and "generating the dataset again" in message
    assert "\n" not in message
    assert not third.info["from_cache"]
    assert torch.equal(first.graph.ndata["feat"], third.graph.ndata["feat"])
    assert load_synthetic(opts, "synthetic-small").info["from_cache"]


def test_cache_flipped_byte_is_noticed(_data_dir: Path) -> None:
    """A changed feature value would load silently without the checksums in meta.json."""
    opts = small(cache=True)
    first = load_synthetic(opts, "synthetic-small")
    feat = cache_folder(opts, "synthetic-small") / "feat.npy"
    data = bytearray(feat.read_bytes())
    data[-3] ^= 0x01  # the last feature value, a little different
    feat.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=r"feat\.npy does not match its checksum"):
        again = load_synthetic(opts, "synthetic-small")
    assert torch.equal(first.graph.ndata["feat"], again.graph.ndata["feat"])


def test_cache_missing_meta_is_reported(_data_dir: Path) -> None:
    opts = small(cache=True)
    folder = cache_folder(opts, "synthetic-small")
    folder.mkdir(parents=True)
    with pytest.warns(UserWarning, match="incomplete or corrupt"):
        ds = load_synthetic(opts, "synthetic-small")
    assert not ds.info["from_cache"] and (folder / "meta.json").is_file()


def test_uncached_generation_writes_nothing(_data_dir: Path) -> None:
    load_synthetic(small(cache=False), "synthetic-small")
    assert not (_data_dir / "synthetic").exists()


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ({"train_fraction": 0.7, "val_fraction": 0.3}, "must be below 1"),
        ({"nodes": 10, "avg_degree": 6.0}, "too dense"),
        ({"nodes": 3, "classes": 5, "train_fraction": 0.5}, "exceeds nodes"),
        ({"nodes": 10, "train_fraction": 0.05}, "no training node"),
    ],
)
def test_impossible_options_are_one_line_errors(table: dict, fragment: str) -> None:
    with pytest.raises(RecipeError, match=fragment):
        load_dataset("synthetic", table)
    opts = dataclasses.replace(SyntheticOptions(), **table)
    with pytest.raises(DatasetError, match=fragment):
        load_synthetic(opts)


def test_out_of_range_option_names_the_key() -> None:
    with pytest.raises(RecipeError, match=r"dataset\.homophily"):
        load_dataset("synthetic", {"homophily": 1.5})


def test_zero_signal_and_single_direction_of_knobs() -> None:
    """feature_signal = 0: features carry nothing; homophily = 1: every edge inside a class."""
    arrays = generate(small(feature_signal=0.0, homophily=1.0))
    labels = arrays["label"]
    assert np.all(labels[arrays["edge_u"]] == labels[arrays["edge_v"]])
    means = np.stack([arrays["feat"][labels == c].mean(0) for c in range(5)])
    assert np.abs(means).max() < 0.2


@pytest.mark.slow
def test_synthetic_arxiv_full_size(_data_dir: Path) -> None:
    ds = load_dataset("synthetic-arxiv", {"cache": False})
    assert ds.graph.num_nodes() == 169_343
    assert ds.graph.num_edges() == 2 * 1_166_243
    assert ds.graph.ndata["feat"].shape == (169_343, 128) and ds.num_classes == 40
