"""torch.ops.qtrain.masked_scale on every device against its reference
(qtrain.quant.rowwise.masked_scale), bit for bit: kept NaNs stay NaN and dropped ones
become +0, partial last mask bytes, misaligned gradients (CUDA's scalar path), any
shape taken flat, 1 / 2 threads on the CPU."""

from __future__ import annotations

import pytest
import torch
from compress_cases import misaligned
from support import DEVICES, ErrorCase, assert_same, expect_errors, gen, library, opcheck

from qtrain.quant import rowwise as ref


def _inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = gen(n)
    grad = torch.randn(n, generator=g)
    if n:
        grad[0] = float("nan")  # a kept NaN stays NaN, a dropped one becomes +0
    mask = torch.rand(n, generator=g) > 0.4
    return grad, mask, ref.pack_bits(mask, 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 1000, 300_001])
@pytest.mark.parametrize("scale", [1.0, 1.0 / 0.3, 2.0])
def test_matches_reference(device: str, n: int, scale: float, threads: None) -> None:
    ops = library(device)
    grad, mask, packed = _inputs(n)
    want = ref.masked_scale(grad, packed, scale)
    assert torch.equal(want[~mask], torch.zeros(int((~mask).sum())))
    kept = grad[mask] * torch.tensor(scale, dtype=torch.float32)
    assert torch.equal(want[mask].nan_to_num(7.0), kept.nan_to_num(7.0))
    grads = [grad.to(device)] + ([misaligned(grad, device)] if n else [])
    for t in (1, 2) if device == "cpu" else (torch.get_num_threads(),):
        torch.set_num_threads(t)
        for gr in grads:
            got = ops.masked_scale(gr, packed.to(device), scale)
            assert got.device.type == torch.device(device).type
            assert_same(got, want, f"n={n}, {t} threads, {gr.data_ptr() % 16}")


@pytest.mark.parametrize("device", DEVICES)
def test_any_shape_taken_flat(device: str) -> None:
    ops = library(device)
    grad, _, packed = _inputs(1000)
    want = ref.masked_scale(grad, packed, 2.0)
    got = ops.masked_scale(grad.reshape(40, 25).to(device), packed.to(device), 2.0)
    assert got.shape == (40, 25)
    assert_same(got.reshape(-1), want)
    # a transposed gradient is taken in its row-major order, as the reference does
    g2 = grad.reshape(25, 40).t()
    assert_same(
        ops.masked_scale(g2.to(device), packed.to(device), 2.0), ref.masked_scale(g2, packed, 2.0)
    )


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    _, _, packed = _inputs(45)
    grad = torch.randn(45, generator=gen(4))  # no NaN: opcheck compares with assert_close
    grad, packed = grad.to(device), packed.to(device)
    for args in (
        (grad, packed, 2.0),
        (grad.reshape(5, 9), packed, 1.0),
        (grad[:0], packed[:0], 3.0),
    ):
        opcheck(ops.masked_scale.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    setup = "g = torch.randn(20, device=dev); m = torch.zeros(3, dtype=torch.uint8, device=dev); "
    expect_errors(
        [
            ErrorCase(
                "float64",
                "ops.masked_scale(g.double(), m, 1.0)",
                "TypeError",
                "grad must be float32",
            ),
            ErrorCase("int32 mask", "ops.masked_scale(g, m.int(), 1.0)", "TypeError", "1-d uint8"),
            ErrorCase("2-d mask", "ops.masked_scale(g, m[None], 1.0)", "TypeError", "1-d uint8"),
            ErrorCase("short mask", "ops.masked_scale(g, m[:2], 1.0)", "ValueError", "need"),
            ErrorCase("sparse", "ops.masked_scale(g.to_sparse(), m, 1.0)", "ValueError", "dense"),
            ErrorCase(
                "mask elsewhere",
                "ops.masked_scale(g, m.to(other), 1.0)",
                "ValueError",
                "packed is on",
            ),
        ],
        device,
        setup,
    )
