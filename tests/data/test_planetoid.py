"""Planetoid loader: tiny files written here in the original format, hostile pickles, and real Cora / Citeseer."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from planetoid_files import N_ALL, N_TRAIN, TEST_IDS, C, tiny_objects, write_planetoid

from qtrain.data import load_dataset
from qtrain.errors import DatasetError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "home-data"))


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_tiny_dataset_is_built_like_the_reference_loaders(tmp_path: Path, protocol: int) -> None:
    objects = tiny_objects()
    write_planetoid(tmp_path, "cora", objects, protocol)
    ds = load_dataset("cora", {"root": str(tmp_path)})
    g = ds.graph
    n = max(TEST_IDS) + 1
    assert g.num_nodes() == n and ds.num_classes == C and ds.metric == "accuracy"

    raw = (
        load_dataset("cora", {"root": str(tmp_path), "normalize_features": False})
        .graph.ndata["feat"]
        .numpy()
    )
    allx, tx = objects["allx"].toarray(), objects["tx"].toarray()
    assert np.array_equal(raw[:N_ALL], allx)
    assert np.array_equal(raw[TEST_IDS], tx)  # tx row i belongs to node TEST_IDS[i]
    missing = [512, 519]
    assert not raw[missing].any()

    feat = g.ndata["feat"].numpy()
    sums = raw.sum(1)
    assert np.allclose(feat[sums > 0].sum(1), 1.0)
    assert not feat[sums == 0].any()

    labels = g.ndata["label"].numpy()
    assert np.array_equal(labels[:N_ALL], objects["ally"].argmax(1))
    assert np.array_equal(labels[TEST_IDS], objects["ty"].argmax(1))
    assert labels[missing].tolist() == [0, 0]
    train, val, test = (g.ndata[k].numpy() for k in ("train_mask", "val_mask", "test_mask"))
    assert np.flatnonzero(train).tolist() == list(range(N_TRAIN))
    assert np.flatnonzero(val).tolist() == list(range(N_TRAIN, N_TRAIN + 500))
    assert np.flatnonzero(test).tolist() == sorted(TEST_IDS)
    assert not (train | val | test)[missing].any(), "padded nodes must be in no mask"

    src, dst = (t.numpy() for t in g.edges())
    pairs = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert len(pairs) == len(src), "duplicates"
    assert all(a != b for a, b in pairs), "self-loops"
    assert all((b, a) in pairs for a, b in pairs), "not symmetric"
    undirected = {(min(a, b), max(a, b)) for a, b in pairs}
    expected = {(i, i + 1) for i in range(N_ALL - 1)} | {(3, 7), (510, 515), (510, 521), (0, 2)}
    assert undirected == expected
    assert ds.info["self_loop_entries_removed"] == 2 and ds.info["unlabelled_nodes"] == 2
    assert ds.info["folder"] == str(tmp_path / "planetoid" / "cora")


def test_root_defaults_to_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_planetoid(tmp_path / "elsewhere", "pubmed")
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "elsewhere"))
    assert load_dataset("pubmed").graph.num_nodes() == max(TEST_IDS) + 1


def test_missing_folder_says_where_and_how(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        load_dataset("citeseer", {"root": str(tmp_path)})
    message = str(err.value)
    assert str(tmp_path / "planetoid" / "citeseer") in message and "QTRAIN_DATA_DIR" in message
    assert "\n" not in message


def test_missing_file_is_named(tmp_path: Path) -> None:
    folder = write_planetoid(tmp_path, "cora")
    (folder / "ind.cora.ty").unlink()
    with pytest.raises(DatasetError) as err:
        load_dataset("cora", {"root": str(tmp_path)})
    message = str(err.value)
    assert (
        "ind.cora.ty" in message
        and str(folder / "ind.cora.ty") in message
        and "QTRAIN_DATA_DIR" in message
    )


class _Hostile:
    """Unpickling this runs a shell command: the loader must refuse it before it runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_hostile_pickle_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    objects = tiny_objects()
    objects["graph"] = _Hostile(marker)
    folder = write_planetoid(tmp_path, "cora", objects)
    with pytest.raises(DatasetError) as err:
        load_dataset("cora", {"root": str(tmp_path)})
    message = str(err.value)
    assert str(folder / "ind.cora.graph") in message and "refusing" in message
    assert "system" in message  # names the forbidden callable (posix.system)
    assert not marker.exists()


