"""DGL's graph-file reader, run in a child process and checked before its result is used.

``dgl.load_graphs`` is C++ that trusts the lengths written in the file: two
changed bytes in a 26 KB file made it ask for gigabytes and abort the
process (``std::bad_alloc``, SIGABRT), and other changes loaded "fine" with
edge ids past the last node, which the kernels would later read out of
bounds. So the reader runs in a forked child with an address-space limit;
what it hands back is plain tensors in a weights-only file; and the parent
checks every edge id and field length before building the graph with
``dgl.graph``. A crash of the child is one line naming the file.

Children fork from a ``multiprocessing`` forkserver that imported DGL once
(``qtrain.data._dgl_preload``); it has never run a parallel region, so
forking it is safe where forking a trainer would not be.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from qtrain.errors import DatasetError

# What a legitimate load needs beyond the process's current size: the arrays (about the
# file's size, held twice while they are copied out) plus slack for DGL's own structures.
_MEMORY_PER_FILE_BYTE = 8
_MEMORY_SLACK = 2 << 30


def read_graph_file(path: Path, index: int, where: str, *, heterogeneous: bool = False) -> Any:
    """DGL graph ``index`` of ``path``, with its node and edge data: a homogeneous graph, or
    with ``heterogeneous`` a heterograph's node types, relations and node data too.

    ``where`` (naming the file) starts every error message. Raises
    DatasetError for anything the child could not read, a crash of the child,
    or inconsistent contents.
    """
    contents = run_reader(
        _read_and_save,
        (str(path), index),
        where,
        "DGL's reader",
        "write the file again with dgl.save_graphs",
    )
    if heterogeneous and (contents["ntypes"] != 1 or contents["etypes"] != 1):
        return build_heterograph(contents, where)
    return build_graph(contents, where)


def run_reader(
    target: Callable[..., str | None],
    args: tuple[Any, ...],
    where: str,
    reader: str,
    remedy: str,
) -> dict[str, Any]:
    """What ``target(*args, out)`` saved to ``out`` in a forked child, read back weights-only.

    ``target`` (a module-level function) returns an error message (None on
    success) that becomes ``DatasetError(f"{where} {message}")``; a crash of
    the child is one line naming ``reader`` and ``remedy``.
    """
    import torch

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["qtrain.data._dgl_preload"])
    with tempfile.TemporaryDirectory(prefix="qtrain-dgl-read-") as tmp:
        out = Path(tmp) / "graph.pt"
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_child, args=(target, args, str(out), send), daemon=True)
        child.start()
        send.close()
        try:
            error = receive.recv()
        except EOFError:  # the child died before it could say anything
            error = None
        child.join()
        if child.exitcode != 0:
            raise DatasetError(
                f"{where} is corrupt: {reader} {_how_it_ended(child.exitcode)}; {remedy}"
            )
        if error:
            raise DatasetError(f"{where} {error}")
        return torch.load(out, map_location="cpu", weights_only=True)


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"crashed on it ({name})"
    return f"failed on it (exit {exitcode})"


def build_graph(contents: dict[str, Any], where: str) -> Any:
    """The graph from the child's tensors, every id and length checked first."""
    import torch

    from qtrain._compat import import_dgl

    if contents["ntypes"] != 1 or contents["etypes"] != 1:
        raise DatasetError(
            f"{where} holds a heterogeneous graph (node types {contents['ntype_names']}); only "
            "homogeneous graphs are supported (dgl.to_homogeneous converts one)"
        )
    n, src, dst = int(contents["num_nodes"]), contents["src"], contents["dst"]
    if n < 0 or src.shape != dst.shape or src.dim() != 1:
        raise DatasetError(f"{where} is corrupt: its edge lists have different lengths")
    for ids in (src, dst):
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise DatasetError(
                f"{where} is corrupt: an edge names node {bad}, outside the graph's 0..{n - 1}"
            )
    for kind, data, rows in (("node", contents["ndata"], n), ("edge", contents["edata"], len(src))):
        for key, value in data.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != rows:
                raise DatasetError(
                    f"{where} is corrupt: {kind}-data field {key!r} has "
                    f"{getattr(value, 'shape', 'no')} rows for {rows} {kind}s"
                )
    dgl = import_dgl()
    g = dgl.graph((src, dst), num_nodes=n)
    g.ndata.update(contents["ndata"])
    g.edata.update(contents["edata"])
    return g


