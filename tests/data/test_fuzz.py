"""Hostile dataset files: every mutated copy loads correctly or fails with one DatasetError line.

Planetoid pickles, DGL graph files, OGB folders (raw csv files, splits,
split_dict.pt, ogb's processed file) and the synthetic generator's cache,
changed at random and on purpose. A corrupt cache is rebuilt rather than
refused (see the cache section). The loads run in a child process, so a
segfault or an abort (what a crafted sparse matrix did to the Planetoid
reader, and changed bytes to DGL's reader) fails the test with the case
named, instead of killing the test session.
"""

from __future__ import annotations

import collections
import gzip
import io
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from ogb_files import E, N, csv, edges, write_arxiv, write_mag, write_proteins
from planetoid_files import PARTS, tiny_objects, write_planetoid

from qtrain.data import load_dataset
from qtrain.data.ogb import SPLITS
from tests.conftest import PLANETOID_DATA

# Loads every case it reads from standard input, one JSON object per line; prints
# "start" before a load so that a crash names the case it died in. A load reports a
# digest of the graph it gave, so that a case can be compared with an unmutated one.
CHILD = r"""
import hashlib, json, os, sys, warnings
import numpy as np
from qtrain.data import load_dataset
from qtrain.errors import DatasetError

def digest(ds):
    g = ds.graph
    h = hashlib.sha256(str(ds.num_classes).encode())
    for key in ("feat", "label", "train_mask", "val_mask", "test_mask"):
        h.update(key.encode() + g.ndata[key].numpy().tobytes())
    for ids in g.edges():
        h.update(ids.numpy().tobytes())
    return h.hexdigest()

for line in sys.stdin:
    case = json.loads(line)
    os.environ.update(case["env"] or {})
    print(json.dumps({"id": case["id"], "start": True}), flush=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = load_dataset(case["name"], case["options"])
        feat = ds.graph.ndata["feat"].numpy()
        result = {
            "ok": bool(np.isfinite(feat).all()),
            "nodes": int(ds.graph.num_nodes()),
            "digest": digest(ds),
            "from_cache": (ds.info or {}).get("from_cache"),
            "warnings": [str(w.message) for w in caught if "dataset cache" in str(w.message)],
        }
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
    same_as: str | None = None  # a load must give the very data this other case loaded
    must_load: bool = False  # a DatasetError is a failure too (a cache must be rebuilt)
    env: dict[str, str] | None = None  # set in the child before this case loads
    from_cache: bool | None = None  # what the load's info["from_cache"] must say
    warns: bool = False  # the load must warn, in one line, naming the dataset cache


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
        reference = results[case.same_as] if case.same_as else {}
        if "unexpected" in got:
            problems.append(f"{case.id}: not a DatasetError: {got['unexpected'][:300]}")
        elif "error" in got and "\n" in got["error"]:
            problems.append(f"{case.id}: the error spans several lines: {got['error'][:300]}")
        elif "error" in got and case.must_load:
            problems.append(f"{case.id}: must load, but: {got['error'][:300]}")
        elif "ok" in got and (case.must_fail or not got["ok"]):
            problems.append(f"{case.id}: loaded (finite features: {got['ok']}) but must fail")
        elif "ok" in got and case.same_as and got["digest"] != reference.get("digest"):
            problems.append(f"{case.id}: loaded other data than {case.same_as!r}, silently")
        elif "ok" in got and case.from_cache not in (None, got["from_cache"]):
            problems.append(f"{case.id}: from_cache is {got['from_cache']}, not {case.from_cache}")
        elif "ok" in got and case.warns and not any("\n" not in w for w in got["warnings"]):
            problems.append(f"{case.id}: no one-line warning about the cache: {got['warnings']}")
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


# ------------------------------------------------------------------------- OGB folders


class _Hostile:
    """Unpickling this runs a shell command; the command leaves ``marker`` behind."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _hostile_pickle(marker: Path) -> bytes:
    return pickle.dumps(_Hostile(marker), protocol=2)