def test_hostile_class_inside_an_allowed_container(tmp_path: Path) -> None:
    objects = tiny_objects()
    objects["y"] = [np.zeros(3), eval]  # a builtin smuggled into a list
    write_planetoid(tmp_path, "cora", objects)
    with pytest.raises(DatasetError, match=r"refusing.*builtin__\.eval"):
        load_dataset("cora", {"root": str(tmp_path)})


def test_truncated_pickle(tmp_path: Path) -> None:
    folder = write_planetoid(tmp_path, "cora")
    path = folder / "ind.cora.allx"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(DatasetError) as err:
        load_dataset("cora", {"root": str(tmp_path)})
    message = str(err.value)
    assert str(path) in message and "truncated or corrupt" in message and "\n" not in message


def test_garbage_and_wrong_types(tmp_path: Path) -> None:
    folder = write_planetoid(tmp_path, "cora")
    (folder / "ind.cora.test.index").write_text("510\nnot-a-number\n")
    with pytest.raises(DatasetError, match="one integer node id per line"):
        load_dataset("cora", {"root": str(tmp_path)})

    objects = tiny_objects()
    objects["graph"] = [1, 2, 3]
    write_planetoid(tmp_path, "citeseer", objects)
    with pytest.raises(DatasetError, match="dict of adjacency lists"):
        load_dataset("citeseer", {"root": str(tmp_path)})

    objects = tiny_objects()
    objects["graph"][4].append(10_000)
    write_planetoid(tmp_path, "pubmed", objects)
    with pytest.raises(DatasetError, match=r"outside 0\.\.521"):
        load_dataset("pubmed", {"root": str(tmp_path)})


def test_inconsistent_shapes(tmp_path: Path) -> None:
    objects = tiny_objects()
    objects["ty"] = objects["ty"][:5]
    write_planetoid(tmp_path, "cora", objects)
    with pytest.raises(DatasetError, match="inconsistent: tx has 10 rows, ty 5"):
        load_dataset("cora", {"root": str(tmp_path)})


# ---------------------------------------------------------------------------- real data

README_STATS = {  # from ../shared/datasets/README.md
    "cora": {
        "nodes": 2708,
        "edges": 5278,
        "features": 1433,
        "classes": 7,
        "split": (140, 500, 1000),
    },
    "citeseer": {
        "nodes": 3327,
        "edges": 4552,
        "features": 3703,
        "classes": 6,
        "split": (120, 500, 1000),
    },
}


@pytest.mark.skipif(
    not (SHARED / "planetoid").is_dir(),
    reason=f"real Planetoid data not present at {SHARED / 'planetoid'}",
)
@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_real_statistics_match_the_readme(name: str) -> None:
    stats = README_STATS[name]
    ds = load_dataset(name, {"root": str(SHARED)})
    g = ds.graph
    assert g.num_nodes() == stats["nodes"]
    assert g.num_edges() == 2 * stats["edges"]
    assert g.ndata["feat"].shape == (stats["nodes"], stats["features"])
    assert ds.num_classes == stats["classes"]
    split = tuple(int(g.ndata[k].sum()) for k in ("train_mask", "val_mask", "test_mask"))
    assert split == stats["split"]
    assert (
        torch.bincount(g.ndata["label"][g.ndata["train_mask"]]).tolist() == [20] * stats["classes"]
    )
    src, dst = g.edges()
    assert not bool((src == dst).any())
    n = g.num_nodes()
    assert torch.equal(torch.sort(src * n + dst).values, torch.sort(dst * n + src).values)
    rows = g.ndata["feat"].sum(1)
    assert torch.allclose(rows[rows > 0], torch.ones(1))
    if name == "citeseer":
        assert ds.info["unlabelled_nodes"] == 15 and ds.info["self_loop_entries_removed"] == 248
        padded = rows == 0
        assert int(padded.sum()) == 15
        masks = g.ndata["train_mask"] | g.ndata["val_mask"] | g.ndata["test_mask"]
        assert not bool(masks[padded].any())
