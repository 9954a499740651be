"""The one shape every dataset loader returns: a DGL graph with its task.

Loaders put features and labels into the graph's node data under fixed
keys, so the trainer and the plugins never care where a graph came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

FEAT, LABEL = "feat", "label"
TRAIN_MASK, VAL_MASK, TEST_MASK = "train_mask", "val_mask", "test_mask"


def data_dir() -> Path:
    """Where on-disk datasets live: ``$QTRAIN_DATA_DIR`` or ``~/.cache/qtrain/datasets``."""
    env = os.environ.get("QTRAIN_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qtrain" / "datasets"


@dataclass
class NodeDataset:
    """A node-classification task on one graph.

    ``graph.ndata`` holds ``feat`` (float32, N x F), ``label`` (int64 N for
    single-label tasks, float32 N x C of 0/1 for multi-label ones) and the
    boolean ``train_mask`` / ``val_mask`` / ``test_mask``.
    """

    name: str
    graph: Any  # dgl.DGLGraph
    num_classes: int
    metric: Literal["accuracy", "micro_f1"] = "accuracy"
    info: dict[str, Any] | None = None  # provenance for the run log (files, seed, sizes)

    @property
    def multilabel(self) -> bool:
        return self.metric == "micro_f1"

    @property
    def num_features(self) -> int:
        return int(self.graph.ndata[FEAT].shape[1])
