"""OGB loader: tiny datasets written here in ogb's raw on-disk format, read through ogb itself."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from ogb_files import (
    MAG_EDGES,
    MAG_SIZES,
    E,
    N,
    csv,
    edges,
    mag_edges,
    write_arxiv,
    write_mag,
    write_proteins,
)

from qtrain.data import DATASETS, load_dataset
from qtrain.errors import DatasetError


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "data"))


def test_registered_names() -> None:
    for name in ("ogbn-arxiv", "ogbn-products", "ogbn-proteins", "ogbn-mag", "ogbn-papers100M"):
        assert name in DATASETS
    defaults = {o.name: o.default for o in DATASETS.get("ogbn-arxiv").describe()}
    assert defaults == {"root": "", "to_bidirected": True, "relational": False}
    assert {o.name: o.default for o in DATASETS.get("ogbn-products").describe()}[
        "to_bidirected"
    ] is False


def test_no_version_check_on_import() -> None:
    """ogb asks PyPI for its latest version from a thread when ``outdated`` imports: keep it off."""
    code = (
        "import sys\n"
        "from qtrain._compat import import_dgl\n"
        "import_dgl()\n"  # import dgl imports ogb (dgl.data.lrgb): the check must stay off there too
        "from qtrain.data.ogb import import_ogb_dataset\n"
        "import_ogb_dataset()\n"
        "print('ogb' in sys.modules, repr(sys.modules.get('outdated', 'absent')))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "'absent'"], out.stdout + out.stderr


def test_arxiv_through_ogb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_arxiv(tmp_path)
    ds = load_dataset("ogbn-arxiv", {"root": str(tmp_path)})
    assert capsys.readouterr().out == "", "ogb's prints must stay off standard output"
    g = ds.graph
    pairs = edges()
    expected = {(int(a), int(b)) for a, b in pairs} | {(int(b), int(a)) for a, b in pairs}
    src, dst = g.edges()
    assert set(zip(src.tolist(), dst.tolist(), strict=True)) == expected and g.num_edges() == len(
        expected
    )
    labels = pd.read_csv(folder / "raw" / "node-label.csv.gz", header=None).values[:, 0]
    assert torch.equal(g.ndata["label"], torch.from_numpy(labels))
    assert g.ndata["feat"].shape == (N, 4) and ds.num_classes == 40 and ds.metric == "accuracy"
    assert [int(g.ndata[k].sum()) for k in ("train_mask", "val_mask", "test_mask")] == [15, 5, 10]
    assert ds.info["folder"] == str(folder) and ds.info["split"]["name"] == "time"
    assert (folder / "processed" / "dgl_data_processed").is_file()

    # the second load reads ogb's processed copy; without reverse edges the graph is as stored
    directed = load_dataset("ogbn-arxiv", {"root": str(tmp_path), "to_bidirected": False})
    assert directed.graph.num_edges() == E


def test_default_root_is_data_dir_ogb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_arxiv(tmp_path / "store" / "ogb")
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "store"))
    assert load_dataset("ogbn-arxiv").graph.num_nodes() == N


def test_proteins_is_multilabel_with_edge_mean_features(tmp_path: Path) -> None:
    folder = write_proteins(tmp_path)
    ds = load_dataset("ogbn-proteins", {"root": str(tmp_path)})
    g = ds.graph
    assert ds.metric == "micro_f1" and ds.num_classes == 112
    assert g.ndata["label"].dtype == torch.float32 and g.ndata["label"].shape == (N, 112)
    assert g.num_edges() == 2 * E  # ogb stores both directions itself
    efeat = pd.read_csv(folder / "raw" / "edge-feat.csv.gz", header=None).values
    pairs = edges()
    node = int(pairs[0, 1])
    incoming = np.concatenate([efeat[pairs[:, 1] == node], efeat[pairs[:, 0] == node]])
    assert np.allclose(g.ndata["feat"][node].numpy(), incoming.mean(0), atol=1e-5)
    assert ds.info["ogb_metric"] == "rocauc"


def test_mag_keeps_papers_only(tmp_path: Path) -> None:
    write_mag(tmp_path)
    ds = load_dataset("ogbn-mag", {"root": str(tmp_path), "to_bidirected": False})
    g = ds.graph
    assert g.num_nodes() == N and g.num_edges() == E and ds.num_classes == 349
    assert g.ndata["feat"].shape == (N, 6) and "year" in g.ndata
    assert [int(g.ndata[k].sum()) for k in ("train_mask", "val_mask", "test_mask")] == [15, 5, 10]


def _relational_mag(tmp_path: Path, **table: Any) -> Any:
    with pytest.warns(
        UserWarning,
        match=r"node types \['author', 'field_of_study', 'institution'\] have no features",
    ):
        return load_dataset("ogbn-mag", {"root": str(tmp_path), "relational": True, **table})


def test_mag_relational_has_every_type_and_reverse_relations(tmp_path: Path) -> None:
    folder = write_mag(tmp_path)
    ds = _relational_mag(tmp_path)
    rel, g = ds.relations, ds.graph
    assert rel.ntypes == tuple(MAG_SIZES) and rel.target == "paper"
    reverse = {(d, f"rev-{r}", s): (s, r, d) for s, r, d in MAG_EDGES}
    assert set(rel.etypes) == set(MAG_EDGES) | set(reverse) and rel.num_etypes == 8
    assert g.num_nodes() == sum(MAG_SIZES.values())
    assert g.num_edges() == 2 * sum(MAG_EDGES.values())
    offset = dict(zip(MAG_SIZES, np.cumsum([0, *MAG_SIZES.values()]).tolist(), strict=False))
    src, dst = g.edges()
    for r, (s, name, d) in enumerate(rel.etypes):
        pairs = mag_edges(reverse.get((s, name, d), (s, name, d)))
        if (s, name, d) in reverse:
            pairs = pairs[:, ::-1]  # the reverse relation: every edge of its relation, turned
        mine = g.edata["etype"] == r
        assert src[mine].tolist() == (pairs[:, 0] + offset[s]).tolist(), (s, name, d)
        assert dst[mine].tolist() == (pairs[:, 1] + offset[d]).tolist(), (s, name, d)
    # paper features on the papers, zeros on the featureless types
    lo = offset["paper"]
    feat = pd.read_csv(folder / "raw" / "node-feat" / "paper" / "node-feat.csv.gz", header=None)
    torch.testing.assert_close(g.ndata["feat"][lo:], torch.from_numpy(feat.values).float())
    assert ds.num_features == 6 and not g.ndata["feat"][:lo].any()
    labels = pd.read_csv(folder / "raw" / "node-label" / "paper" / "node-label.csv.gz", header=None)
    assert g.ndata["label"][lo:].tolist() == labels.values[:, 0].tolist()
    assert ds.num_classes == 349 and ds.metric == "accuracy"
    # the split on the papers only
    perm = np.random.default_rng(1).permutation(N)
    for key, ids in (
        ("train_mask", perm[:15]),
        ("val_mask", perm[15:20]),
        ("test_mask", perm[20:]),
    ):
        assert not g.ndata[key][:lo].any()
        assert sorted(g.ndata[key].nonzero().flatten().tolist()) == sorted((ids + lo).tolist())
    assert ds.info["featureless_ntypes"] == ["author", "field_of_study", "institution"]
    assert ds.info["nodes_per_type"] == MAG_SIZES and ds.info["to_bidirected"] is True
    assert ds.info["edges_per_relation"]["paper/rev-cites/paper"] == E
    ds.validate()


def test_mag_relational_without_reverse_relations_and_paper_only_still(tmp_path: Path) -> None:
    """to_bidirected = false keeps the stored relations only; both read ogb's processed
    file, which the first load wrote, and the default (paper-only) load is unchanged."""
    write_mag(tmp_path)
    _relational_mag(tmp_path)
    ds = _relational_mag(tmp_path, to_bidirected=False)
    assert ds.relations.etypes == tuple(MAG_EDGES)
    assert ds.graph.num_edges() == sum(MAG_EDGES.values())
    papers = load_dataset("ogbn-mag", {"root": str(tmp_path), "to_bidirected": False})
    assert papers.relations is None and papers.graph.num_nodes() == N
    assert papers.graph.num_edges() == E


def test_a_relational_model_trains_on_relational_mag(tmp_path: Path) -> None:
    from qtrain.recipe import build_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    write_mag(tmp_path)
    raw = {
        "model": {"name": "rgcn", "hidden": 8},
        "dataset": {"name": "ogbn-mag", "root": str(tmp_path), "relational": True},
        "train": {"epochs": 2},
        "quant": {"plugin": []},
        "output": {"dir": str(tmp_path / "runs"), "checkpoint": False},
    }
    with pytest.warns(UserWarning, match="have no features"):
        summary = execute(build_recipe(raw, "mag-rgcn"), reporter=Reporter())
    assert summary["status"] == "completed", summary.get("error")
    assert summary["model"] == "rgcn" and summary["epochs"] == 2
    assert summary["dataset_info"]["target"] == "paper"
    assert 0.0 <= summary["test_acc"] <= 1.0


def test_relational_on_a_homogeneous_dataset_is_one_line(tmp_path: Path) -> None:
    write_arxiv(tmp_path)
    with pytest.raises(DatasetError) as err:
        load_dataset("ogbn-arxiv", {"root": str(tmp_path), "relational": True})
    message = str(err.value)
    assert "relational = true needs a heterogeneous dataset" in message and "\n" not in message


@pytest.mark.parametrize("relational", [True, False])
@pytest.mark.parametrize(
    ("triplet", "bad"),
    [
        (("author", "affiliated_with", "institution"), [0, MAG_SIZES["institution"]]),
        (("author", "writes", "paper"), [MAG_SIZES["author"], 0]),
    ],
)
def test_mag_edge_past_its_types_nodes_is_one_line(
    tmp_path: Path, relational: bool, triplet: tuple[str, str, str], bad: list[int]
) -> None:
    folder = write_mag(tmp_path)
    rows = np.vstack([mag_edges(triplet)[:-1], [bad]])
    csv(folder / "raw" / "relations" / "___".join(triplet) / "edge.csv.gz", rows)
    with pytest.raises(DatasetError) as err:
        load_dataset("ogbn-mag", {"root": str(tmp_path), "relational": relational})
    message = str(err.value)
    src, _, dst = triplet
    node = f"{src} node {bad[0]}" if bad[0] else f"{dst} node {bad[1]}"
    assert f"is corrupt: raw/relations/{'___'.join(triplet)}/edge.csv.gz names {node}" in message
    assert "\n" not in message, message
    assert not (folder / "processed" / "dgl_data_processed").exists()


def _processed_mag(tmp_path: Path, change: Callable[[Any], Any]) -> None:
    """A processed file for the fake mag, ogb's own, whose heterograph ``change`` alters."""
    from qtrain._compat import import_dgl
    from qtrain.data.ogb import import_ogb_dataset

    folder = write_mag(tmp_path)
    with warnings.catch_warnings():  # ogb hands pandas' read-only arrays to torch.from_numpy
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        graph, labels = import_ogb_dataset()(name="ogbn-mag", root=str(tmp_path))[0]
    path = folder / "processed" / "dgl_data_processed"
    path.unlink()
    import_dgl().save_graphs(str(path), [change(graph)], labels)


