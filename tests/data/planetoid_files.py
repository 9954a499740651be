"""Tiny Planetoid files written as the originals are (pickles of scipy / numpy objects),
for the loader's tests and the fuzzer."""

from __future__ import annotations

import collections
import pickle
from pathlib import Path

import numpy as np
import scipy.sparse as sp

PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")

# tiny dataset: 510 nodes in allx (4 training, 500 validation, 6 more), test ids 510..521
# listed out of order with 512 and 519 missing (isolated, like Citeseer's)
N_ALL, N_TRAIN, F, C = 510, 4, 6, 3
TEST_IDS = [515, 510, 521, 513, 511, 518, 520, 514, 516, 517]


def tiny_objects() -> dict[str, object]:
    rng = np.random.default_rng(0)
    dense = (rng.random((N_ALL, F)) < 0.4).astype(np.float32)
    dense[0] = 0  # an all-zero feature row must survive normalisation
    allx = sp.csr_matrix(dense)
    tx = sp.csr_matrix(
        (rng.random((len(TEST_IDS), F)) < 0.4).astype(np.float32)
        + np.eye(len(TEST_IDS), F, dtype=np.float32)
    )
    ally = np.eye(C, dtype=np.int32)[rng.integers(0, C, N_ALL)]
    ty = np.eye(C, dtype=np.int32)[rng.integers(0, C, len(TEST_IDS))]
    graph = collections.defaultdict(list)
    for i in range(N_ALL - 1):
        graph[i].append(i + 1)  # a path, one direction only: the loader symmetrises
    graph[3] += [3, 3, 7, 7]  # self-loops and a duplicate
    graph[7].append(3)  # the reverse of an existing edge
    graph[510] += [515, 521]
    graph[2].append(0)
    return {
        "x": allx[:N_TRAIN],
        "y": ally[:N_TRAIN],
        "tx": tx,
        "ty": ty,
        "allx": allx,
        "ally": ally,
        "graph": graph,
    }


def write_planetoid(
    root: Path, name: str, objects: dict[str, object] | None = None, protocol: int = 2
) -> Path:
    """Write ``objects`` as ``root/planetoid/name/ind.name.*`` pickles (protocol 2, like the originals)."""
    objects = tiny_objects() if objects is None else objects
    folder = root / "planetoid" / name
    folder.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        with open(folder / f"ind.{name}.{part}", "wb") as f:
            pickle.dump(objects[part], f, protocol=protocol)
    (folder / f"ind.{name}.test.index").write_text("".join(f"{i}\n" for i in TEST_IDS))
    return folder
