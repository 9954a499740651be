"""torch.ops.qtrain.hadamard_rotate and its Python front (qtrain.ops.rotate) on every device
against the reference (qtrain.quant.granular.hadamard_rotate, a float32 matmul per block):
equal to float32 rounding (the kernels run the fast transform, the reference sums B
products), bit for bit across thread counts, ISA variants and devices; its own inverse,
norm-preserving, differentiable; opcheck; every error path."""

from __future__ import annotations

import math

import pytest
import torch
from support import (
    DEVICES,
    ErrorCase,
    assert_same,
    expect_errors,
    gen,
    library,
    opcheck,
    variants,
)

from qtrain.ops import dispatch
from qtrain.ops.rotate import hadamard_rotate
from qtrain.quant import granular

BLOCKS = [2**k for k in range(11)]  # 1 .. 1024
WIDTHS = (1, 7, 33, 129, 1433)  # not a multiple of any block above 1
EPS = 2.0**-24  # float32's unit roundoff


def _padded(x: torch.Tensor, block: int) -> torch.Tensor:
    """x's last dimension padded with zeros to a multiple of ``block``."""
    return torch.nn.functional.pad(x, (0, -x.shape[-1] % block))


def _block_norms(x: torch.Tensor, block: int) -> torch.Tensor:
    """The 2-norm of the (padded) block each output value comes from, 1 for a zero block,
    in the output's shape."""
    xp = _padded(x.double(), block)
    blocks = xp.reshape(*xp.shape[:-1], xp.shape[-1] // block, block)
    norms = blocks.norm(dim=-1, keepdim=True).expand(blocks.shape).reshape(xp.shape)
    return torch.where(norms > 0, norms, torch.ones_like(norms))


def assert_rotation_close(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, block: int):
    """``got`` equals ``want`` to float32 rounding of a sum of B terms: each value within 16
    units of roundoff of its block's 2-norm (both the fast transform and the matmul stay
    within about 3; an orthonormal transform keeps the norm, so this is relative to the
    size of what is summed, whatever the cancellation)."""
    got = got.cpu()
    assert got.dtype == want.dtype == torch.float32
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    norms = _block_norms(x.cpu(), block)
    torch.testing.assert_close(
        got.double() / norms, want.double() / norms, rtol=0, atol=16 * EPS, msg=f"block {block}"
    )


def _reference(x: torch.Tensor, block: int) -> torch.Tensor:
    """granular.hadamard_rotate, which cannot reshape an empty x into blocks: the output of
    one is empty, [rows, P]."""
    if x.numel() == 0:
        return torch.empty(x.shape[0], -(-x.shape[1] // block) * block)
    return granular.hadamard_rotate(x, block)


def _run(x: torch.Tensor, block: int, device: str) -> torch.Tensor:
    out = library(device).hadamard_rotate(x.to(device), block)
    assert out.device.type == torch.device(device).type
    return out


# ---------------------------------------------------------------- against the reference


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", BLOCKS)
def test_matches_reference(device: str, block: int) -> None:
    g = gen(block)
    shapes = [(5, w) for w in WIDTHS] + [(3, block), (4, 3 * block), (1, 1), (37, 17)]
    for rows, cols in shapes:
        x = torch.randn(rows, cols, generator=g) * 3
        want = granular.hadamard_rotate(x, block)
        assert want.shape == (rows, -(-cols // block) * block)
        assert_rotation_close(_run(x, block, device), want, x, block)


def _special() -> dict[str, torch.Tensor]:
    g = gen(7)
    outlier = torch.randn(6, 300, generator=g)
    outlier[2, 77] = 1.0e6
    outlier[4, 299] = -3.0e4
    mixed = torch.randn(8, 129, generator=g) * torch.logspace(-30, 30, 8)[:, None]
    return {
        "zeros": torch.zeros(9, 33),
        "constant": torch.full((4, 129), 0.731),
        "negative constant": torch.full((3, 64), -2.5),
        "outlier": outlier,
        "rows of mixed magnitude": mixed,
        "signed zeros": torch.tensor([[-0.0, 0.0, -0.0], [0.0, -0.0, 0.0]]),
        "no columns": torch.empty(5, 0),
        "no rows": torch.empty(0, 7),
        "nothing": torch.empty(0, 0),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(_special()))
def test_special_inputs(device: str, name: str) -> None:
    x = _special()[name]
    for block in (1, 2, 8, 32, 64, 1024):
        want = _reference(x, block)
        got = _run(x, block, device)
        assert_rotation_close(got, want, x, block)
        if name == "zeros":
            assert_same(got, torch.zeros_like(want))  # +0.0 everywhere, padding included


@pytest.mark.parametrize("device", DEVICES)
def test_constant_row_concentrates_in_the_first_column(device: str) -> None:
    """A constant block c is c * sqrt(B) times the first basis vector: out = (c sqrt(B), 0,
    ..., 0) for every block, exactly (the butterflies add equal values and subtract them)."""
    for block in (2, 16, 256):
        x = torch.full((3, 2 * block), 0.5)
        got = _run(x, block, device).cpu().reshape(3, 2, block)
        assert bool((got[..., 1:] == 0).all())
        torch.testing.assert_close(
            got[..., 0], torch.full((3, 2), 0.5 * math.sqrt(block)), rtol=2e-7, atol=0
        )


# ---------------------------------------------------------------- bits: threads, ISA, devices


def test_cpu_same_for_any_thread_count_and_isa(threads: None) -> None:
    # over 2^20 output values, so two threads split the rows
    ops = library("cpu")
    x = torch.randn(2100, 513, generator=gen(5)) * torch.logspace(-3, 3, 2100)[:, None]
    for block in (4, 32, 1024):
        want = ops.hadamard_rotate(x, block)
        for what in variants("cpu"):
            assert_same(ops.hadamard_rotate(x, block), want, f"block {block}, {what}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_equals_cpu_bit_for_bit() -> None:
    """The CUDA kernel does the CPU kernel's float32 operations in the same order."""
    cpu, cuda = library("cpu"), library("cuda")
    x = torch.randn(301, 1433, generator=gen(6)) * torch.logspace(-3, 3, 301)[:, None]
    for block in BLOCKS:
        assert_same(cuda.hadamard_rotate(x.cuda(), block), cpu.hadamard_rotate(x, block))


# ---------------------------------------------------------------- algebra


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", [1, 2, 8, 32, 128, 1024])
def test_orthonormal(device: str, block: int) -> None:
    """Rotating twice returns the padded input (H_B H_B = I), and each row keeps its norm."""
    x = torch.randn(17, 1433, generator=gen(block)).to(device)
    once = hadamard_rotate(x, block)
    twice = hadamard_rotate(once, block)
    assert_rotation_close(twice, _padded(x, block).cpu(), x, block)
    torch.testing.assert_close(
        once.double().norm(dim=1), x.double().norm(dim=1), rtol=16 * EPS, atol=0
    )


@pytest.mark.parametrize("device", DEVICES)
def test_rotating_both_operands_keeps_the_product(device: str) -> None:
    a = torch.randn(20, 100, generator=gen(1), dtype=torch.float64).to(device)
    b = torch.randn(100, 9, generator=gen(2), dtype=torch.float64).to(device)
    ra, rb = hadamard_rotate(a, 32), hadamard_rotate(b.t(), 32)
    assert ra.shape == (20, 128)
    torch.testing.assert_close(ra.double() @ rb.double().t(), a @ b, rtol=0, atol=1e-4)


# ---------------------------------------------------------------- gradient


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(7, 37), (3, 2, 64), (130,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradient_matches_the_reference(device: str, shape: tuple[int, ...], dtype) -> None:
    library(device)
    block = 16
    base = torch.randn(*shape, generator=gen(3), dtype=dtype)
    padded = -(-shape[-1] // block) * block
    weight = torch.randn(*shape[:-1], padded, generator=gen(4)).to(device)
    grads = {}
    for backend in ("reference", "auto"):
        x = base.to(device).requires_grad_()
        out = hadamard_rotate(x, block, backend=backend)
        (out * weight).sum().backward()
        assert x.grad is not None and x.grad.dtype == dtype and x.grad.shape == x.shape
        grads[backend] = x.grad
    norms = _block_norms(weight.reshape(-1, padded).cpu(), block)[..., : shape[-1]]
    torch.testing.assert_close(
        grads["auto"].double().cpu().reshape(norms.shape) / norms,
        grads["reference"].double().cpu().reshape(norms.shape) / norms,
        rtol=0,
        atol=16 * EPS,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_raw_op_backward_is_the_rotation_of_the_gradient(device: str) -> None:
    ops = library(device)
    x = torch.randn(5, 45, generator=gen(8)).to(device).requires_grad_()
    out = ops.hadamard_rotate(x, 8)
    grad = torch.randn(out.shape, generator=gen(9)).to(device)
    out.backward(grad)
    assert_same(x.grad, ops.hadamard_rotate(grad, 8)[:, :45])
    # differentiable again (the backward calls the op): sum(R(v)[:, :cols]) has the gradient
    # R(mask) in v, mask the padded ones
    y = torch.randn(4, 9, generator=gen(10)).to(device).requires_grad_()
    v = torch.randn(4, 12, generator=gen(11)).to(device).requires_grad_()
    (gy,) = torch.autograd.grad(ops.hadamard_rotate(y, 4), y, grad_outputs=v, create_graph=True)
    gy.sum().backward()
    assert_same(v.grad, ops.hadamard_rotate(torch.ones(4, 9, device=device), 4))


# ---------------------------------------------------------------- opcheck


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    x = torch.randn(33, 5, generator=gen(2)).to(device)
    for args in (
        (x, 4),
        (x.t(), 8),
        (x[:0], 2),
        (x[:, :0], 16),
        (x.t().contiguous()[:, :31], 1024),
        (torch.randn(3, 100, generator=gen(3)).to(device).requires_grad_(), 64),
    ):
        opcheck(ops.hadamard_rotate.default, args)


# ---------------------------------------------------------------- the Python front


@pytest.mark.parametrize("device", DEVICES)
def test_front_shapes_dtypes_and_views(device: str) -> None:
    ops = library(device)
    g = gen(11)
    wide = torch.randn(40, 66, generator=g, dtype=torch.float64).to(device)
    cases = {
        "rank 1": torch.randn(45, generator=g).to(device),
        "rank 3": torch.randn(4, 3, 45, generator=g).to(device),
        "rank 3, no rows": torch.empty(0, 3, 45, device=device),
        "rank 3, no columns": torch.empty(2, 3, 0, device=device),
        "transposed float64": wide.t(),
        "strided": wide[::3, ::2],
        "float16": torch.randn(6, 45, generator=g).half().to(device),
        "bfloat16": torch.randn(6, 45, generator=g).bfloat16().to(device),
    }
    for name, x in cases.items():
        for block in (4, 64):
            got = hadamard_rotate(x, block)
            rows, padded = math.prod(x.shape[:-1]), -(-x.shape[-1] // block) * block
            assert got.shape == (*x.shape[:-1], padded), name
            assert got.dtype == torch.float32 and got.device == x.device, name
            flat = x.float().reshape(rows, x.shape[-1])
            # the kernel on the 2-d float32 copy, and the reference
            assert_same(got.reshape(rows, padded), ops.hadamard_rotate(flat.contiguous(), block))
            want = _reference(flat.cpu(), block)
            assert_rotation_close(got.reshape(rows, padded), want, flat, block)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_front_empty_inputs(device: str, backend: str) -> None:
    library(device)
    for shape in [(0,), (0, 45), (2, 3, 0), (0, 3, 45)]:
        x = torch.empty(shape, device=device, requires_grad=True)
        out = hadamard_rotate(x, 16, backend=backend)
        assert out.shape == (*shape[:-1], -(-shape[-1] // 16) * 16), shape
        out.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape


def test_front_dispatches_to_the_kernel() -> None:
    library("cpu")
    dispatch.reset()
    try:
        x = torch.randn(7, 1001, dtype=torch.float64, generator=gen(3))[:, ::3]
        a = hadamard_rotate(x, 32, backend="ext-cpu")
        b = hadamard_rotate(x, 32, backend="reference")
        c = hadamard_rotate(x, 32)  # auto: the CPU kernel
        assert_same(a, c)
        assert_rotation_close(a, b, x.float(), 32)
        assert dispatch.snapshot() == {"hadamard_rotate": {"ext-cpu": 2, "reference": 1}}
        assert dispatch.fallbacks() == []
    finally:
        dispatch.reset()


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    op = "ops.hadamard_rotate"
    power = r"block must be a power of two in 1\.\.1024, got "
    x = "torch.ones(2, 3, device=dev)"
    raw = [
        ErrorCase(f"raw block {b}", f"{op}({x}, {b})", "ValueError", power + str(b))
        for b in (0, 3, 2048, -4, 1023, 2**40)
    ]
    raw += [
        ErrorCase("raw block False", f"{op}({x}, False)", "ValueError", power + "0"),
        ErrorCase(
            "raw int32",
            f"{op}(torch.ones(2, 3, device=dev, dtype=torch.int32), 4)",
            "TypeError",
            "qtrain::hadamard_rotate: x must be float32, got int32",
        ),
        ErrorCase(
            "raw float64",
            f"{op}(torch.ones(2, 3, device=dev, dtype=torch.float64), 4)",
            "TypeError",
            "x must be float32, got float64",
        ),
        ErrorCase("raw 1-d", f"{op}(torch.ones(3, device=dev), 4)", "ValueError", "x must be 2-d"),
        ErrorCase(
            "raw 3-d", f"{op}(torch.ones(2, 3, 4, device=dev), 4)", "ValueError", "x must be 2-d"
        ),
        ErrorCase("raw 0-d", f"{op}(torch.ones((), device=dev), 4)", "ValueError", "x must be 2-d"),
        ErrorCase(
            "raw sparse", f"{op}(torch.eye(3, device=dev).to_sparse(), 4)", "ValueError", "dense"
        ),
    ]
    front = [
        ErrorCase(f"front block {b}", f"rotate({x}, {b})", "ValueError", power + b)
        for b in ("0", "3", "2048", "-1", "True", "4.0", "None")
    ]
    front += [
        ErrorCase(
            f"front {backend} int32",
            f"rotate(torch.ones(2, 3, device=dev, dtype=torch.int32), 4, backend={backend!r})",
            "TypeError",
            "hadamard_rotate: x must be a floating-point tensor, got torch.int32",
        )
        for backend in ("auto", "reference")
    ]
    front += [
        ErrorCase(
            "front reference block 2048",
            f"rotate({x}, 2048, backend='reference')",
            "ValueError",
            power + "2048",
        ),
        ErrorCase("front list", "rotate([1.0, 2.0], 2)", "TypeError", "must be a torch.Tensor"),
        ErrorCase(
            "front 0-d", "rotate(torch.ones((), device=dev), 2)", "ValueError", "one dimension"
        ),
        ErrorCase(
            "front sparse",
            "rotate(torch.eye(3, device=dev).to_sparse(), 2)",
            "ValueError",
            "dense",
        ),
        ErrorCase(
            "front backend",
            f"rotate({x}, 2, backend='fast')",
            "ValueError",
            "backend must be one of",
        ),
    ]
    expect_errors(
        raw + front, device, setup="from qtrain.ops.rotate import hadamard_rotate as rotate"
    )
