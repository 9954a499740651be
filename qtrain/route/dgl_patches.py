"""The patches that let an unmodified DGL model run on tensors DGL's build cannot touch.

DGL's graph stays on the CPU (the CPU-only build cannot place it on a GPU);
its features live on the route's device. What would stop a model there, and
what is done about it (mapped in ``../shared/design.md``, "DGL 2.1.0's CPU
build with CUDA features"):

* the eight primitive names DGL's modules call (``PRIMITIVES`` of
  ``qtrain.plugin``) run ``qtrain.route.kernels`` when an operand is on a
  route device, over the graph's CSR views copied once to that device;
* ``dgl.ops.spmm.gspmm``'s mean reducer divides by degrees taken from those
  views instead of the CPU ``in_degrees()``;
* ``DGLGraph._set_n_repr`` / ``_set_e_repr`` accept features on a route device
  (the shape checks stay); ``Column.update`` and ``Column.extend`` move CPU
  row ids and CPU filler rows to the column's device;
* DGL's ``copy_to`` (row ids moved to a column's device) handles any device
  type, not only "cuda";
* ``DGLGraph.to(device)`` for a route device returns a copy of the graph whose
  features are on that device;
* a device tensor that still reaches DGL's C library (a DGL function the route
  does not run) raises ``DeviceRouteError`` naming that function, instead of
  DGL's own error deep in its FFI or a silent copy.

Everything is undone by ``uninstall`` exactly.
"""

from __future__ import annotations

import copy
import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from qtrain._compat import import_dgl
from qtrain.errors import QtrainError
from qtrain.ops import dispatch
from qtrain.ops.graph import GraphCSR, graph_csr
from qtrain.plugin import Patcher
from qtrain.route import kernels

BACKEND = "route"  # the name of the route's kernels in the run's kernel counts and profiles


class DeviceRouteError(QtrainError):
    """A DGL call on a route device that qtrain's device route does not run."""


class _Installed:
    """What is patched: module-level names through a Patcher, class attributes here."""

    def __init__(self) -> None:
        self.patcher = Patcher("device route")
        self.attributes: list[tuple[type, str, Any]] = []

    def set_attribute(self, owner: type, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name]
        replacement = make(original)
        replacement.__wrapped__ = original
        self.attributes.append((owner, name, original))
        setattr(owner, name, replacement)

    def undo(self) -> None:
        self.patcher.restore()
        while self.attributes:
            owner, name, original = self.attributes.pop()
            setattr(owner, name, original)


