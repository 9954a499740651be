"""torch.ops.qtrain.segment_matmul and segment_matmul_tn on every device against their
references (qtrain.ops.typed.reference_segment_matmul / _tn), their autograd, and the
public qtrain.ops.typed.segment_matmul.

Both kernels and references make one GEMM per segment, but the kernels write each
product into a slice of the output, whose alignment changes the BLAS's code path (MKL's
small-matrix path), so results are compared with the dtype's tight tolerance
(float32: rtol 1.3e-6, atol 1e-5), not bit for bit; rows of empty segments bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from support import DEVICES, SEGMENT_EDGES, ErrorCase, expect_errors, library, opcheck

from qtrain.ops import dispatch
from qtrain.ops.typed import (
    offsets_from_lengths,
    reference_segment_matmul,
    reference_segment_matmul_tn,
    segment_matmul,
)

ODD = (1, 3, 17, 129)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _operands(
    lengths: list[int],
    k: int,
    m: int,
    device: str,
    dtype: torch.dtype = torch.float32,
    transpose: bool = False,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x [N, k], offsets, weight [R, k, m] or [R, m, k], grad [N, m]), random normal."""
    g = _gen(seed)
    offsets = offsets_from_lengths(torch.tensor(lengths, dtype=torch.int64))
    n, r = int(offsets[-1]), len(lengths)
    x = torch.randn(n, k, generator=g).to(device=device, dtype=dtype)
    shape = (r, m, k) if transpose else (r, k, m)
    weight = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    grad = torch.randn(n, m, generator=g).to(device=device, dtype=dtype)
    return x, offsets, weight, grad


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.device == want.device, what
    assert got.dtype == want.dtype and got.shape == want.shape, what
    torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")


def _check(
    x: torch.Tensor,
    offsets: torch.Tensor,
    weight: torch.Tensor,
    grad: torch.Tensor,
    transpose: bool,
    what: str = "",
) -> None:
    """Both ops equal their references on x's device; empty segments' weight grads are 0."""
    ops = library(str(x.device))
    got = ops.segment_matmul(x, offsets, weight, transpose)
    assert got.is_contiguous()
    _close(got, reference_segment_matmul(x, offsets, weight, transpose), f"{what} forward")
    got_tn = ops.segment_matmul_tn(x, offsets, grad)
    _close(got_tn, reference_segment_matmul_tn(x, offsets, grad), f"{what} tn")
    empty = (offsets[1:] == offsets[:-1]).to(x.device)
    assert not bool(got_tn[empty].any()), f"{what}: empty segments' products must be 0"


def _power_law(relations: int, seed: int) -> list[int]:
    """Segment sizes of a heavy-tailed relation mix: a few large, many small or empty."""
    sizes = (3000.0 / torch.arange(1, relations + 1, dtype=torch.float64) ** 1.6).long()
    return sizes[torch.randperm(relations, generator=_gen(seed))].tolist()


# ---------------------------------------------------------------- against the references


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", ODD)
@pytest.mark.parametrize("m", ODD)
@pytest.mark.parametrize("transpose", [False, True])
def test_matches_reference(device: str, k: int, m: int, transpose: bool) -> None:
    lengths = [5, 0, 33, 1, 7, 0, 64, 2]
    _check(*_operands(lengths, k, m, device, transpose=transpose, seed=k * m), transpose, "odd")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("transpose", [False, True])
