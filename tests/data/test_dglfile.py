"""dgl-file loader: graphs saved here with dgl.save_graphs, and every way such a file can be wrong."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from qtrain._compat import import_dgl
from qtrain.data import load_dataset
from qtrain.errors import DatasetError, RecipeError

dgl = import_dgl()
N = 12


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "data"))


def make_graph(**ndata: torch.Tensor) -> Any:
    g = dgl.graph((torch.arange(N), (torch.arange(N) + 1) % N), num_nodes=N)
    torch.manual_seed(0)
    g.ndata["feat"] = torch.randn(N, 5, dtype=torch.float64)
    g.ndata["label"] = torch.arange(N) % 3
    g.ndata["train_mask"] = torch.arange(N) < 6
    g.ndata["val_mask"] = (torch.arange(N) >= 6) & (torch.arange(N) < 9)
    g.ndata["test_mask"] = torch.arange(N) >= 9
    g.edata["weight"] = torch.ones(N)
    for key, value in ndata.items():
        g.ndata[key] = value
    return g


def save(path: Path, *graphs: Any) -> str:
    dgl.save_graphs(str(path), list(graphs))
    return str(path)


def test_loads_standard_fields(tmp_path: Path) -> None:
    path = save(tmp_path / "g.bin", make_graph())
    ds = load_dataset("dgl-file", {"path": path})
    g = ds.graph
    assert ds.num_classes == 3 and ds.metric == "accuracy" and ds.name == "dgl-file"
    assert g.ndata["feat"].dtype == torch.float32 and g.ndata["label"].dtype == torch.int64
    assert g.num_edges() == N and "weight" in g.edata  # graph as saved: nothing added or dropped
    assert ds.info["path"] == path and ds.info["nodes"] == N


def test_custom_field_names_second_graph_and_loose_dtypes(tmp_path: Path) -> None:
    custom = make_graph(
        x=torch.randint(0, 2, (N, 4), dtype=torch.uint8),
        y=(torch.arange(N) % 4).reshape(N, 1).int(),
        tr=(torch.arange(N) < 4).to(torch.uint8),
        va=(torch.arange(N) == 5).float(),
        te=(torch.arange(N) > 8).long(),
    )
    path = save(tmp_path / "two.bin", make_graph(), custom)
    options = {
        "path": path,
        "graph_index": 1,
        "feat": "x",
        "label": "y",
        "train_mask": "tr",
        "val_mask": "va",
        "test_mask": "te",
        "num_classes": 10,
    }
    ds = load_dataset("dgl-file", options)
    g = ds.graph
    assert ds.num_classes == 10
    assert g.ndata["label"].shape == (N,) and g.ndata["label"].dtype == torch.int64
    assert g.ndata["feat"].dtype == torch.float32 and g.ndata["feat"].shape == (N, 4)
    assert [int(g.ndata[k].sum()) for k in ("train_mask", "val_mask", "test_mask")] == [4, 1, 3]
    assert all(g.ndata[k].dtype == torch.bool for k in ("train_mask", "val_mask", "test_mask"))


def test_multilabel_is_micro_f1(tmp_path: Path) -> None:
    labels = (torch.rand(N, 4) > 0.5).float()
    path = save(tmp_path / "multi.bin", make_graph(label=labels))
    ds = load_dataset("dgl-file", {"path": path})
    assert ds.metric == "micro_f1" and ds.multilabel and ds.num_classes == 4
    assert torch.equal(ds.graph.ndata["label"], labels)


def test_negative_labels_outside_masks_become_unlabelled(tmp_path: Path) -> None:
    label = torch.arange(N) % 3
    label[11] = -1
    mask = torch.arange(N) < 11
    path = save(
        tmp_path / "g.bin", make_graph(label=label, test_mask=mask & (torch.arange(N) >= 9))
    )
    ds = load_dataset("dgl-file", {"path": path})
    assert ds.info["unlabelled_nodes"] == 1 and int(ds.graph.ndata["label"][11]) == 0


def error(tmp_path: Path, options: dict[str, Any]) -> str:
    with pytest.raises(DatasetError) as err:
        load_dataset("dgl-file", options)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_file(tmp_path: Path) -> None:
    message = error(tmp_path, {"path": str(tmp_path / "nope.bin")})
    assert str(tmp_path / "nope.bin") in message and "does not exist" in message


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert "is not a file" in error(tmp_path, {"path": str(tmp_path)})


def test_path_is_required() -> None:
    with pytest.raises(RecipeError, match=r"missing key dataset\.path"):
        load_dataset("dgl-file", {})


def test_random_bytes_are_not_a_dgl_file(tmp_path: Path) -> None:
    path = tmp_path / "noise.bin"
    path.write_bytes(os.urandom(4096))
    assert "is not a DGL graph file" in error(tmp_path, {"path": str(path)})
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert "is not a DGL graph file" in error(tmp_path, {"path": str(empty)})


def test_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "g.bin"
    save(path, make_graph())
    path.write_bytes(path.read_bytes()[:300])
    message = error(tmp_path, {"path": str(path)})
    assert "truncated or corrupt" in message and str(path) in message


def test_graph_index_out_of_range(tmp_path: Path) -> None:
    path = save(tmp_path / "g.bin", make_graph(), make_graph())
    message = error(tmp_path, {"path": path, "graph_index": 2})
    assert "holds 2 graph(s)" in message and "0 to 1" in message


def test_missing_field_lists_those_present(tmp_path: Path) -> None:
    path = save(tmp_path / "g.bin", make_graph())
    message = error(tmp_path, {"path": path, "label": "y"})
    assert "'y'" in message and "feat, label, test_mask, train_mask, val_mask" in message


@pytest.mark.parametrize(
    ("ndata", "fragment"),
    [
        ({"feat": torch.randn(N)}, "feature field 'feat' is float32 [12]"),
        ({"label": torch.rand(N)}, "single-label classes must be integers"),
        ({"label": torch.full((N, 3), 0.5)}, "values other than 0 and 1"),
        ({"train_mask": torch.full((N,), 2)}, "holds values other than 0 and 1"),
        ({"val_mask": torch.ones(N, 2, dtype=torch.bool)}, "expected [12] of bool or 0/1"),
        ({"label": torch.arange(N) - 1}, "negative labels on nodes inside"),
    ],
)
def test_wrong_dtype_or_shape(
    tmp_path: Path, ndata: dict[str, torch.Tensor], fragment: str
) -> None:
    path = save(tmp_path / "g.bin", make_graph(**ndata))
    assert fragment in error(tmp_path, {"path": path})


def test_num_classes_too_small(tmp_path: Path) -> None:
    path = save(tmp_path / "g.bin", make_graph())
    assert "labels go up to 2" in error(tmp_path, {"path": path, "num_classes": 2})


def test_a_stray_huge_label_is_refused_not_built_into_the_output_layer(tmp_path: Path) -> None:
    label = torch.arange(N) % 3
    label[4] = 10**9  # one changed value once made a 1e9-class output layer
    path = save(tmp_path / "g.bin", make_graph(label=label))
    message = error(tmp_path, {"path": path})
    assert f"goes up to {10**9}, but the graph has {N} nodes" in message


def make_heterograph(**paper: torch.Tensor) -> Any:
    """Papers (the target: features, labels, masks), authors (features), venues (none)."""
    g = dgl.heterograph(
        {
            ("author", "writes", "paper"): ([0, 1, 2, 2], [0, 1, 2, 3]),
            ("paper", "cites", "paper"): ([1, 2, 3], [0, 0, 1]),
            ("venue", "hosts", "paper"): ([0, 0, 1], [0, 2, 3]),
        },
        num_nodes_dict={"author": 3, "paper": 4, "venue": 2},
    )
    torch.manual_seed(0)
    g.nodes["paper"].data["feat"] = torch.randn(4, 5)
    g.nodes["author"].data["feat"] = torch.randn(3, 5)
    g.nodes["paper"].data["label"] = torch.tensor([0, 1, 1, 0])
    g.nodes["paper"].data["train_mask"] = torch.tensor([True, True, False, False])
    g.nodes["paper"].data["val_mask"] = torch.tensor([False, False, True, False])
    g.nodes["paper"].data["test_mask"] = torch.tensor([False, False, False, True])
    for key, value in paper.items():
        g.nodes["paper"].data[key] = value
    return g


def test_a_heterograph_becomes_a_relational_dataset(tmp_path: Path) -> None:
    hetero = make_heterograph()
    path = save(tmp_path / "h.bin", hetero)
    with pytest.warns(UserWarning, match=r"node types \['venue'\] have no 'feat' field"):
        ds = load_dataset("dgl-file", {"path": path, "target": "paper"})
    rel, g = ds.relations, ds.graph
    assert rel.ntypes == ("author", "paper", "venue") and rel.target == "paper"
    assert rel.etypes == tuple(hetero.canonical_etypes)
    assert ds.num_classes == 2 and ds.info["featureless_ntypes"] == ["venue"]
    assert ds.info["nodes_per_type"] == {"author": 3, "paper": 4, "venue": 2}
    # nodes grouped by type in the file's order; every relation's edges at the offsets
    assert g.ndata["ntype"].tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2]
    src, dst = g.edges()
    for r, c in enumerate(rel.etypes):
        u, v = hetero.edges(etype=c)
        off = {"author": 0, "paper": 3, "venue": 7}
        mine = g.edata["etype"] == r
        assert src[mine].tolist() == (u + off[c[0]]).tolist()
        assert dst[mine].tolist() == (v + off[c[2]]).tolist()
    torch.testing.assert_close(g.ndata["feat"][3:7], hetero.nodes["paper"].data["feat"])
    torch.testing.assert_close(g.ndata["feat"][0:3], hetero.nodes["author"].data["feat"])
    assert not g.ndata["feat"][7:].any()
    assert g.ndata["label"][3:7].tolist() == [0, 1, 1, 0]
    assert g.ndata["train_mask"].nonzero().flatten().tolist() == [3, 4]


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({}, r"node types \['author', 'paper', 'venue'\]; set target"),
        ({"target": "venues"}, "target = 'venues' is not one of them"),
        ({"target": "author"}, "has no node-data field 'train_mask' of type 'author'"),
        ({"target": "paper", "feat": "x"}, "no node type has the feature field 'x'"),
    ],
)
def test_heterograph_mistakes_are_one_line(tmp_path: Path, table: dict, says: str) -> None:
    path = save(tmp_path / "h.bin", make_heterograph())
    message = error(tmp_path, {"path": path, **table})
    assert re.search(says, message), message


def test_heterograph_feature_widths_must_agree(tmp_path: Path) -> None:
    g = make_heterograph()
    g.nodes["author"].data["feat"] = torch.randn(3, 7)
    path = save(tmp_path / "h.bin", g)
    assert "different widths" in error(tmp_path, {"path": path, "target": "paper"})


def test_target_on_a_homogeneous_graph_is_refused(tmp_path: Path) -> None:
    path = save(tmp_path / "g.bin", make_graph())
    assert "the graph is homogeneous" in error(tmp_path, {"path": path, "target": "paper"})


def test_a_corrupt_heterograph_is_caught_before_dgl_builds_it() -> None:
    from qtrain.data.dgl_reader import build_heterograph

    contents = {
        "ntype_names": ["a", "b"],
        "type_sizes": [2, 3],
        "canonical_etypes": [("a", "r", "b")],
        "type_edges": [(torch.tensor([0, 1]), torch.tensor([2, 3]))],
        "type_ndata": {},
    }
    with pytest.raises(DatasetError, match=r"relation 'r' names 'b' node 3, outside 0..2"):
        build_heterograph(contents, "file")
    contents["type_edges"] = [(torch.tensor([0, 1]), torch.tensor([2, 1]))]
    contents["type_ndata"] = {"a": {"feat": torch.zeros(5, 2)}}
    with pytest.raises(DatasetError, match=r"'feat' of type 'a' has .* rows for 2 nodes"):
        build_heterograph(contents, "file")