def _changed(data: bytes, rng: random.Random, k: int, start: int = 0) -> tuple[bytes, str]:
    """``data`` cut short (k == 0) or with 1 to 4 bytes at or after ``start`` replaced."""
    out = bytearray(data)
    if k == 0:
        cut = rng.randrange(len(out))
        return bytes(out[:cut]), f"cut at {cut}"
    spots = [rng.randrange(start, len(out)) for _ in range(rng.randint(1, 4))]
    for spot in spots:
        out[spot] = rng.randrange(256)
    return bytes(out), f"bytes {spots} changed"


_TEXT = b"0123456789-.,e\nNna \x00\xff"


def _changed_text(text: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A csv file's text with characters replaced, removed or added, or a line repeated."""
    out = bytearray(text)
    hows = []
    for _ in range(rng.randint(1, 3)):
        spot = rng.randrange(len(out))
        what = rng.choice(("replace", "delete", "insert", "repeat line"))
        if what == "replace":
            out[spot] = rng.choice(_TEXT)
        elif what == "delete":
            del out[spot]
        elif what == "insert":
            out.insert(spot, rng.choice(_TEXT))
        else:
            start = out.rfind(b"\n", 0, spot) + 1
            end = out.find(b"\n", spot)
            end = len(out) if end < 0 else end + 1
            out[start:start] = out[start:end]
        hows.append(f"{what} at {spot}")
    return bytes(out), ", ".join(hows)


def _ogb_case(
    source: Path, root: Path, label: str, mutate: Callable[[Path], None], **kw: Any
) -> Case:
    """A copy of the dataset folder ``source`` under ``root`` (the case's ogb root), mutated."""
    folder = root / source.name
    shutil.copytree(source, folder)
    mutate(folder)
    name = source.name.replace("_", "-")
    return Case(f"{name}: {label}", name, {"root": str(root)}, **{"must_fail": False, **kw})


def _write_bytes(rel: str, data: bytes) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)

    return mutate


def _processed_by_ogb(root: Path, name: str) -> Path:
    """Let ogb itself turn the raw files under ``root`` into processed/dgl_data_processed."""
    from qtrain.data.ogb import import_ogb_dataset

    with warnings.catch_warnings():  # ogb hands pandas' read-only arrays to torch.from_numpy
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        import_ogb_dataset()(name=name, root=str(root))
    return root / name.replace("-", "_") / "processed" / "dgl_data_processed"


def _split_dict(folder: Path, scheme: str) -> None:
    """split_dict.pt beside the csv split files, holding the same ids."""
    import pandas as pd
    import torch

    base = folder / "split" / scheme
    ids = {p: pd.read_csv(base / f"{p}.csv.gz", header=None)[0].to_numpy() for p in SPLITS}
    torch.save({p: torch.from_numpy(v) for p, v in ids.items()}, base / "split_dict.pt")


