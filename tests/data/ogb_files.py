"""Tiny OGB node-property folders written in ogb's raw on-disk format (gzip csv files), for
the loader's tests and the fuzzer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

N, E = 30, 60


def csv(path: Path, rows: np.ndarray | list, header: list[str] | None = None) -> None:
    """Write a gzip csv as ogb's raw files are: no index, no header unless given (and no
    time stamp in the gzip header, so the same rows give the same bytes: the fuzzer's
    seeded mutations land on the same content every run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=header).to_csv(
        path, index=False, header=header is not None, compression={"method": "gzip", "mtime": 0}
    )


def edges(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, N, E)
    dst = (src + rng.integers(1, N, E)) % N  # no self-loops
    return np.stack([src, dst], 1)


def split(folder: Path, name: str) -> None:
    perm = np.random.default_rng(1).permutation(N)
    csv(folder / "split" / name / "train.csv.gz", perm[:15, None])
    csv(folder / "split" / name / "valid.csv.gz", perm[15:20, None])
    csv(folder / "split" / name / "test.csv.gz", perm[20:, None])


def write_arxiv(root: Path) -> Path:
    folder = root / "ogbn_arxiv"
    raw = folder / "raw"
    rng = np.random.default_rng(0)
    csv(raw / "edge.csv.gz", edges())
    csv(raw / "num-node-list.csv.gz", [[N]])
    csv(raw / "num-edge-list.csv.gz", [[E]])
    csv(raw / "node-feat.csv.gz", rng.standard_normal((N, 4)).round(4))
    csv(raw / "node_year.csv.gz", rng.integers(2000, 2020, (N, 1)))
    csv(raw / "node-label.csv.gz", rng.integers(0, 40, (N, 1)))
    split(folder, "time")
    (folder / "RELEASE_v1.txt").write_text("fake\n")
    return folder


def write_proteins(root: Path) -> Path:
    folder = root / "ogbn_proteins"
    raw = folder / "raw"
    rng = np.random.default_rng(0)
    csv(raw / "edge.csv.gz", edges())
    csv(raw / "num-node-list.csv.gz", [[N]])
    csv(raw / "num-edge-list.csv.gz", [[E]])
    csv(raw / "edge-feat.csv.gz", rng.random((E, 8)).round(3))
    csv(raw / "species.csv.gz", rng.integers(0, 3, (N, 1)))  # ogb renames it node_species
    csv(raw / "node-label.csv.gz", rng.integers(0, 2, (N, 112)))
    split(folder, "species")
    (folder / "RELEASE_v1.txt").write_text("fake\n")
    return folder


# the fake mag's node types (with their sizes) and relations (edge counts), as OGB's mag
MAG_SIZES = {"author": 7, "field_of_study": 5, "institution": 3, "paper": N}
MAG_EDGES = {
    ("author", "affiliated_with", "institution"): 8,
    ("author", "writes", "paper"): 10,
    ("paper", "cites", "paper"): E,
    ("paper", "has_topic", "field_of_study"): 12,
}


def mag_edges(triplet: tuple[str, str, str]) -> np.ndarray:
    """The fake mag's edges of relation ``triplet`` (source and destination ids per line)."""
    if triplet == ("paper", "cites", "paper"):
        return edges()
    src, _, dst = triplet
    rng = np.random.default_rng(list(MAG_EDGES).index(triplet) + 2)
    count = MAG_EDGES[triplet]
    return np.stack(
        [rng.integers(0, MAG_SIZES[src], count), rng.integers(0, MAG_SIZES[dst], count)], 1
    )


def write_mag(root: Path) -> Path:
    """OGB's raw mag layout: 4 node types (features, years and labels on papers only), 4
    relations (each with its edge_reltype file), the paper split."""
    folder = root / "ogbn_mag"
    raw = folder / "raw"
    rng = np.random.default_rng(0)
    types = list(MAG_SIZES)
    csv(raw / "num-node-dict.csv.gz", [list(MAG_SIZES.values())], header=types)
    csv(raw / "triplet-type-list.csv.gz", [list(t) for t in MAG_EDGES])
    for triplet in MAG_EDGES:
        pairs = mag_edges(triplet)
        rel = raw / "relations" / "___".join(triplet)
        csv(rel / "edge.csv.gz", pairs)
        csv(rel / "num-edge-list.csv.gz", [[len(pairs)]])
        csv(rel / "edge_reltype.csv.gz", np.zeros((len(pairs), 1), dtype=int))
    csv(raw / "node-feat" / "paper" / "node-feat.csv.gz", rng.standard_normal((N, 6)).round(4))
    csv(raw / "node-feat" / "paper" / "node_year.csv.gz", rng.integers(2000, 2020, (N, 1)))
    only_papers = [[t == "paper" for t in types]]
    csv(raw / "nodetype-has-label.csv.gz", only_papers, header=types)
    csv(raw / "node-label" / "paper" / "node-label.csv.gz", rng.integers(0, 349, (N, 1)))
    perm = np.random.default_rng(1).permutation(N)
    base = folder / "split" / "time"
    csv(base / "nodetype-has-split.csv.gz", only_papers, header=types)
    csv(base / "paper" / "train.csv.gz", perm[:15, None])
    csv(base / "paper" / "valid.csv.gz", perm[15:20, None])
    csv(base / "paper" / "test.csv.gz", perm[20:, None])
    (folder / "RELEASE_v2.txt").write_text("fake\n")
    return folder
