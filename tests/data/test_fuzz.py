"""Hostile dataset files: every mutated copy loads correctly or fails with one DatasetError line.

The loads run in a child process, so a segfault or an abort (what a crafted
sparse matrix did to the Planetoid reader) fails the test with the case
named, instead of killing the test session.
"""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from planetoid_files import PARTS, tiny_objects, write_planetoid

from tests.conftest import PLANETOID_DATA

# Loads every case it reads from standard input, one JSON object per line; prints
# "start" before a load so that a crash names the case it died in.
CHILD = r"""
import json, sys
import numpy as np
from qtrain.data import load_dataset
from qtrain.errors import DatasetError

for line in sys.stdin:
    case = json.loads(line)
    print(json.dumps({"id": case["id"], "start": True}), flush=True)
    try:
        ds = load_dataset(case["name"], case["options"])
        feat = ds.graph.ndata["feat"].numpy()
        result = {"ok": bool(np.isfinite(feat).all()), "nodes": int(ds.graph.num_nodes())}
    except DatasetError as exc:
        result = {"error": str(exc)}
    except BaseException as exc:
        result = {"unexpected": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({"id": case["id"], **result}), flush=True)
"""


@dataclass
class Case:
    id: str
    name: str
    options: dict[str, Any]
    must_fail: bool  # a structural attack: a load that succeeds is a failure too


def load_in_child(cases: list[Case], timeout: float = 300) -> dict[str, dict[str, Any]]:
    """Run every case in one child process; fail naming the case if the child dies."""
    stdin = "".join(json.dumps(vars(c)) + "\n" for c in cases)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    results: dict[str, dict[str, Any]] = {}
    last = None
    for line in proc.stdout.splitlines():
        record = json.loads(line)
        if record.pop("start", False):
            last = record["id"]
        else:
            results[record.pop("id")] = record
    assert proc.returncode == 0, (
        f"the loader died (exit {proc.returncode}) on case {last!r}: {proc.stderr[-2000:]}"
    )
    return results


def check(cases: list[Case], results: dict[str, dict[str, Any]]) -> None:
    problems = []
    for case in cases:
        got = results[case.id]
        if "unexpected" in got:
            problems.append(f"{case.id}: not a DatasetError: {got['unexpected'][:300]}")
        elif "error" in got and "\n" in got["error"]:
            problems.append(f"{case.id}: the error spans several lines: {got['error'][:300]}")
        elif "ok" in got and (case.must_fail or not got["ok"]):
            problems.append(f"{case.id}: loaded (finite features: {got['ok']}) but must fail")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ structural attacks


def _csr_with(**attrs: Any) -> Callable[[dict[str, Any]], None]:
    """Replace attributes of allx as a pickle would: straight into __dict__, no checks."""

    def mutate(objects: dict[str, Any]) -> None:
        m = objects["allx"].copy()
        for key, value in attrs.items():
            m.__dict__[key] = value(m) if callable(value) else value
        objects["allx"] = m

    return mutate


def _indices(change: Callable[[np.ndarray], None]) -> Callable[[Any], np.ndarray]:
    def make(m: Any) -> np.ndarray:
        out = m.indices.copy()
        change(out)
        return out

    return make