def test_random_changes_to_ogb_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file the OGB loader reads, changed at random: the gzip bytes (gzip's CRC-32
    catches a change of the data, so a load must give the original graph), the csv text
    inside (any clean outcome), ogb's processed DGL file and split_dict.pt (no checksum:
    any clean outcome)."""
    rng = random.Random(0)
    cases: list[Case] = []
    counter = iter(range(10_000))

    def add(source: Path, label: str, mutate: Callable[[Path], None], **kw: Any) -> None:
        cases.append(_ogb_case(source, tmp_path / f"c{next(counter)}", label, mutate, **kw))

    sources = {}
    for writer in (write_arxiv, write_proteins, write_mag):
        folder = writer(tmp_path / "sources" / writer.__name__)
        sources[folder.name] = folder
        add(folder, "original", lambda f: None, must_load=True)
    arxiv = sources["ogbn_arxiv"]
    original = "ogbn-arxiv: original"
    files = {
        arxiv: [
            "raw/edge.csv.gz",
            "raw/num-node-list.csv.gz",
            "raw/num-edge-list.csv.gz",
            "raw/node-feat.csv.gz",
            "raw/node_year.csv.gz",
            "raw/node-label.csv.gz",
            "split/time/train.csv.gz",
            "split/time/valid.csv.gz",
            "split/time/test.csv.gz",
        ],
        sources["ogbn_proteins"]: [
            "raw/edge-feat.csv.gz",
            "raw/species.csv.gz",
            "raw/node-label.csv.gz",
        ],
        sources["ogbn_mag"]: [
            "raw/num-node-dict.csv.gz",
            "raw/triplet-type-list.csv.gz",
            "raw/relations/paper___cites___paper/edge.csv.gz",
            "raw/relations/paper___cites___paper/num-edge-list.csv.gz",
            "raw/node-feat/paper/node-feat.csv.gz",
            "raw/node-label/paper/node-label.csv.gz",
            "split/time/paper/valid.csv.gz",
        ],
    }
    for source, rels in files.items():
        for rel in rels:
            packed = (source / rel).read_bytes()
            for k in range(2 if source == arxiv else 0):
                data, how = _changed(packed, rng, k)
                add(source, f"{rel} gzip {how}", _write_bytes(rel, data), same_as=original)
            text = gzip.decompress(packed)
            for _ in range(4 if source == arxiv else 3):
                data, how = _changed_text(text, rng)
                add(source, f"{rel} text {how}", _write_bytes(rel, gzip.compress(data, mtime=0)))

    # ogb's own cache of the raw files, read by DGL's C++ reader: as ogb alone writes it (no
    # checksum: any clean outcome, and the reader's crashes must be contained), and as
    # qtrain's load leaves it (with the CRC-32 qtrain records: the original data or an error)
    rel, crc = "processed/dgl_data_processed", "processed/dgl_data_processed.crc32"
    bare = arxiv.parent / "processed-by-ogb"
    shutil.copytree(arxiv, bare / arxiv.name)
    packed = _processed_by_ogb(bare, "ogbn-arxiv").read_bytes()
    add(bare / arxiv.name, "processed by ogb, unchanged", lambda f: None, same_as=original)
    for k in range(24):
        data, how = _changed(packed, rng, k % 12, start=8)  # keep DGL's marker
        add(bare / arxiv.name, f"{rel} {how}", _write_bytes(rel, data))
    recorded = arxiv.parent / "processed-by-qtrain"
    shutil.copytree(arxiv, recorded / arxiv.name)
    monkeypatch.setenv("QTRAIN_DATA_DIR", str(tmp_path / "unused"))
    load_dataset("ogbn-arxiv", {"root": str(recorded)})
    packed = (recorded / arxiv.name / rel).read_bytes()
    add(recorded / arxiv.name, "processed by qtrain, unchanged", lambda f: None, same_as=original)
    for k in range(10):
        data, how = _changed(packed, rng, k, start=8)
        add(
            recorded / arxiv.name,
            f"{rel} {how}, checksum kept",
            _write_bytes(rel, data),
            same_as=original,
        )
    for k in range(3):
        data, how = _changed((recorded / arxiv.name / crc).read_bytes(), rng, k)
        add(recorded / arxiv.name, f"{crc} {how}", _write_bytes(crc, data), same_as=original)

    with_dict = arxiv.parent / "with-split-dict" / arxiv.name
    shutil.copytree(arxiv, with_dict)
    _split_dict(with_dict, "time")
    add(with_dict, "split_dict.pt, unchanged", lambda f: None, same_as=original)
    rel = "split/time/split_dict.pt"
    packed = (with_dict / rel).read_bytes()
    for k in range(10):
        data, how = _changed(packed, rng, k % 5)
        add(with_dict, f"{rel} {how}", _write_bytes(rel, data))

    results = load_in_child(cases)
    check(cases, results)
    assert results[original]["nodes"] == N
    crashed = [c.id for c in cases if "crashed on it" in results[c.id].get("error", "")]
    assert crashed, "no change crashed DGL's reader: the test no longer covers that path"


def _ids(part: str, ids: Any) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        csv(folder / "split" / "time" / f"{part}.csv.gz", ids)

    return mutate


def _raw(rel: str, rows: Any) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        csv(folder / "raw" / rel, rows)

    return mutate


def _saved_split(**parts: Any) -> Callable[[Path], None]:
    """split_dict.pt holding ``parts`` over the csv split's (train, valid, test) ids."""

    def mutate(folder: Path) -> None:
        import pandas as pd
        import torch

        base = folder / "split" / "time"
        split: dict[str, Any] = {
            p: torch.from_numpy(pd.read_csv(base / f"{p}.csv.gz", header=None)[0].to_numpy())
            for p in SPLITS
        }
        split.update(parts)
        torch.save({k: v for k, v in split.items() if v is not None}, base / "split_dict.pt")

    return mutate


