"""The ``hector`` plugin: Hector's relational-GNN optimizations for unmodified DGL models.

Hector (``../shared/papers/hector-asplos24.txt``) speeds up RGCN, RGAT and HGT with a
typed linear layer that never copies a relation's weight per edge, compact
materialization and linear operator reordering. This plugin gives DGL's own layers the
three, each an option that can be switched off:

* ``typed_gemm``: DGL's ``segment_mm`` and ``gather_mm`` (what every ``TypedLinear``
  calls) become the op library's ``segment_matmul``, one segment GEMM across all
  relations in C++ (``typed.py``);
* ``compact``: ``RelGraphConv`` and ``HGTConv`` compute each relation's product once per
  (source node, relation) pair instead of once per edge (``layers.py``);
* ``reorder``: ``HGTConv``'s keys and messages from products of weights (``layers.py``).

qtrain's own ``rgat`` model has compact materialization and reordering as model
options (``qtrain.models.rgat``), and its typed products go through ``segment_mm``, so
``typed_gemm`` reaches it too. The aggregations run through DGL's SpMM and SDDMM, where
``tango`` (listed after ``hector``) quantizes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qtrain.plugins.hector import layers, typed

from qtrain._compat import import_dgl
from qtrain.config import option
from qtrain.plugin import Patcher, Plugin, register_plugin


@dataclass(frozen=True)
class HectorConfig:
    typed_gemm: bool = option(
        True,
        "DGL's segment_mm / gather_mm as one segment GEMM over all relations "
        "(qtrain's segment_matmul op; no per-edge copy of a relation's weight)",
    )
    compact: bool = option(
        True,
        "RelGraphConv and HGTConv compute each relation's product once per (source node, "
        "relation) pair instead of once per edge (compact materialization)",
    )
    reorder: bool = option(
        True,
        "HGTConv's keys and messages from the products of its weights, x (W_k W_att_r), "
        "instead of two GEMMs per row (linear operator reordering)",
    )


@register_plugin
class HectorPlugin(Plugin):
    """Typed segment GEMM, compact materialization and operator reordering for DGL's
    relational layers."""

    name = "hector"
    summary = (
        "relational GNNs (RGCN, RGAT, HGT): typed segment GEMM, compact materialization, "
        "operator reordering (Hector)"
    )
    Config = HectorConfig
    # tango after hector wraps hector's typed products and quantizes them; hector after
    # tango would take DGL's segment_mm from tango and run it in float32
    listed_before = ("tango",)

    def activate(self, patcher: Patcher) -> None:
        dgl = import_dgl()
        if self.config.typed_gemm:
            patcher.wrap("segment_mm", typed.segment_mm)
            patcher.wrap("gather_mm", typed.gather_mm)
        rgcn, hgt = dgl.nn.RelGraphConv, dgl.nn.HGTConv
        compact, reorder = self.config.compact, self.config.reorder
        if compact:
            patcher.replace_attribute(rgcn, "forward", layers.rgcn_forward(rgcn.forward))
        if compact or reorder:
            patcher.replace_attribute(
                hgt, "forward", layers.hgt_forward(hgt.forward, compact, reorder)
            )

    def report(self) -> dict[str, Any]:
        return {
            "typed_gemm": self.config.typed_gemm,
            "compact": self.config.compact,
            "reorder": self.config.reorder,
        }