class Route:
    """The device types whose tensors DGL's primitives are run for by qtrain."""

    def __init__(self) -> None:
        self.devices: set[str] = set()
        self._installed: _Installed | None = None

    # ------------------------------------------------------------ state

    def on_route(self, *values: Any) -> torch.device | None:
        """The device of the first tensor among ``values`` (or in a tuple or list among
        them: a heterograph's per-type operands) that is on a route device."""
        for value in values:
            if isinstance(value, (tuple, list)):
                found = self.on_route(*value)
                if found is not None:
                    return found
            elif isinstance(value, torch.Tensor) and value.device.type in self.devices:
                return value.device
        return None

    def enable(self, device: torch.device) -> None:
        if self._installed is None:
            self._refuse_under_plugins()
            installed = _Installed()
            try:
                self._install(installed)
            except BaseException:
                installed.undo()
                raise
            self._installed = installed
        self.devices.add(device.type)

    def disable(self) -> None:
        self.devices.clear()
        if self._installed is not None:
            self._installed.undo()
            self._installed = None

    @staticmethod
    def _refuse_under_plugins() -> None:
        from qtrain.plugin import PRIMITIVES

        for primitive in PRIMITIVES:
            if hasattr(Patcher.current(primitive), "__wrapped__"):
                raise DeviceRouteError(
                    "qtrain's device route must be enabled before plugins are active "
                    "(call qtrain.to_device before entering qtrain.patch)"
                )

    # ------------------------------------------------------------ installation

    def _install(self, installed: _Installed) -> None:
        dgl = import_dgl()
        patcher = installed.patcher
        patcher.wrap("gspmm", self._gspmm)
        patcher.wrap("gspmm_hetero", self._gspmm_hetero)
        patcher.wrap("gsddmm", self._gsddmm)
        patcher.wrap("gsddmm_hetero", self._gsddmm_hetero)
        patcher.wrap("edge_softmax", self._edge_softmax)
        patcher.wrap("edge_softmax_hetero", self._edge_softmax_hetero)
        patcher.wrap("gather_mm", self._gather_mm)
        patcher.wrap("segment_mm", self._segment_mm)
        spmm_module = importlib.import_module("dgl.ops.spmm")
        patcher.replace(spmm_module.gspmm, self._mean_gspmm(spmm_module.gspmm))
        tensor_module = importlib.import_module("dgl.backend.pytorch.tensor")
        to_c = tensor_module.zerocopy_to_dgl_ndarray
        patcher.replace(to_c, self._guard_c_library(to_c))
        patcher.replace(tensor_module.copy_to, self._copy_to(tensor_module.copy_to))
        graph_class = dgl.DGLGraph
        installed.set_attribute(graph_class, "_set_n_repr", self._set_repr("node"))
        installed.set_attribute(graph_class, "_set_e_repr", self._set_repr("edge"))
        installed.set_attribute(graph_class, "to", self._graph_to)
        column = importlib.import_module("dgl.frame").Column
        installed.set_attribute(column, "update", self._column_update)
        installed.set_attribute(column, "extend", self._column_extend)

    # ------------------------------------------------------------ primitives

    def _gspmm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def gspmm(gidx: Any, op: str, reduce_op: str, lhs: Any, rhs: Any) -> Any:
            device = self.on_route(lhs, rhs)
            if device is None:
                return original(gidx, op, reduce_op, lhs, rhs)
            _check_choice("dgl.ops.gspmm", "op", op, kernels.SPMM_OPS)
            _check_choice("dgl.ops.gspmm", "reducer", reduce_op, kernels.SPMM_REDUCERS)
            with dispatch.call("spmm", BACKEND):
                return kernels.spmm(graph_csr(gidx, 0, device), op, reduce_op, lhs, rhs)

        return gspmm

    def _gspmm_hetero(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def gspmm_hetero(gidx: Any, op: str, reduce_op: str, lhs_len: int, *operands: Any) -> Any:
            device = self.on_route(*operands)
            if device is None:
                return original(gidx, op, reduce_op, lhs_len, *operands)
            _check_choice("dgl.ops.gspmm (heterograph)", "op", op, kernels.SPMM_OPS)
            _check_choice(
                "dgl.ops.gspmm (heterograph)", "reducer", reduce_op, kernels.SPMM_REDUCERS
            )
            lhs, rhs = operands[:lhs_len], operands[lhs_len:]
            with dispatch.call("spmm", BACKEND):
                return kernels.spmm_hetero(
                    _relations(gidx, device), gidx.number_of_ntypes(), op, reduce_op, lhs, rhs
                )

        return gspmm_hetero

    def _gsddmm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def gsddmm(
            gidx: Any, op: str, lhs: Any, rhs: Any, lhs_target: str = "u", rhs_target: str = "v"
        ) -> Any:
            device = self.on_route(lhs, rhs)
            if device is None:
                return original(gidx, op, lhs, rhs, lhs_target, rhs_target)
            _check_choice("dgl.ops.gsddmm", "op", op, kernels.SDDMM_OPS)
            csr = graph_csr(gidx, 0, device)
            with dispatch.call("sddmm", BACKEND):
                return kernels.sddmm(csr, op, lhs, rhs, lhs_target, rhs_target)

        return gsddmm

    def _gsddmm_hetero(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def gsddmm_hetero(
            gidx: Any,
            op: str,
            lhs_len: int,
            lhs_target: str = "u",
            rhs_target: str = "v",
            *operands: Any,
        ) -> Any:
            device = self.on_route(*operands)
            if device is None:
                return original(gidx, op, lhs_len, lhs_target, rhs_target, *operands)
            _check_choice("dgl.ops.gsddmm (heterograph)", "op", op, kernels.SDDMM_OPS)
            lhs, rhs = operands[:lhs_len], operands[lhs_len:]
            relations = _relations(gidx, device)
            with dispatch.call("sddmm", BACKEND):
                return kernels.sddmm_hetero(relations, op, lhs, rhs, lhs_target, rhs_target)

        return gsddmm_hetero

    def _edge_softmax(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from dgl.base import ALL

        def edge_softmax(gidx: Any, logits: Any, eids: Any = ALL, norm_by: str = "dst") -> Any:
            device = self.on_route(logits)
            if device is None:
                return original(gidx, logits, eids, norm_by)
            _check_choice("dgl.ops.edge_softmax", "norm_by", norm_by, ("dst", "src"))
            gidx = _edge_subset("dgl.ops.edge_softmax", gidx, eids)
            with dispatch.call("edge_softmax", BACKEND):
                return kernels.edge_softmax(graph_csr(gidx, 0, device), logits, norm_by)

        return edge_softmax

    def _edge_softmax_hetero(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from dgl.base import ALL

        def edge_softmax_hetero(
            gidx: Any, eids: Any = ALL, norm_by: str = "dst", *logits: Any
        ) -> Any:
            device = self.on_route(*logits)
            if device is None:
                return original(gidx, eids, norm_by, *logits)
            name = "dgl.ops.edge_softmax (heterograph)"
            _check_choice(name, "norm_by", norm_by, ("dst", "src"))
            gidx = _edge_subset(name, gidx, eids)
            with dispatch.call("edge_softmax", BACKEND):
                return kernels.edge_softmax_hetero(_relations(gidx, device), logits, norm_by)

        return edge_softmax_hetero

    def _gather_mm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def gather_mm(a: Any, b: Any, *, idx_b: Any) -> Any:
            if self.on_route(a, b, idx_b) is None:
                return original(a, b, idx_b=idx_b)
            with dispatch.call("gather_mm", BACKEND):
                return kernels.gather_mm(a, b, idx_b)

        return gather_mm

    def _segment_mm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def segment_mm(a: Any, b: Any, seglen_a: Any) -> Any:
            if self.on_route(a, b) is None:
                return original(a, b, seglen_a)
            with dispatch.call("segment_mm", BACKEND):
                return kernels.segment_mm(a, b, seglen_a)

        return segment_mm

    def _mean_gspmm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``gspmm`` whose mean reducer divides by in-degrees on the operands' device."""

        def gspmm(g: Any, op: str, reduce_op: str, lhs_data: Any, rhs_data: Any) -> Any:
            device = self.on_route(lhs_data, rhs_data)
            if reduce_op != "mean" or device is None:
                return original(g, op, reduce_op, lhs_data, rhs_data)
            if g._graph.number_of_etypes() != 1:
                raise DeviceRouteError(
                    "dgl.ops.gspmm: the mean reducer on a graph with several edge types is not "
                    "supported by DGL either; reduce each relation (HeteroGraphConv) instead"
                )
            total = original(g, op, "sum", lhs_data, rhs_data)
            degrees = graph_csr(g._graph, 0, device).in_degrees().clamp(min=1)
            return total / degrees.to(total.dtype).view(-1, *([1] * (total.dim() - 1)))

        gspmm.__wrapped__ = original  # type: ignore[attr-defined]
        return gspmm

    # ------------------------------------------------------------ DGL's data plumbing

    def _guard_c_library(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def zerocopy_to_dgl_ndarray(data: Any) -> Any:
            if (
                isinstance(data, torch.Tensor)
                and data.device.type != "cpu"
                and data.device.type in self.devices
            ):
                raise DeviceRouteError(_unsupported_call(data.device))
            return original(data)

        zerocopy_to_dgl_ndarray.__wrapped__ = original  # type: ignore[attr-defined]
        return zerocopy_to_dgl_ndarray

    def _copy_to(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """DGL's ``copy_to`` knows only "cpu" and "cuda" (and sets the current CUDA device);
        to a route device it is a plain ``Tensor.to``, so any device type torch has works."""

        def copy_to(data: Any, ctx: Any, **kwargs: Any) -> Any:
            target = torch.device(ctx)
            if target.type == "cpu" or target.type not in self.devices:
                return original(data, ctx, **kwargs)
            return data.to(target, **kwargs)

        copy_to.__wrapped__ = original  # type: ignore[attr-defined]
        return copy_to

    def _set_repr(self, kind: str) -> Callable[[Any], Any]:
        """``_set_n_repr`` / ``_set_e_repr`` that accept features on a route device."""
        from dgl import utils
        from dgl.base import DGLError, is_all

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def set_repr(graph: Any, type_id: int, ids: Any, data: Any) -> Any:
                # a Frame's values() are its columns: read the tensors by key
                if not isinstance(data, Mapping) or self.on_route(*map(data.get, data)) is None:
                    return original(graph, type_id, ids, data)
                if is_all(ids):
                    count = (
                        graph._graph.num_nodes(type_id)
                        if kind == "node"
                        else graph._graph.num_edges(type_id)
                    )
                else:
                    ids = utils.prepare_tensor(graph, ids, "u" if kind == "node" else "eid")
                    count = len(ids)
                for key in data:
                    value = data[key]
                    if not isinstance(value, torch.Tensor) or value.shape[0] != count:
                        rows = value.shape[0] if isinstance(value, torch.Tensor) else "no"
                        raise DGLError(
                            f"{kind} feature {key!r} has {rows} rows; the graph has {count} "
                            f"{kind}s to assign"
                        )
                    if value.device.type not in self.devices and value.device != graph.device:
                        raise DGLError(
                            f"{kind} feature {key!r} is on {value.device}; qtrain's device route "
                            f"holds features on {' or '.join(sorted(self.devices))} "
                            f"(the graph itself is on {graph.device})"
                        )
                frames = graph._node_frames if kind == "node" else graph._edge_frames
                if is_all(ids):
                    frames[type_id].update(data)
                else:
                    frames[type_id].update_row(ids, data)

            return set_repr

        return make

    def _graph_to(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def to(graph: Any, device: Any, **kwargs: Any) -> Any:
            target = torch.device(device) if device is not None else None
            if target is None or target.type == "cpu" or target.type not in self.devices:
                return original(graph, device, **kwargs)
            moved = copy.copy(graph)  # the structure stays where DGL can hold it: the CPU
            moved._node_frames = [frame.to(target, **kwargs) for frame in graph._node_frames]
            moved._edge_frames = [frame.to(target, **kwargs) for frame in graph._edge_frames]
            return moved

        return to

    def _column_update(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def update(column: Any, rowids: Any, feats: Any) -> Any:
            device = self.on_route(feats)
            if device is not None and isinstance(rowids, torch.Tensor):
                rowids = rowids.to(device)  # row ids are structure: DGL makes them on the CPU
            return original(column, rowids, feats)

        return update

    def _column_extend(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def extend(column: Any, feats: Any, feat_scheme: Any = None) -> Any:
            device = self.on_route(column.data)
            if device is not None and isinstance(feats, torch.Tensor):
                feats = feats.to(device)  # DGL fills new rows (add_self_loop) on the CPU
            return original(column, feats, feat_scheme)

        return extend


# ---------------------------------------------------------------- helpers


def _check_choice(function: str, what: str, value: str, allowed: Iterable[str]) -> None:
    if value not in allowed:
        raise DeviceRouteError(
            f"{function}: {what} {value!r} is not run by qtrain's device route; "
            f"it runs {', '.join(allowed)}"
        )


def _relations(gidx: Any, device: torch.device) -> list[tuple[GraphCSR, int, int]]:
    """(CSR views on ``device``, source type, destination type) of every relation."""
    out = []
    for etype in range(gidx.number_of_etypes()):
        src_type, dst_type = gidx.metagraph.find_edge(etype)
        out.append((graph_csr(gidx, etype, device), int(src_type), int(dst_type)))
    return out


def _edge_subset(function: str, gidx: Any, eids: Any) -> Any:
    """The graph index restricted to ``eids`` (DGL's ALL: the index itself)."""
    from dgl.base import is_all

    if is_all(eids):
        return gidx
    if isinstance(eids, torch.Tensor) and eids.device.type != "cpu":
        raise DeviceRouteError(
            f"{function}: edge ids on {eids.device} are not supported by qtrain's device route; "
            "pass them as a CPU tensor (they index the graph's structure, which stays on the CPU)"
        )
    return gidx.edge_subgraph([eids], True).graph


def _unsupported_call(device: torch.device) -> str:
    """Which DGL function sent a ``device`` tensor to DGL's C library, as one line."""
    inner = outer = None
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == "dgl" or module.startswith("dgl."):
            name = f"{module}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"
            if inner is None and not module.startswith(("dgl.backend", "dgl._ffi", "dgl.utils")):
                inner = name
            outer = name
        frame = frame.f_back
    called = inner or outer or "a DGL function"
    via = f" (reached from {outer})" if outer and outer != called else ""
    return (
        f"{called}{via} is not run by qtrain's device route: it sent a {device} tensor to "
        "DGL's CPU-only C library; run this step on the CPU or use a DGL call the route "
        "runs (message passing, dgl.ops primitives, edge_softmax, TypedLinear)"
    )