def _whole_split(value: Any) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        import torch

        torch.save(value, folder / "split" / "time" / "split_dict.pt")

    return mutate


def _processed(change: Callable[[Any, dict[str, Any]], tuple[Any, dict[str, Any]]]) -> Any:
    """A processed/dgl_data_processed file: ogb's own one for the folder, then ``change``d."""

    def mutate(folder: Path) -> None:
        from qtrain._compat import import_dgl

        dgl = import_dgl()
        path = _processed_by_ogb(folder.parent, "ogbn-arxiv")
        graphs, labels = dgl.load_graphs(str(path))
        graph, labels = change(graphs[0], labels)
        dgl.save_graphs(str(path), [graph], labels)

    return mutate


def _small_graph(graph: Any, labels: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import torch

    from qtrain._compat import import_dgl

    dgl = import_dgl()
    small = dgl.graph((torch.tensor([0, 1]), torch.tensor([1, 2])), num_nodes=10)
    small.ndata["feat"] = torch.zeros(10, 4)
    return small, {"labels": labels["labels"][:10]}


def _ndata(key: str, value: Callable[[Any], Any] | None) -> Any:
    def change(graph: Any, labels: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if value is None:
            graph.ndata.pop(key)
        else:
            graph.ndata[key] = value(graph.ndata[key])
        return graph, labels

    return change


def _labels(value: Callable[[Any], Any]) -> Any:
    def change(graph: Any, labels: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return graph, value(labels)

    return change


def _hetero(graph: Any, labels: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import torch

    from qtrain._compat import import_dgl

    dgl = import_dgl()
    src, dst = graph.edges()
    g = dgl.heterograph(
        {("paper", "cites", "paper"): (src, dst), ("author", "writes", "paper"): (src, dst)}
    )
    g.nodes["paper"].data["feat"] = torch.zeros(g.num_nodes("paper"), 4)
    return g, labels


def _hostile_at(rel: str) -> Callable[[Path], None]:
    """``rel`` replaced by a pickle whose loading would create the case's marker file."""

    def mutate(folder: Path) -> None:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(_hostile_pickle(folder.parent / "pwned"))

    return mutate


def _both(*mutations: Callable[[Path], None]) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        for m in mutations:
            m(folder)

    return mutate


OGB_ATTACKS: dict[str, Callable[[Path], None]] = {
    # the split files
    "train id past the last node": _ids("train", [[0], [N]]),
    "negative valid id": _ids("valid", [[3], [-1]]),
    "a train id of 2.5": _ids("train", [[2.5]]),
    "a test id of 30 digits": _ids("test", [[10**30]]),
    "a test id of NaN": _ids("test", [[1], [np.nan]]),
    "a train id as text": _ids("train", [["seven"]]),
    "two ids per line": _ids("train", [[1, 2], [3, 4]]),
    "an empty train split": _ids("train", np.zeros((0, 1), dtype=int)),
    "an empty file as the valid split": _write_bytes("split/time/valid.csv.gz", b""),
    "a test split of plain text, not gzip": _write_bytes("split/time/test.csv.gz", b"1\n2\n"),
    "the same id twice in train": _ids("train", [[1], [1]]),
    "an id in both train and test": _both(_ids("train", [[1], [2]]), _ids("test", [[2], [3]])),
    # split_dict.pt
    "split_dict.pt that runs code": _hostile_at("split/time/split_dict.pt"),
    "split_dict.pt a list": _whole_split([1, 2, 3]),
    "split_dict.pt without test": _saved_split(test=None),
    "split_dict.pt with text ids": _saved_split(valid="1,2,3"),
    "split_dict.pt with float ids": _saved_split(train=np.array([0.5])),
    "split_dict.pt with 2-D ids": _saved_split(train=[[0, 1], [2, 3]]),
    "split_dict.pt with a mask for ids": _saved_split(train=[True] * N),
    "split_dict.pt with an empty test split": _saved_split(test=[]),
    "split_dict.pt with id 30": _saved_split(valid=[N]),
    "split_dict.pt with id -1": _saved_split(valid=[-1]),
    "split_dict.pt with id 10**30": _saved_split(valid=[10**30]),
    "split_dict.pt with repeated ids": _saved_split(valid=[4, 4]),
    "split_dict.pt with overlapping splits": _saved_split(train=[1, 2], valid=[2, 3], test=[4]),
    "split_dict.pt with dicts per node type": _saved_split(train={"paper": [1]}),
    # the raw files
    "num-node-list 10**12": _raw("num-node-list.csv.gz", [[10**12]]),
    "num-node-list negative": _raw("num-node-list.csv.gz", [[-3]]),
    "num-node-list of 10**6 graphs": _raw("num-node-list.csv.gz", np.ones((10**6, 1), int)),
    "num-node-list 2.5": _raw("num-node-list.csv.gz", [[2.5]]),
    "num-edge-list below the edges": _raw("num-edge-list.csv.gz", [[E - 5]]),
    "num-edge-list above the edges": _raw("num-edge-list.csv.gz", [[10**12]]),
    "an edge to node 10**6": _raw("edge.csv.gz", np.vstack([edges()[:-1], [[0, 10**6]]])),
    "an edge from node -1": _raw("edge.csv.gz", np.vstack([[[-1, 0]], edges()[1:]])),
    "an edge to node 2.5": _raw("edge.csv.gz", np.vstack([edges()[:-1], [[0, 2.5]]])),
    "an edge with a NaN end": _raw("edge.csv.gz", np.vstack([edges()[:-1], [[0, np.nan]]])),
    "three ids per edge": _raw("edge.csv.gz", np.hstack([edges(), edges()[:, :1]])),
    "a NaN feature": _raw("node-feat.csv.gz", np.full((N, 4), np.nan)),
    "an infinite feature": _raw("node-feat.csv.gz", np.where(np.eye(N, 4) > 0, np.inf, 1.0)),
    "features as text": _raw("node-feat.csv.gz", [["x"] * 4] * N),
    "features for fewer nodes": _raw("node-feat.csv.gz", np.ones((N - 3, 4))),
    "label 40 of 40 classes": _raw("node-label.csv.gz", np.full((N, 1), 40)),
    "label 10**15": _raw("node-label.csv.gz", np.full((N, 1), 10**15)),
    "label -1": _raw("node-label.csv.gz", np.full((N, 1), -1)),
    "label 2.5": _raw("node-label.csv.gz", np.full((N, 1), 2.5)),
    "label NaN inside the splits": _raw("node-label.csv.gz", np.full((N, 1), np.nan)),
    "labels for fewer nodes": _raw("node-label.csv.gz", np.ones((N - 2, 1), int)),
    "three labels per node": _raw("node-label.csv.gz", np.ones((N, 3), int)),
    # ogb's processed file, a cache of the raw ones
    "processed file that runs code": _hostile_at("processed/dgl_data_processed"),
    "processed file of another, smaller graph": _processed(_small_graph),
    "processed file without node features": _processed(_ndata("feat", None)),
    "processed file with complex features": _processed(_ndata("feat", lambda f: f * 1j)),
    "processed file with NaN features": _processed(_ndata("feat", lambda f: f * np.nan)),
    "processed file with 3-D features": _processed(_ndata("feat", lambda f: f[:, :, None])),
    "processed file without labels": _processed(_labels(lambda lab: {"other": lab["labels"]})),
    "processed file with labels of 2.5": _processed(
        _labels(lambda lab: {"labels": lab["labels"] * 0.0 + 2.5})
    ),
    "processed file with NaN labels": _processed(
        _labels(lambda lab: {"labels": lab["labels"] * np.nan})
    ),
    "processed file with 28 labels": _processed(
        _labels(lambda lab: {"labels": lab["labels"][:28]})
    ),
    "processed file with three labels per node": _processed(
        _labels(lambda lab: {"labels": lab["labels"].repeat(1, 3)})
    ),
    "processed file with a heterograph": _processed(_hetero),
}

OTHER_ATTACKS: dict[str, tuple[Callable[[Path], Path], Callable[[Path], None]]] = {
    "proteins label 2": (write_proteins, _raw("node-label.csv.gz", np.full((N, 112), 2))),
    "proteins NaN edge feature": (
        write_proteins,
        _raw("edge-feat.csv.gz", np.full((E, 8), np.nan)),
    ),
    "proteins edge features for fewer edges": (
        write_proteins,
        _raw("edge-feat.csv.gz", np.ones((E - 1, 8))),
    ),
    "mag without paper-cites-paper": (
        write_mag,
        _raw("triplet-type-list.csv.gz", [["author", "writes", "paper"]]),
    ),
    "mag paper count negative": (
        write_mag,
        lambda f: csv(f / "raw" / "num-node-dict.csv.gz", [[7, -1]], header=["author", "paper"]),
    ),
    "mag citation to paper 10**6": (
        write_mag,
        _raw(
            "relations/paper___cites___paper/edge.csv.gz",
            np.vstack([edges()[:-1], [[0, 10**6]]]),
        ),
    ),
    "mag paper split id past the last paper": (
        write_mag,
        lambda f: csv(f / "split" / "time" / "paper" / "test.csv.gz", [[N]]),
    ),
}


def test_structural_attacks_on_ogb_files_fail_cleanly(tmp_path: Path) -> None:
    """Files that parse but are wrong: each load must fail with one line, and no pickle in
    place of a file may run its code (the marker file must not appear)."""
    arxiv = write_arxiv(tmp_path / "source")
    cases = []
    for i, (label, mutate) in enumerate(OGB_ATTACKS.items()):
        cases.append(_ogb_case(arxiv, tmp_path / f"a{i}", label, mutate, must_fail=True))
    for i, (label, (writer, mutate)) in enumerate(OTHER_ATTACKS.items()):
        source = writer(tmp_path / f"source-{i}")
        cases.append(_ogb_case(source, tmp_path / f"o{i}", label, mutate, must_fail=True))
    check(cases, load_in_child(cases))
    assert not list(tmp_path.rglob("pwned")), "a pickle in a dataset folder ran its code"


# ------------------------------------------------------------------------- dataset caches

# What a user expects of a cache: the dataset, as if there were none. The synthetic
# generator's cache holds only what the options determine, so a corrupt, swapped or
# inconsistent cache folder must be noticed (a warning naming it), deleted and generated
# again: every case below must load the very graph an untouched cache gives, and the
# next load must read the rebuilt cache. A cache is never used with wrong values, and a
# pickle in it never runs.
SYNTHETIC = {"nodes": 300, "avg_degree": 4.0, "features": 4, "classes": 3, "cache": True}


def _write_cache(data_dir: Path, monkeypatch: pytest.MonkeyPatch, **changes: Any) -> Path:
    """The cache folder of the tiny synthetic dataset (with ``changes``), under ``data_dir``."""
    from qtrain.data import DATASETS
    from qtrain.data.synthetic import cache_folder, load_synthetic

    monkeypatch.setenv("QTRAIN_DATA_DIR", str(data_dir))
    opts = DATASETS.get("synthetic").parse({**SYNTHETIC, **changes}, "dataset")
    load_synthetic(opts, "synthetic")
    return cache_folder(opts, "synthetic")


def _cache_case(
    source: Path, root: Path, label: str, mutate: Callable[[Path], None], **kw: Any
) -> list[Case]:
    """A copy of the data dir holding the cache folder ``source``, mutated; and a second
    load of it, which must read the (rebuilt) cache."""
    data_dir = root / "data"
    folder = data_dir / source.parent.name / source.name
    shutil.copytree(source, folder)
    mutate(folder)
    env = {"QTRAIN_DATA_DIR": str(data_dir)}
    common: dict[str, Any] = {
        "name": "synthetic",
        "options": SYNTHETIC,
        "must_fail": False,
        "same_as": "cache: untouched",
        "must_load": True,
        "env": env,
    }
    return [
        Case(f"cache: {label}", **common, **kw),
        Case(f"cache: {label}, again", **common, from_cache=True),
    ]


def test_random_changes_to_a_synthetic_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _write_cache(tmp_path / "source", monkeypatch)
    rng = random.Random(0)
    cases = _cache_case(source, tmp_path / "u", "untouched", lambda f: None, from_cache=True)
    counter = iter(range(10_000))
    for path in sorted(source.iterdir()):
        original = path.read_bytes()
        for k in range(7):
            data, how = _changed(original, rng, k)
            cases += _cache_case(
                source,
                tmp_path / f"c{next(counter)}",
                f"{path.name} {how}",
                _write_bytes(path.name, data),
            )
    check(cases, load_in_child(cases))


def _arrays(change: Callable[[dict[str, np.ndarray], dict[str, Any]], None]) -> Any:
    """Rewrite the cache with changed arrays or meta, through the cache's own writer (so the
    checksums and recorded shapes match: only the contents are wrong)."""

    def mutate(folder: Path) -> None:
        from qtrain.data.cache import load_arrays, save_arrays

        loaded = load_arrays(folder)
        assert loaded is not None
        arrays, meta = loaded
        meta.pop("arrays")
        change(arrays, meta)
        shutil.rmtree(folder)
        assert save_arrays(folder, arrays, meta)

    return mutate


def _set_item(key: str, index: int, value: Any) -> Any:
    def change(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        arrays[key][index] = value

    return change


def _replace(key: str, value: Callable[[dict[str, np.ndarray]], Any]) -> Any:
    def change(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        result = value(arrays)
        if result is None:
            arrays.pop(key)
        else:
            arrays[key] = result

    return change


def _swap_edge(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    u, v = arrays["edge_u"], arrays["edge_v"]
    u[3], v[3] = v[3], u[3]


def _repeat_edge(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    arrays["edge_u"][4], arrays["edge_v"][4] = arrays["edge_u"][3], arrays["edge_v"][3]


def _overlap(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    arrays["val_mask"][np.flatnonzero(arrays["train_mask"])[0]] = True


def _move_to_test(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    node = np.flatnonzero(arrays["train_mask"])[0]
    arrays["train_mask"][node], arrays["test_mask"][node] = False, True


def _no_split(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    arrays["test_mask"][np.flatnonzero(arrays["test_mask"])[0]] = False


def _other_identity(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    meta["identity"] = {**meta["identity"], "seed": 7}


def _meta_text(text: str) -> Callable[[Path], None]:
    return _write_bytes("meta.json", text.encode())


def _meta_edit(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        meta = json.loads((folder / "meta.json").read_text())
        change(meta)
        (folder / "meta.json").write_text(json.dumps(meta))

    return mutate


def _huge_header(folder: Path) -> None:
    """feat.npy and meta.json both claiming 10**9 rows (the file holds 300)."""
    path = folder / "feat.npy"
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        data = f.read()
    header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 4), np.float32))
    header["shape"] = (10**9, 4)
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    path.write_bytes(out.getvalue() + data)

    def claim(meta: dict[str, Any]) -> None:
        meta["arrays"]["feat"]["shape"] = [10**9, 4]

    _meta_edit(claim)(folder)


def _npz(folder: Path) -> None:
    np.savez(folder / "feat.npz", feat=np.zeros((300, 4), np.float32))
    (folder / "feat.npz").rename(folder / "feat.npy")


def _folder_a_file(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.write_bytes(b"not a folder")


CACHE_ATTACKS: dict[str, Callable[[Path], None]] = {
    "an edge to node 300 of 300": _arrays(_set_item("edge_v", -1, 300)),
    "an edge from node -1": _arrays(_set_item("edge_u", 0, -1)),
    "an edge stored as v, u": _arrays(_swap_edge),
    "a self-loop": _arrays(lambda a, m: a["edge_v"].__setitem__(3, a["edge_u"][3])),
    "an edge stored twice": _arrays(_repeat_edge),
    "edges in reverse order": _arrays(_replace("edge_u", lambda a: a["edge_u"][::-1].copy())),
    "one edge fewer": _arrays(
        lambda a, m: a.update(edge_u=a["edge_u"][:-1].copy(), edge_v=a["edge_v"][:-1].copy())
    ),
    "edge lists of different lengths": _arrays(_replace("edge_v", lambda a: a["edge_v"][:-1])),
    "int64 node ids": _arrays(_replace("edge_u", lambda a: a["edge_u"].astype(np.int64))),
    "features for 299 nodes": _arrays(_replace("feat", lambda a: a["feat"][:-1].copy())),
    "features 5 wide": _arrays(_replace("feat", lambda a: np.ones((300, 5), np.float32))),
    "a NaN feature": _arrays(_set_item("feat", 7, np.nan)),
    "float64 features": _arrays(_replace("feat", lambda a: a["feat"].astype(np.float64))),
    "label 3 of 3 classes": _arrays(_set_item("label", 5, 3)),
    "label -1": _arrays(_set_item("label", 5, -1)),
    "a node in train and val": _arrays(_overlap),
    "a node in no split": _arrays(_no_split),
    "a train node moved to test": _arrays(_move_to_test),
    "masks as uint8": _arrays(_replace("val_mask", lambda a: a["val_mask"].astype(np.uint8))),
    "no labels": _arrays(_replace("label", lambda a: None)),
    "an extra array": _arrays(_replace("extra", lambda a: np.zeros(3))),
    "made with another seed": _arrays(_other_identity),
    "meta.json without identity": _meta_edit(lambda m: m.pop("identity")),
    "meta.json a list": _meta_text("[1, 2]"),
    "meta.json nested 100000 deep": _meta_text("[" * 100_000),
    "meta.json arrays a list": _meta_edit(lambda m: m.update(arrays=list(m["arrays"]))),
    "meta.json naming a file outside the folder": _meta_edit(
        lambda m: m["arrays"].update({"../../feat": m["arrays"]["feat"]})
    ),
    "meta.json empty": _meta_text(""),
    "feat.npy claiming 10**9 rows": _huge_header,
    "feat.npy an npz archive": _npz,
    "feat.npy a pickle that runs code": _hostile_at("feat.npy"),
    "meta.json a pickle that runs code": _hostile_at("meta.json"),
    "label.npy missing": lambda f: (f / "label.npy").unlink(),
    "the cache folder a file": _folder_a_file,
}


def test_inconsistent_and_swapped_synthetic_caches_are_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _write_cache(tmp_path / "source", monkeypatch)
    other = _write_cache(tmp_path / "other", monkeypatch, nodes=400)
    cases = _cache_case(source, tmp_path / "u", "untouched", lambda f: None, from_cache=True)
    # the homophily is measured on the arrays, never read back: this cache is fine
    text = _meta_edit(lambda m: m.update(edge_homophily="high"))
    cases += _cache_case(source, tmp_path / "h", "edge_homophily text", text, from_cache=True)
    attacks = {
        **CACHE_ATTACKS,
        "feat.npy of a 400-node cache": lambda f: shutil.copy(other / "feat.npy", f / "feat.npy"),
        "edge_u.npy of a 400-node cache": lambda f: shutil.copy(
            other / "edge_u.npy", f / "edge_u.npy"
        ),
        "the whole folder of a 400-node cache": lambda f: (
            shutil.rmtree(f),
            shutil.copytree(other, f),
        ),
    }
    for i, (label, mutate) in enumerate(attacks.items()):
        cases += _cache_case(
            source, tmp_path / f"a{i}", label, mutate, from_cache=False, warns=True
        )
    check(cases, load_in_child(cases))
    assert not list(tmp_path.rglob("pwned")), "a pickle in a cache folder ran its code"