def _without_paper_features(graph: Any) -> Any:
    graph.nodes["paper"].data.pop("feat")
    return graph


def _with_author_features(graph: Any) -> Any:
    graph.nodes["author"].data["feat"] = torch.ones(MAG_SIZES["author"], 3)
    return graph


def _with_rev_writes(graph: Any) -> Any:
    from qtrain._compat import import_dgl

    relations = {c: graph.edges(etype=c) for c in graph.canonical_etypes}
    relations[("paper", "rev-writes", "author")] = (torch.tensor([0]), torch.tensor([0]))
    out = import_dgl().heterograph(relations, num_nodes_dict=MAG_SIZES)
    out.nodes["paper"].data["feat"] = graph.nodes["paper"].data["feat"]
    return out


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (_without_paper_features, "the papers have no features"),
        (_with_author_features, "different widths"),
        (_with_rev_writes, "cannot take its name; set to_bidirected = false"),
    ],
)
def test_mag_relational_refuses_odd_processed_files(
    tmp_path: Path, change: Callable[[Any], Any], says: str
) -> None:
    _processed_mag(tmp_path, change)
    with pytest.raises(DatasetError, match=says) as err:
        load_dataset("ogbn-mag", {"root": str(tmp_path), "relational": True})
    assert "\n" not in str(err.value)


