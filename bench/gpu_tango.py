"""GPU timings of the tango CUDA kernels (torch.ops.qtrain on CUDA) against torch baselines.

``run(quick)`` verifies a small case of every kernel against its pure-PyTorch
reference (RuntimeError on a mismatch), then times, with torch's benchmark Timer
(a device sync around each call; warm-up, median and IQR of repeats):

* quantize_symmetric (stochastic, 8 bits) vs ``x.abs().max()`` + the torch
  round / clamp expression with ``torch.rand_like`` noise;
* quantized_gemm (quantization of both float32 operands included) and int8_gemm
  vs torch.matmul in FP32, TF32 and BF16 (operands already bf16, and with the
  float32 -> bf16 -> float32 casts), M in (2^20, 2^22), K = N = 256;
* qspmm (copy and per-edge weighted) vs torch.sparse.mm on a CSR FP32 matrix and
  PyG's spmm (torch_sparse / torch_geometric when importable, else recorded as
  unavailable) on a synthetic products-sized graph (2.4M nodes, 62M edges, width 128);
* qsddmm dot (width 128) and add (GAT-style [N, 8, 1] terms) vs the FP32 gather
  expression (edge-chunked where the gathered tensors would not fit);

and for the memory-bound kernels the achieved GB/s over the bytes they must move
against the device bandwidth measured with a large copy. Each record:
{"case", "shape", "ms", "baseline", "baseline_ms", "ratio" (baseline_ms / ms),
"gbps", "bw_fraction"}. Nothing runs at import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from _gpu import copy_bandwidth_gbps, median_ms, row

Record = dict[str, Any]


def _free() -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# ---------------------------------------------------------------- verification


def _same(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got = got.cpu()
    if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
        raise RuntimeError(f"gpu_tango: {name} does not match its reference")


def verify(ext: Any) -> None:
    """Small case of every kernel against the pure-PyTorch reference (bit for bit)."""
    from qtrain.ops import gemm, sparse
    from qtrain.quant.quantize import quantize_symmetric
    from qtrain.quant.rng import counter_uniform

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1003, 7, generator=g)
    for stochastic in (False, True):
        q, s = ext.quantize_symmetric(x.to(dev), 5, stochastic, 3, 2**32 - 9)
        rq, rs = quantize_symmetric(x, 5, "stochastic" if stochastic else "nearest", 3, 2**32 - 9)
        _same("quantize_symmetric q", q, rq)
        _same("quantize_symmetric scale", s, rs)
    uniform = torch.empty(4097, device=dev)
    ext.fill_counter_uniform(uniform, 5, 11)
    _same("fill_counter_uniform", uniform, counter_uniform(4097, 5, 11))
    for layout in gemm.LAYOUTS:
        m, k, n = 77, 45, 300
        sa = (k, m) if layout == "tn" else (m, k)
        sb = (n, k) if layout == "nt" else (k, n)
        qa = torch.randint(-128, 128, sa, generator=g, dtype=torch.int8)
        qb = torch.randint(-128, 128, sb, generator=g, dtype=torch.int8)
        bias = torch.randn(n, generator=g)
        got = ext.int8_gemm(qa.to(dev), qb.to(dev), 0.01, layout, bias.to(dev))
        _same(f"int8_gemm {layout}", got, gemm.reference_int8_gemm(qa, qb, 0.01, layout, bias))
        a, b = torch.randn(sa, generator=g), torch.randn(sb, generator=g)
        ma, mb = a.abs().max(), b.abs().max()
        got, gm = ext.quantized_gemm(
            a.to(dev), b.to(dev), ma, mb, 8, 6, layout, bias.to(dev), True, 1, 2, 3
        )
        want, wm = gemm.reference_quantized_gemm(a, b, ma, mb, 8, 6, layout, bias, True, 1, 2, 3)
        _same(f"quantized_gemm {layout}", got, want)
        _same(f"quantized_gemm {layout} absmax", gm, wm)
    deg = torch.randint(0, 20, (500,), generator=g)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), deg.cumsum(0)])
    indices = torch.randint(0, 400, (int(indptr[-1]),), generator=g)
    q = torch.randint(-128, 128, (400, 128), generator=g, dtype=torch.int8)
    got = ext.qspmm(indptr.to(dev), indices.to(dev), q.to(dev), 0.5)
    _same("qspmm copy", got, sparse.reference_qspmm(indptr, indices, q, 0.5))
    w = torch.rand(indices.numel(), generator=g)
    got = ext.qspmm(indptr.to(dev), indices.to(dev), q.to(dev), 0.5, w.to(dev))
    want = sparse.reference_qspmm(indptr, indices, q, 0.5, w)
    if not torch.allclose(got.cpu(), want, rtol=1e-5, atol=1e-4):
        raise RuntimeError("gpu_tango: qspmm weighted does not match its reference")
    src = torch.randint(0, 400, (3000,), generator=g)
    dst = torch.randint(0, 400, (3000,), generator=g)
    for op in sparse.SDDMM_OPS:
        got = ext.qsddmm(op, q.to(dev), 0.1, src.to(dev), q.to(dev), 0.2, dst.to(dev))
        _same(f"qsddmm {op}", got, sparse.reference_qsddmm(op, q, 0.1, src, q, 0.2, dst))


# ---------------------------------------------------------------- cases


def bench_quantize(ext: Any, quick: bool, bw: float, repeats: int) -> list[Record]:
    n = (1 << 24) if quick else (1 << 28)
    x = torch.randn(n, device="cuda")

    def torch_quantize() -> torch.Tensor:
        inv = 127.0 / x.abs().max()
        return torch.clamp(torch.floor(x * inv + torch.rand_like(x)), -127, 127).to(torch.int8)

    ms = median_ms(lambda: ext.quantize_symmetric(x, 8, True, 0, 0), repeats)
    base = median_ms(torch_quantize, repeats)
    # absmax pass (4 B) + quantize pass (4 B read, 1 B written) per element
    return [
        row("quantize_symmetric", f"[{n}] stochastic", ms, "torch absmax+round", base, 9 * n, bw)
    ]


def bench_gemm(ext: Any, quick: bool, bw: float, repeats: int) -> list[Record]:
    out: list[Record] = []
    for m in ((1 << 16), (1 << 18)) if quick else ((1 << 20), (1 << 22)):
        out += _gemm_case(ext, m, bw, repeats)
        _free()
    return out


def _gemm_case(ext: Any, m: int, bw: float, repeats: int) -> list[Record]:
    out: list[Record] = []
    k = n = 256
    shape = f"M={m} K={k} N={n}"
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda") * 0.05
    ma, mb = a.abs().max().reshape(()), b.abs().max().reshape(())
    qa, _ = ext.quantize_symmetric(a, 8, False, 0, 0)
    qb, _ = ext.quantize_symmetric(b, 8, False, 0, 0)
    ab, bb = a.bfloat16(), b.bfloat16()
    fused = median_ms(
        lambda: ext.quantized_gemm(a, b, ma, mb, 8, 8, "nn", None, True, 0, 0, 0), repeats
    )
    int8 = median_ms(lambda: ext.int8_gemm(qa, qb, 1e-4, "nn", None), repeats)
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        fp32 = median_ms(lambda: torch.matmul(a, b), repeats)
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = median_ms(lambda: torch.matmul(a, b), repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    bf16 = median_ms(lambda: torch.matmul(ab, bb), repeats)
    bf16_cast = median_ms(lambda: torch.matmul(a.bfloat16(), b.bfloat16()).float(), repeats)
    fused_bytes = 4 * m * k + 4 * k * n + 4 * m * n
    int8_bytes = m * k + k * n + 4 * m * n
    for name, base in (
        ("fp32 matmul", fp32),
        ("tf32 matmul", tf32),
        ("bf16 matmul", bf16),
        ("bf16 matmul + casts", bf16_cast),
    ):
        out.append(
            row(
                "quantized_gemm (quantization included)",
                shape,
                fused,
                name,
                base,
                fused_bytes,
                bw,
            )
        )
        out.append(row("int8_gemm", shape, int8, name, base, int8_bytes, bw))
    return out


def random_graph(nodes: int, edges: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR (int64 indptr, int64 indices) of a uniform random graph on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dst = torch.randint(0, nodes, (edges,), device="cuda", generator=gen)
    dst, _ = torch.sort(dst)
    indices = torch.randint(0, nodes, (edges,), device="cuda", generator=gen)
    counts = torch.bincount(dst, minlength=nodes)
    indptr = torch.zeros(nodes + 1, dtype=torch.int64, device="cuda")
    indptr[1:] = torch.cumsum(counts, 0)
    return indptr, indices


def _pyg_spmm() -> tuple[str, Callable[..., torch.Tensor] | None]:
    try:
        import torch_sparse  # type: ignore[import-not-found]

        def run_ts(indptr, indices, values, x, n):
            st = torch_sparse.SparseTensor(
                rowptr=indptr, col=indices, value=values, sparse_sizes=(n, n)
            )
            return lambda: torch_sparse.matmul(st, x)

        return "torch_sparse.matmul", run_ts
    except Exception:
        pass
    try:
        from torch_geometric.utils import spmm  # type: ignore[import-not-found]

        def run_pyg(indptr, indices, values, x, n):
            csr = torch.sparse_csr_tensor(indptr, indices, values, (n, n))
            return lambda: spmm(csr, x)

        return "torch_geometric.utils.spmm", run_pyg
    except Exception:
        return "PyG spmm (unavailable: neither torch_sparse nor torch_geometric imports)", None


def bench_sparse(ext: Any, quick: bool, bw: float, repeats: int) -> list[Record]:
    out: list[Record] = []
    nodes, edges, width = (200_000, 5_000_000, 128) if quick else (2_400_000, 62_000_000, 128)
    shape = f"nodes={nodes} edges={edges} width={width}"
    indptr, indices = random_graph(nodes, edges)
    ip32, ix32 = indptr.to(torch.int32), indices.to(torch.int32)
    x = torch.randn(nodes, width, device="cuda")
    q, scale = ext.quantize_symmetric(x, 8, False, 0, 0)
    s = float(scale)
    w = torch.rand(edges, device="cuda")
    base_bytes = 4 * (nodes + 1) + 4 * edges + edges * width + 4 * nodes * width

    copy_ms = median_ms(lambda: ext.qspmm(ip32, ix32, q, s), repeats)
    weighted_ms = median_ms(lambda: ext.qspmm(ip32, ix32, q, s, w), repeats)
    ones = torch.ones(edges, device="cuda")
    a_ones = torch.sparse_csr_tensor(indptr, indices, ones, (nodes, nodes))
    a_w = torch.sparse_csr_tensor(indptr, indices, w, (nodes, nodes))
    ts_copy = median_ms(lambda: torch.sparse.mm(a_ones, x), repeats)
    ts_w = median_ms(lambda: torch.sparse.mm(a_w, x), repeats)
    out.append(
        row("qspmm copy", shape, copy_ms, "torch.sparse.mm csr fp32", ts_copy, base_bytes, bw)
    )
    out.append(
        row(
            "qspmm weighted",
            shape,
            weighted_ms,
            "torch.sparse.mm csr fp32",
            ts_w,
            base_bytes + 4 * edges,
            bw,
        )
    )
    pyg_name, pyg = _pyg_spmm()
    if pyg is None:
        out.append(row("qspmm copy", shape, copy_ms, pyg_name, None, base_bytes, bw))
    else:
        pyg_ms = median_ms(pyg(indptr, indices, ones, x, nodes), repeats)
        pyg_w = median_ms(pyg(indptr, indices, w, x, nodes), repeats)
        out.append(row("qspmm copy", shape, copy_ms, pyg_name, pyg_ms, base_bytes, bw))
        out.append(
            row("qspmm weighted", shape, weighted_ms, pyg_name, pyg_w, base_bytes + 4 * edges, bw)
        )

    # SDDMM: per-edge dot of width-128 rows (src = indices, dst = the CSR row of each entry)
    dst = torch.repeat_interleave(
        torch.arange(nodes, device="cuda", dtype=torch.int32), indptr[1:] - indptr[:-1]
    )
    dot_ms = median_ms(lambda: ext.qsddmm("dot", q, s, ix32, q, s, dst), repeats)
    chunk = 1 << 23

    def fp32_dot() -> torch.Tensor:
        res = torch.empty(edges, 1, device="cuda")
        for e0 in range(0, edges, chunk):
            a = x[indices[e0 : e0 + chunk]]
            b = x[dst[e0 : e0 + chunk]]
            res[e0 : e0 + chunk] = (a * b).sum(-1, keepdim=True)
        return res

    base_dot = median_ms(fp32_dot, max(3, repeats // 2), warmup=1)
    out.append(
        row(
            "qsddmm dot",
            shape,
            dot_ms,
            "fp32 gather expression (edge chunks)",
            base_dot,
            8 * edges + 2 * edges * width + 4 * edges,
            bw,
        )
    )
    heads = 8
    el = torch.randn(nodes, heads, 1, device="cuda")
    ql, sl = ext.quantize_symmetric(el, 8, False, 0, 0)
    sl = float(sl)
    add_ms = median_ms(lambda: ext.qsddmm("add", ql, sl, ix32, ql, sl, dst), repeats)
    base_add = median_ms(lambda: el[indices] + el[dst], repeats)
    out.append(
        row(
            "qsddmm add",
            f"nodes={nodes} edges={edges} [N, {heads}, 1]",
            add_ms,
            "fp32 gather expression",
            base_add,
            8 * edges + 2 * edges * heads + 4 * edges * heads,
            bw,
        )
    )
    return out


def run(quick: bool) -> list[dict]:
    """Verify every kernel on a small case, then time them; one record per (kernel, baseline)."""
    from qtrain.ops import backends

    if not torch.cuda.is_available():
        raise RuntimeError("gpu_tango: no CUDA device")
    backends.ext_cuda()  # the library with its CUDA kernels, or an error saying why not
    ext = torch.ops.qtrain
    verify(ext)
    repeats = 5 if quick else 10
    bw = copy_bandwidth_gbps()
    records: list[Record] = [
        row("device copy", "bandwidth", 0.0 + 1e-9, "-", None, None, None) | {"gbps": round(bw, 1)}
    ]
    records += bench_quantize(ext, quick, bw, repeats)
    _free()
    records += bench_gemm(ext, quick, bw, repeats)
    _free()
    records += bench_sparse(ext, quick, bw, repeats)
    _free()
    return records
