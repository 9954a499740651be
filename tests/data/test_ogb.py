"""OGB loader: tiny datasets written here in ogb's raw on-disk format, read through ogb itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from ogb_files import E, N, edges, write_arxiv, write_mag, write_proteins

from qtrain.data import DATASETS, load_dataset
from qtrain.errors import DatasetError


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "data"))


def test_registered_names() -> None:
    for name in ("ogbn-arxiv", "ogbn-products", "ogbn-proteins", "ogbn-mag", "ogbn-papers100M"):
        assert name in DATASETS
    defaults = {o.name: o.default for o in DATASETS.get("ogbn-arxiv").describe()}
    assert defaults == {"root": "", "to_bidirected": True}
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