def test_missing_folder_says_where_and_how(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        load_dataset("ogbn-products", {"root": str(tmp_path)})
    message = str(err.value)
    assert str(tmp_path / "ogbn_products") in message
    assert "products.zip" in message and "rename the folder products/ to ogbn_products/" in message
    assert "never downloads" in message and "\n" not in message


def test_missing_release_file(tmp_path: Path) -> None:
    folder = write_arxiv(tmp_path)
    (folder / "RELEASE_v1.txt").unlink()
    with pytest.raises(DatasetError, match=r"has no RELEASE_v1\.txt"):
        load_dataset("ogbn-arxiv", {"root": str(tmp_path)})


def test_missing_raw_file_is_named(tmp_path: Path) -> None:
    folder = write_arxiv(tmp_path)
    (folder / "raw" / "node-label.csv.gz").unlink()
    with pytest.raises(DatasetError) as err:
        load_dataset("ogbn-arxiv", {"root": str(tmp_path)})
    assert str(folder / "raw" / "node-label.csv.gz") in str(err.value)


def test_missing_split_is_named(tmp_path: Path) -> None:
    folder = write_arxiv(tmp_path)
    (folder / "split" / "time" / "valid.csv.gz").unlink()
    with pytest.raises(DatasetError, match=r"official split file .*valid\.csv\.gz"):
        load_dataset("ogbn-arxiv", {"root": str(tmp_path)})


def test_corrupt_processed_file(tmp_path: Path) -> None:
    folder = write_arxiv(tmp_path)
    (folder / "processed").mkdir()
    (folder / "processed" / "dgl_data_processed").write_bytes(b"garbage" * 10)
    with pytest.raises(DatasetError) as err:
        load_dataset("ogbn-arxiv", {"root": str(tmp_path)})
    message = str(err.value)
    assert "ogb could not read" in message and "delete it" in message and "\n" not in message


class _Hostile:
    """Unpickling this runs a shell command: a weights-only read refuses it first."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        import os

        return (os.system, (f"touch {self.marker}",))


def test_split_dict_is_read_weights_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_arxiv(tmp_path)
    marker = tmp_path / "pwned"
    path = folder / "split" / "time" / "split_dict.pt"
    torch.save({"train": torch.arange(3), "valid": _Hostile(marker), "test": []}, path)
    # what made ogb's own torch.load run the file's code
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(DatasetError) as err:
        load_dataset("ogbn-arxiv", {"root": str(tmp_path)})
    message = str(err.value)
    assert str(path) in message and "refusing" in message and "\n" not in message
    assert not marker.exists()


def test_split_dict_of_tensors_is_used(tmp_path: Path) -> None:
    folder = write_arxiv(tmp_path)
    ids = {"train": torch.tensor([0, 1, 2]), "valid": torch.tensor([3]), "test": torch.arange(4, 9)}
    torch.save(ids, folder / "split" / "time" / "split_dict.pt")
    g = load_dataset("ogbn-arxiv", {"root": str(tmp_path)}).graph
    assert torch.equal(torch.nonzero(g.ndata["train_mask"]).flatten(), ids["train"])
    assert [int(g.ndata[k].sum()) for k in ("train_mask", "val_mask", "test_mask")] == [3, 1, 5]


@pytest.mark.parametrize(
    ("split_dict", "expected"),
    [
        (
            {"train": torch.tensor([0, N]), "valid": [], "test": []},
            rf"train split holds node id {N}",
        ),
        ({"train": torch.tensor([-1]), "valid": [], "test": []}, "train split holds node id -1"),
        ({"train": torch.ones(2, 2).long(), "valid": [], "test": []}, "1-D list of integer"),
        ({"train": torch.tensor([0.5]), "valid": [], "test": []}, "1-D list of integer"),
        ({"train": torch.tensor([0])}, "keys train, valid, test"),
        ([1, 2, 3], "keys train, valid, test"),
    ],
)
def test_bad_split_dict_is_one_line(tmp_path: Path, split_dict: object, expected: str) -> None:
    folder = write_arxiv(tmp_path)
    torch.save(split_dict, folder / "split" / "time" / "split_dict.pt")
    with pytest.raises(DatasetError, match=expected) as err:
        load_dataset("ogbn-arxiv", {"root": str(tmp_path)})
    assert "\n" not in str(err.value)


def test_processed_file_is_checked_against_its_recorded_checksum(tmp_path: Path) -> None:
    """ogb's processed file has no checksum: qtrain records one when ogb writes it, refuses a
    changed file naming it, and the remedy (delete it) works."""
    folder = write_arxiv(tmp_path)
    first = load_dataset("ogbn-arxiv", {"root": str(tmp_path)})
    path = folder / "processed" / "dgl_data_processed"
    assert (folder / "processed" / "dgl_data_processed.crc32").is_file()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of the last array
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError) as err:
        load_dataset("ogbn-arxiv", {"root": str(tmp_path)})
    message = str(err.value)
    assert "does not match the checksum" in message and f"delete it ({path})" in message
    path.unlink()
    again = load_dataset("ogbn-arxiv", {"root": str(tmp_path)})  # rebuilt from raw/
    assert torch.equal(first.graph.ndata["feat"], again.graph.ndata["feat"])
    assert load_dataset("ogbn-arxiv", {"root": str(tmp_path)}).graph.num_nodes() == N