def _set(part: str, value: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(objects: dict[str, Any]) -> None:
        objects[part] = value(objects)

    return mutate


def _shared_lists(objects: dict[str, Any]) -> None:
    shared = list(range(500))  # one list, pickled once, referenced by every node
    objects["graph"] = collections.defaultdict(list, {i: shared for i in range(500)})
    big = list(range(20_000))
    for i in range(500):
        objects["graph"][i] = big


def _width_zero(objects: dict[str, Any]) -> None:
    for part in ("x", "tx", "allx"):
        objects[part] = sp.csr_matrix((objects[part].shape[0], 0), dtype=np.float32)


def _graph_entry(value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(objects: dict[str, Any]) -> None:
        objects["graph"][5] = value

    return mutate


STRUCTURAL: dict[str, Callable[[dict[str, Any]], None]] = {
    "column index past the width": _csr_with(indices=_indices(lambda a: a.__setitem__(3, 10**8))),
    "negative column index": _csr_with(indices=_indices(lambda a: a.__setitem__(0, -7))),
    "indptr decreasing": _csr_with(indptr=lambda m: m.indptr[::-1].copy()),
    "indptr too short": _csr_with(indptr=lambda m: m.indptr[:-5].copy()),
    "indptr past the values": _csr_with(indptr=lambda m: m.indptr * 3),
    "indptr not from 0": _csr_with(indptr=lambda m: m.indptr + 1),
    "data shorter than indices": _csr_with(data=lambda m: m.data[:-3].copy()),
    "huge declared shape": _csr_with(_shape=(10**7, 10**7)),
    "negative shape": _csr_with(_shape=(-5, 6)),
    "3-D shape": _csr_with(_shape=(510, 6, 2)),
    "float shape": _csr_with(_shape=(510.0, 6.0)),
    "NaN feature": _csr_with(data=lambda m: np.where(np.arange(len(m.data)) == 2, np.nan, m.data)),
    "infinite feature": _csr_with(data=lambda m: np.full_like(m.data, np.inf)),
    "object data": _csr_with(data=lambda m: np.array([object()] * len(m.data), dtype=object)),
    "float indices": _csr_with(indices=lambda m: m.indices.astype(np.float64)),
    "indices as a list": _csr_with(indices=lambda m: m.indices.tolist()),
    "structured labels": _set("ally", lambda o: np.zeros(len(o["ally"]), dtype=[("a", "<i4")])),
    "complex labels": _set("ally", lambda o: o["ally"].astype(np.complex64)),
    "multi-hot label": _set("y", lambda o: np.ones_like(o["y"])),
    "label value 2": _set("ty", lambda o: o["ty"] * 2),
    "1-D labels": _set("ally", lambda o: o["ally"].argmax(1)),
    "3-D labels": _set("ally", lambda o: o["ally"][:, :, None]),
    "labels as a list": _set("y", lambda o: o["y"].tolist()),
    "dense NaN features": _set("tx", lambda o: np.full((10, 6), np.nan, dtype=np.float32)),
    "features as a string": _set("x", lambda o: "features"),
    "rows of allx and ally differ": _set("ally", lambda o: o["ally"][:-1]),
    "width 0 in x only": _set("x", lambda o: sp.csr_matrix((4, 0), dtype=np.float32)),
    "width 0 everywhere": _width_zero,
    "adjacency lists shared by every node": _shared_lists,
    "node id past the graph": _graph_entry([10**6]),
    "negative node id": _graph_entry([-1]),
    "adjacency entry a string": _graph_entry(["7"]),
    "adjacency entry a float": _graph_entry([7.5]),
    "adjacency list a dict": _graph_entry({1: 2}),
    "adjacency list an int": _graph_entry(7),
    "graph a list": _set("graph", lambda o: [[1], [2]]),
}

TEST_INDEX: dict[str, str] = {
    "test id 400,000 (one line changed)": "400000\n",
    "test id before allx ends": "3\n",
    "negative test id": "-4\n",
    "duplicate test id": "515\n",
    "test id of 100 digits": "9" * 100 + "\n",
    "test id a float": "515.5\n",
    "binary test.index": "\x00\xff\n",
}


def _structural_cases(root: Path) -> list[Case]:
    cases = []
    for i, (label, mutate) in enumerate(STRUCTURAL.items()):
        objects = tiny_objects()
        mutate(objects)
        folder = root / f"s{i}"
        write_planetoid(folder, "cora", objects)
        cases.append(Case(label, "cora", {"root": str(folder)}, must_fail=True))
    for i, (label, last_line) in enumerate(TEST_INDEX.items()):
        folder = write_planetoid(root / f"t{i}", "cora")
        index = folder / "ind.cora.test.index"
        lines = index.read_text().splitlines(keepends=True)
        index.write_text("".join(lines[:-1]) + last_line)
        cases.append(Case(label, "cora", {"root": str(root / f"t{i}")}, must_fail=True))
    return cases


def test_structural_attacks_on_planetoid_files_fail_cleanly(tmp_path: Path) -> None:
    cases = _structural_cases(tmp_path)
    check(cases, load_in_child(cases))


# -------------------------------------------------------------------- random bytes


def _byte_cases(source: Path, name: str, root: Path, per_file: int, seed: int) -> list[Case]:
    """Copies of the dataset at ``source`` with one file's bytes changed or cut short."""
    rng = random.Random(seed)
    cases = []
    for part in (*PARTS, "test.index"):
        original = (source / f"ind.{name}.{part}").read_bytes()
        for k in range(per_file):
            data = bytearray(original)
            if k == 0:
                data = data[: rng.randrange(len(data))]
                how = f"cut at {len(data)}"
            else:
                spots = [rng.randrange(len(data)) for _ in range(rng.randint(1, 4))]
                for spot in spots:
                    data[spot] = rng.randrange(256)
                how = f"bytes {spots} changed"
            folder = root / f"{name}-{part}-{k}" / "planetoid" / name
            folder.mkdir(parents=True)
            for other in (*PARTS, "test.index"):
                target = folder / f"ind.{name}.{other}"
                if other == part:
                    target.write_bytes(bytes(data))
                else:
                    target.symlink_to(source / f"ind.{name}.{other}")
            cases.append(Case(f"{part} {how}", name, {"root": str(folder.parents[1])}, False))
    return cases


def test_random_byte_changes_to_a_tiny_dataset(tmp_path: Path) -> None:
    source = write_planetoid(tmp_path / "source", "citeseer")
    cases = _byte_cases(source, "citeseer", tmp_path / "cases", per_file=8, seed=0)
    check(cases, load_in_child(cases))


@pytest.mark.skipif(
    not (PLANETOID_DATA / "planetoid" / "cora").is_dir(),
    reason=f"real Cora not found at {PLANETOID_DATA / 'planetoid' / 'cora'}",
)
def test_random_byte_changes_to_real_cora(tmp_path: Path) -> None:
    source = PLANETOID_DATA / "planetoid" / "cora"
    cases = _byte_cases(source, "cora", tmp_path, per_file=4, seed=1)
    check(cases, load_in_child(cases))


def test_pickles_that_rebuild_numpy_internals_are_refused(tmp_path: Path) -> None:
    """Pickles written by hand: _reconstruct with a real shape, a dtype with fields."""
    folder = write_planetoid(tmp_path / "a", "cora")
    # _reconstruct(ndarray, (10**12,), b'b'): would ask NumPy for a terabyte
    (folder / "ind.cora.y").write_bytes(
        b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
        b"\x8a\x06\x00\x10\xa5\xd4\xe8\x00\x85C\x01b\x87R."
    )
    folder = write_planetoid(tmp_path / "b", "cora")
    # dtype('f8') whose state claims named fields
    (folder / "ind.cora.ty").write_bytes(
        b"\x80\x02cnumpy\ndtype\nX\x02\x00\x00\x00f8\x89\x88\x87R"
        b"(K\x03X\x01\x00\x00\x00<N(X\x01\x00\x00\x00aX\x01\x00\x00\x00bt}J\xff\xff\xff\xff"
        b"J\xff\xff\xff\xffK\x00tb."
    )
    cases = [
        Case("terabyte _reconstruct", "cora", {"root": str(tmp_path / "a")}, True),
        Case("dtype with fields", "cora", {"root": str(tmp_path / "b")}, True),
    ]
    check(cases, load_in_child(cases))


# ---------------------------------------------------------------------- DGL graph files


def _dgl_file(path: Path) -> bytes:
    import torch

    from qtrain._compat import import_dgl

    dgl = import_dgl()
    gen = torch.Generator().manual_seed(0)
    n = 200
    g = dgl.graph(
        (torch.randint(0, n, (800,), generator=gen), torch.randint(0, n, (800,), generator=gen)),
        num_nodes=n,
    )
    g.ndata["feat"] = torch.randn(n, 8, generator=gen)
    g.ndata["label"] = torch.randint(0, 3, (n,), generator=gen)
    for key in ("train_mask", "val_mask", "test_mask"):
        g.ndata[key] = torch.rand(n, generator=gen) < 0.3
    g.edata["weight"] = torch.rand(800, generator=gen)
    dgl.save_graphs(str(path), [g])
    return path.read_bytes()


def test_random_byte_changes_to_a_dgl_graph_file(tmp_path: Path) -> None:
    original = _dgl_file(tmp_path / "graph.bin")
    rng = random.Random(0)
    cases = []
    for k in range(80):
        data = bytearray(original)
        spots = [rng.randrange(8, len(data)) for _ in range(2)]  # keep DGL's marker
        for spot in spots:
            data[spot] = rng.randrange(256)
        path = tmp_path / f"m{k}.bin"
        path.write_bytes(bytes(data))
        cases.append(Case(f"bytes {spots} changed", "dgl-file", {"path": str(path)}, False))
    results = load_in_child(cases)
    check(cases, results)
    crashed = [c.id for c in cases if "crashed on it" in results[c.id].get("error", "")]
    assert crashed, "no mutation crashed DGL's reader: the test no longer covers that path"