def test_other_dtypes(device: str, dtype: torch.dtype, transpose: bool) -> None:
    lengths = [9, 0, 40, 3]
    _check(*_operands(lengths, 17, 24, device, dtype, transpose, seed=3), transpose, str(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths", SEGMENT_EDGES)
def test_segment_edges(device: str, lengths: list[int]) -> None:
    for transpose in (False, True):
        _check(*_operands(lengths, 6, 5, device, transpose=transpose), transpose, str(lengths))


@pytest.mark.parametrize("device", DEVICES)
def test_many_relations_power_law(device: str) -> None:
    lengths = _power_law(474, 1)
    assert lengths.count(0) > 100 and max(lengths) > 1000  # empty ones and large ones
    for transpose in (False, True):
        _check(*_operands(lengths, 16, 16, device, transpose=transpose), transpose, "474")


@pytest.mark.parametrize("device", DEVICES)
def test_zero_widths_and_values(device: str) -> None:
    lengths = [3, 0, 4]
    for k, m in ((0, 5), (5, 0), (0, 0)):
        _check(*_operands(lengths, k, m, device), False, f"k={k}, m={m}")
    ops = library(device)
    x, offsets, weight, grad = _operands(lengths, 8, 4, device)
    zeros = ops.segment_matmul(torch.zeros_like(x), offsets, weight)
    assert zeros.shape == (7, 4) and not bool(zeros.any())
    assert not bool(ops.segment_matmul_tn(x, offsets, torch.zeros_like(grad)).any())
    # constants: every product is k * c1 * c2, exactly representable
    out = ops.segment_matmul(torch.full_like(x, 0.5), offsets, torch.full_like(weight, 3.0))
    assert bool((out == 8 * 0.5 * 3.0).all())
    tn = ops.segment_matmul_tn(torch.full_like(x, 2.0), offsets, torch.full_like(grad, -1.0))
    want = torch.tensor([3.0, 0.0, 4.0], device=device)[:, None, None] * -2.0
    assert torch.equal(tn, want.expand(3, 8, 4))


@pytest.mark.parametrize("device", DEVICES)
def test_strided_operands(device: str) -> None:
    lengths = [4, 0, 17, 2]
    x, offsets, weight, grad = _operands(lengths, 9, 7, device)
    xt = x.T.contiguous().T  # a transposed view: column-major
    assert not xt.is_contiguous()
    wt = weight.permute(0, 2, 1).contiguous().permute(0, 2, 1)
    gt = torch.cat([grad, grad], 1)[:, ::2]  # every other column
    for transpose, w in ((False, wt), (True, weight.transpose(1, 2))):
        _check(xt, offsets, w, gt, transpose, f"strided, transpose={transpose}")
    # the ops equal themselves on contiguous copies
    ops = library(device)
    _close(ops.segment_matmul(xt, offsets, wt), ops.segment_matmul(x, offsets, weight), "x")
    strided_offsets = torch.stack([offsets, offsets], 1)[:, 0]
    _close(
        ops.segment_matmul_tn(x, strided_offsets, gt),
        ops.segment_matmul_tn(x, offsets, gt.contiguous()),
        "offsets",
    )


# ---------------------------------------------------------------- autograd


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transpose", [False, True])
def test_gradcheck(device: str, transpose: bool) -> None:
    x, offsets, weight, _ = _operands([2, 0, 3, 1], 3, 4, device, torch.float64, transpose)
    x.requires_grad_()
    weight.requires_grad_()

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return segment_matmul(x, w, offsets, transpose_weight=transpose)

    assert torch.autograd.gradcheck(fn, (x, weight))
    assert torch.autograd.gradgradcheck(fn, (x, weight))


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_tn(device: str) -> None:
    x, offsets, _, grad = _operands([2, 0, 3, 1], 3, 4, device, torch.float64)
    x.requires_grad_()
    grad.requires_grad_()
    ops = library(device)
    assert torch.autograd.gradcheck(lambda a, b: ops.segment_matmul_tn(a, offsets, b), (x, grad))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transpose", [False, True])
def test_grads_match_the_reference(device: str, transpose: bool) -> None:
    lengths = [30, 0, 1, 65, 0, 7]
    x, offsets, weight, grad = _operands(lengths, 17, 33, device, transpose=transpose, seed=9)
    got, want = [], []
    for backend, into in (("auto", got), ("reference", want)):
        xa = x.clone().requires_grad_()
        wa = weight.clone().requires_grad_()
        out = segment_matmul(xa, wa, offsets, transpose_weight=transpose, backend=backend)
        out.backward(grad)
        assert xa.grad is not None and wa.grad is not None
        into += [out, xa.grad, wa.grad]
    for name, a, b in zip(("out", "grad x", "grad weight"), got, want, strict=True):
        _close(a, b, f"{name}, transpose={transpose}")
    assert not bool(got[2][[1, 4]].any())  # no rows: no gradient


@pytest.mark.parametrize("device", DEVICES)
def test_grads_without_rows(device: str) -> None:
    x, offsets, weight, _ = _operands([0, 0], 3, 2, device)
    weight.requires_grad_()
    x.requires_grad_()
    out = segment_matmul(x, weight, offsets)
    assert out.shape == (0, 2)
    out.sum().backward()
    assert weight.grad is not None and torch.equal(weight.grad, torch.zeros_like(weight))
    assert x.grad is not None and x.grad.shape == (0, 3)


# ---------------------------------------------------------------- the public function


@pytest.mark.parametrize("device", DEVICES)
def test_public_function_dispatches_and_counts(device: str) -> None:
    library(device)
    x, offsets, weight, _ = _operands([3, 0, 4], 5, 6, device)
    dispatch.reset()
    try:
        a = segment_matmul(x, weight, offsets)
        b = segment_matmul(x, weight, offsets, backend="reference")
        kernel = "ext-cuda" if device == "cuda" else "ext-cpu"
        assert dispatch.snapshot() == {"segment_matmul": {kernel: 1, "reference": 1}}
        assert dispatch.fallbacks() == []
    finally:
        dispatch.reset()
    _close(a, b, "public")


def test_offsets_from_lengths() -> None:
    got = offsets_from_lengths(torch.tensor([3, 0, 5], dtype=torch.int32))
    assert got.dtype == torch.int64 and got.device.type == "cpu"
    assert got.tolist() == [0, 3, 3, 8]
    assert offsets_from_lengths(torch.zeros(0, dtype=torch.int64)).tolist() == [0]
    if torch.cuda.is_available():
        on_gpu = offsets_from_lengths(torch.tensor([2, 2], device="cuda"))
        assert on_gpu.device.type == "cpu" and on_gpu.tolist() == [0, 2, 4]
    with pytest.raises(ValueError, match=">= 0"):
        offsets_from_lengths(torch.tensor([1, -1]))
    with pytest.raises(TypeError, match="integer"):
        offsets_from_lengths(torch.tensor([1.0]))
    with pytest.raises(TypeError, match="1-d"):
        offsets_from_lengths(torch.tensor([[1]]))


def test_reference_refuses_bad_offsets() -> None:
    x = torch.randn(4, 2)
    w = torch.randn(2, 2, 3)
    for bad, error, match in (
        (torch.tensor([0, 1, 4], dtype=torch.int32), TypeError, "int64"),
        (torch.tensor([1, 2, 4]), ValueError, "start at 0"),
        (torch.tensor([0, 3, 2]), ValueError, "non-decreasing"),
        (torch.tensor([0, 1, 3]), ValueError, "end at the rows"),
    ):
        with pytest.raises(error, match=match):
            reference_segment_matmul(x, bad, w)


# ---------------------------------------------------------------- opcheck, errors


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    for lengths, transpose in (([3, 0, 2, 1], False), ([3, 0, 2, 1], True), ([0, 0], False)):
        x, offsets, weight, grad = _operands(lengths, 4, 3, device, transpose=transpose)
        for t in (x, weight, grad):
            t.requires_grad_()
        opcheck(ops.segment_matmul.default, (x, offsets, weight, transpose))
        opcheck(ops.segment_matmul_tn.default, (x, offsets, grad))
    x, offsets, weight, grad = _operands([], 4, 3, device)  # no relations
    opcheck(ops.segment_matmul.default, (x, offsets, weight))
    opcheck(ops.segment_matmul_tn.default, (x, offsets, grad))


_SETUP = """
x = torch.randn(6, 4, device=dev)
off = torch.tensor([0, 2, 2, 6])
w = torch.randn(3, 4, 5, device=dev)
g = torch.randn(6, 5, device=dev)
"""


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    # offsets on the device under test (CUDA), or beside the CPU on meta: not the CPU
    off_elsewhere = "off.to(dev if dev.type == 'cuda' else other)"
    cases = []
    for op, tail in (("segment_matmul", "w"), ("segment_matmul_tn", "g")):
        fn = f"qtrain::{op}"
        cases += [
            ErrorCase(
                f"{op}: offsets not on the CPU",
                f"ops.{op}(x, {off_elsewhere}, {tail})",
                "ValueError",
                f"{fn}: offsets must be on the CPU",
            ),
            ErrorCase(
                f"{op}: int32 offsets",
                f"ops.{op}(x, off.int(), {tail})",
                "TypeError",
                "offsets must be int64, got int32",
            ),
            ErrorCase(
                f"{op}: 2-d offsets",
                f"ops.{op}(x, off[None], {tail})",
                "ValueError",
                r"offsets must be 1-d with R \+ 1 >= 1 elements, got shape \[1, 4\]",
            ),
            ErrorCase(
                f"{op}: no offsets",
                f"ops.{op}(x, off[:0], {tail})",
                "ValueError",
                r"offsets must be 1-d with R \+ 1 >= 1",
            ),
            ErrorCase(
                f"{op}: offsets not from 0",
                f"ops.{op}(x, torch.tensor([1, 2, 2, 6]), {tail})",
                "ValueError",
                rf"{fn}: offsets must start at 0, got offsets\[0\] = 1",
            ),
            ErrorCase(
                f"{op}: decreasing offsets",
                f"ops.{op}(x, torch.tensor([0, 3, 2, 6]), {tail})",
                "ValueError",
                r"offsets must be non-decreasing, got offsets\[2\] = 2 < offsets\[1\] = 3",
            ),
            ErrorCase(
                f"{op}: offsets not to N",
                f"ops.{op}(x, torch.tensor([0, 2, 2, 5]), {tail})",
                "ValueError",
                r"offsets must end at the rows of x \(6\), got offsets\[3\] = 5",
            ),
            ErrorCase(
                f"{op}: integer x",
                f"ops.{op}(x.long(), off, {tail})",
                "TypeError",
                "x must be float32, float64, float16 or bfloat16, got int64",
            ),
            ErrorCase(
                f"{op}: 1-d x", f"ops.{op}(x[0], off, {tail})", "ValueError", "x must be 2-d"
            ),
            ErrorCase(
                f"{op}: sparse x",
                f"ops.{op}(x.to_sparse(), off, {tail})",
                "ValueError",
                "x must be a dense",
            ),
        ]
    cases += [
        ErrorCase(
            "weight 2-d",
            "ops.segment_matmul(x, off, w[0])",
            "ValueError",
            r"qtrain::segment_matmul: weight must be 3-d, got shape \[4, 5\]",
        ),
        ErrorCase(
            "weight relations",
            "ops.segment_matmul(x, off, w[:2])",
            "ValueError",
            "weight has 2 relations but offsets give R = 3",
        ),
        ErrorCase(
            "K mismatch",
            "ops.segment_matmul(x, off, torch.randn(3, 5, 5, device=dev))",
            "ValueError",
            r"x has K = 4 columns but weight \[R, K, M\] of shape \[3, 5, 5\] has K = 5",
        ),
        ErrorCase(
            "K mismatch, transposed",
            "ops.segment_matmul(x, off, w, True)",
            "ValueError",
            r"weight \[R, M, K\] of shape \[3, 4, 5\] has K = 5",
        ),
        ErrorCase(
            "weight dtype",
            "ops.segment_matmul(x, off, w.double())",
            "TypeError",
            r"weight must be float32 \(the dtype of x\), got float64",
        ),
        ErrorCase(
            "weight device",
            "ops.segment_matmul(x, off, w.to(other))",
            "ValueError",
            "weight is on",
        ),
        ErrorCase(
            "grad rows",
            "ops.segment_matmul_tn(x, off, g[:5])",
            "ValueError",
            "qtrain::segment_matmul_tn: grad has 5 rows but x has 6",
        ),
        ErrorCase(
            "grad dtype",
            "ops.segment_matmul_tn(x, off, g.bfloat16())",
            "TypeError",
            r"grad must be float32 \(the dtype of x\), got bfloat16",
        ),
        ErrorCase(
            "grad 1-d", "ops.segment_matmul_tn(x, off, g[:, 0])", "ValueError", "grad must be 2-d"
        ),
        ErrorCase(
            "grad device", "ops.segment_matmul_tn(x, off, g.to(other))", "ValueError", "grad is on"
        ),
    ]
    expect_errors(cases, device, setup=_SETUP)