def build_heterograph(contents: dict[str, Any], where: str) -> Any:
    """A heterograph from the child's tensors: every relation's ids checked against its
    node types' sizes, every node-data field's rows against its type's, first."""
    import torch

    from qtrain._compat import import_dgl

    names, sizes = list(contents["ntype_names"]), [int(x) for x in contents["type_sizes"]]
    if len(names) != len(sizes) or any(n < 0 for n in sizes):
        raise DatasetError(f"{where} is corrupt: its node types and their sizes disagree")
    size = dict(zip(names, sizes, strict=True))
    if len(size) != len(names) or len(contents["canonical_etypes"]) != len(contents["type_edges"]):
        raise DatasetError(f"{where} is corrupt: its node types or relations repeat or disagree")
    relations = {}
    for (s, r, d), (src, dst) in zip(
        contents["canonical_etypes"], contents["type_edges"], strict=True
    ):
        if (
            s not in size
            or d not in size
            or (s, r, d) in relations
            or src.shape != dst.shape
            or src.dim() != 1
        ):
            raise DatasetError(f"{where} is corrupt: relation {r!r} does not match its types")
        for ids, t in ((src, s), (dst, d)):
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= size[t]):
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                raise DatasetError(
                    f"{where} is corrupt: relation {r!r} names {t!r} node {bad}, outside "
                    f"0..{size[t] - 1}"
                )
        relations[(s, r, d)] = (src, dst)
    for t, data in contents["type_ndata"].items():
        if t not in size:
            raise DatasetError(f"{where} is corrupt: it has node data for an unknown type {t!r}")
        for key, value in data.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != size[t]:
                raise DatasetError(
                    f"{where} is corrupt: node-data field {key!r} of type {t!r} has "
                    f"{getattr(value, 'shape', 'no')} rows for {size[t]} nodes"
                )
    dgl = import_dgl()
    g = dgl.heterograph(relations, num_nodes_dict=size)
    for t, data in contents["type_ndata"].items():
        g.nodes[t].data.update(data)
    return g


def limit_memory(path: str) -> None:
    """Cap the child's address space at what it has now plus what the file can justify."""
    import resource

    with open("/proc/self/statm") as f:
        in_use = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = in_use + _MEMORY_PER_FILE_BYTE * os.path.getsize(path) + _MEMORY_SLACK
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _child(
    target: Callable[..., str | None], args: tuple[Any, ...], out: str, send: Connection
) -> None:
    """Runs in the forked child: read, save plain tensors to ``out``, send an error or None."""
    send.send(target(*args, out))
    send.close()


def _read_and_save(path: str, index: int, out: str) -> str | None:
    import torch

    from qtrain._compat import import_dgl

    dgl = import_dgl()
    limit_memory(path)
    try:
        graphs, _ = dgl.load_graphs(path)
    except MemoryError:
        return "is corrupt: DGL's reader asked for more memory than the file justifies"
    except Exception as exc:  # DGLError for truncated / garbled files
        return f"is truncated or corrupt ({dgl_detail(exc)}); write it again with dgl.save_graphs"
    if index >= len(graphs):
        return (
            f"holds {len(graphs)} graph(s), but graph_index = {index}; "
            f"allowed: 0 to {len(graphs) - 1}"
        )
    g = graphs[index]
    homogeneous = len(g.ntypes) == 1 and len(g.canonical_etypes) == 1
    src, dst = g.edges() if homogeneous else (torch.zeros(0), torch.zeros(0))
    edges = [] if homogeneous else [g.edges(etype=c) for c in g.canonical_etypes]
    torch.save(
        {
            "ntypes": len(g.ntypes),
            "ntype_names": list(g.ntypes),
            "etypes": len(g.canonical_etypes),
            "num_nodes": int(g.num_nodes()) if homogeneous else 0,
            "src": src.to(torch.int64),
            "dst": dst.to(torch.int64),
            "ndata": dict(g.ndata) if homogeneous else {},
            "edata": dict(g.edata) if homogeneous else {},
            # a heterograph: its types, their sizes, each relation's edges, each type's data
            "type_sizes": [int(g.num_nodes(t)) for t in g.ntypes],
            "canonical_etypes": [tuple(c) for c in g.canonical_etypes],
            "type_edges": [(u.to(torch.int64), v.to(torch.int64)) for u, v in edges],
            "type_ndata": {} if homogeneous else {t: dict(g.nodes[t].data) for t in g.ntypes},
        },
        out,
    )
    return None


def dgl_detail(exc: BaseException) -> str:
    """DGL's "[12:00:00] /opt/dgl/src/...cc:43: Check failed: ..." without the location."""
    import re

    lines = str(exc).strip().splitlines()
    detail = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", lines[0]) if lines else type(exc).__name__
    return detail.strip()[:160]
