"""The one shape every dataset loader returns: a DGL graph with its task.

Loaders put features and labels into the graph's node data under fixed
keys, so the trainer and the plugins never care where a graph came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from qtrain.errors import DatasetError

FEAT, LABEL = "feat", "label"
TRAIN_MASK, VAL_MASK, TEST_MASK = "train_mask", "val_mask", "test_mask"


def data_dir() -> Path:
    """Where on-disk datasets live: ``$QTRAIN_DATA_DIR`` or ``~/.cache/qtrain/datasets``."""
    env = os.environ.get("QTRAIN_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qtrain" / "datasets"


def memory_budget() -> int:
    """Bytes one dense array read from a file may take: half of this machine's memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 8 << 30


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

    def validate(self) -> NodeDataset:
        """Check the contract every loader promises; raise DatasetError naming the breach.

        Loaders call this last, so a trainer never meets a wrong dtype or a
        mask of the wrong length deep inside an epoch.
        """
        import torch

        g, where = self.graph, f"dataset {self.name!r}"
        ntypes = getattr(g, "ntypes", ["_N"])
        if len(ntypes) != 1 or len(getattr(g, "canonical_etypes", [None])) != 1:
            raise DatasetError(
                f"{where}: the graph must be homogeneous, it has node types {ntypes}"
            )
        n = int(g.num_nodes())
        missing = [k for k in (FEAT, LABEL, TRAIN_MASK, VAL_MASK, TEST_MASK) if k not in g.ndata]
        if missing:
            raise DatasetError(f"{where}: node data lacks {', '.join(missing)}")
        feat, label = g.ndata[FEAT], g.ndata[LABEL]
        if feat.dtype != torch.float32 or feat.dim() != 2 or feat.shape[0] != n:
            raise DatasetError(
                f"{where}: feat must be float32 [{n}, F], got {feat.dtype} {list(feat.shape)}"
            )
        if feat.shape[1] == 0:
            raise DatasetError(
                f"{where}: the nodes have no features (width 0); at least 1 is needed"
            )
        if not bool(torch.isfinite(feat).all()):
            raise DatasetError(f"{where}: the features hold NaN or infinite values")
        if self.multilabel:
            ok = label.dtype == torch.float32 and label.shape == (n, self.num_classes)
            expected = f"float32 [{n}, {self.num_classes}]"
        else:
            ok = label.dtype == torch.int64 and label.shape == (n,)
            expected = f"int64 [{n}]"
        if not ok:
            raise DatasetError(
                f"{where}: label must be {expected}, got {label.dtype} {list(label.shape)}"
            )
        for key in (TRAIN_MASK, VAL_MASK, TEST_MASK):
            mask = g.ndata[key]
            if mask.dtype != torch.bool or mask.shape != (n,):
                raise DatasetError(
                    f"{where}: {key} must be bool [{n}], got {mask.dtype} {list(mask.shape)}"
                )
        if not self.multilabel and n:
            low, high = int(label.min()), int(label.max())
            if low < 0 or high >= self.num_classes:
                raise DatasetError(
                    f"{where}: labels span {low}..{high}, outside 0..{self.num_classes - 1}"
                )
        return self


def index_mask(num_nodes: int, index: Any, what: str) -> Any:
    """A boolean mask of ``num_nodes`` with ``index`` set: splits come as index lists.

    ``index`` comes from a file, so its type, shape and range are checked here
    (``what`` names it in the error) before anything is written through it.
    """
    import torch

    try:
        index = torch.as_tensor(index)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DatasetError(f"{what} is not a list of node ids ({exc})") from None
    if (
        index.dim() != 1
        or index.dtype.is_floating_point
        or index.dtype.is_complex
        or index.dtype == torch.bool  # a mask where ids belong: 0/1 would become ids
    ):
        raise DatasetError(
            f"{what} must be a 1-D list of integer node ids, got {index.dtype} {list(index.shape)}"
        )
    index = index.to(torch.int64)
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= num_nodes):
        raise DatasetError(
            f"{what} holds node id {int(index.min()) if int(index.min()) < 0 else int(index.max())}, "
            f"outside 0..{num_nodes - 1}"
        )
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[index] = True
    return mask
