"""torch.ops.qtrain.pack_bits on every device against its reference
(qtrain.quant.rowwise.pack_bits), bit for bit: stream ends that are partial groups,
misaligned inputs (CUDA's scalar path), bool masks of any shape and layout, every ISA
variant and 1 / 2 threads on the CPU."""

from __future__ import annotations

import pytest
import torch
from compress_cases import BITS, PACK_BIG, PACK_SIZES, misaligned
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

from qtrain.quant import rowwise as ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", BITS)
def test_matches_reference(device: str, bits: int) -> None:
    ops = library(device)
    g = gen(bits)
    for n in (*PACK_SIZES, PACK_BIG):
        v = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        want = ref.pack_bits(v, bits)
        assert_same(ops.pack_bits(v.to(device), bits), want, f"n={n}")
        if n < 5000:
            assert_same(ops.pack_bits(misaligned(v, device), bits), want, f"misaligned n={n}")
            assert_same(ops.pack_bits(v.to(device).reshape(1, n, 1), bits), want, f"3-d n={n}")


@pytest.mark.parametrize("device", DEVICES)
def test_bool_masks(device: str) -> None:
    ops = library(device)
    g = gen(5)
    for shape in ((5, 7), (1000, 333)):
        mask = torch.rand(*shape, generator=g) > 0.5
        assert_same(ops.pack_bits(mask.to(device), 1), ref.pack_bits(mask, 1))
        assert_same(ops.pack_bits(mask.to(device).t(), 1), ref.pack_bits(mask.t(), 1))


@pytest.mark.parametrize("bits", (1, 2, 4))
def test_cpu_same_for_any_thread_count_and_isa(bits: int, threads: None) -> None:
    ops = library("cpu")
    v = torch.randint(0, 256, (PACK_BIG,), dtype=torch.uint8, generator=gen(7))
    want = ref.pack_bits(v, bits)
    for what in variants("cpu"):
        assert_same(ops.pack_bits(v, bits), want, what)
        for size in PACK_SIZES:
            got = ops.pack_bits(v[:size], bits)
            assert_same(got, ref.pack_bits(v[:size], bits), f"{what}, n={size}")


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device: str) -> None:
    ops = library(device)
    for bits in BITS:
        out = ops.pack_bits(torch.empty(0, dtype=torch.uint8, device=device), bits)
        assert out.shape == (0,) and out.dtype == torch.uint8
        assert out.device.type == torch.device(device).type


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    v = torch.randint(0, 256, (45,), dtype=torch.uint8, generator=gen(1)).to(device)
    mask = (torch.rand(6, 7, generator=gen(2)) > 0.5).to(device)
    for args in ((v, 2), (mask.t(), 1), (v[:0], 4), (v, 8)):
        opcheck(ops.pack_bits.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    v = "torch.zeros(3, dtype=torch.uint8, device=dev)"
    expect_errors(
        [
            *(
                ErrorCase(f"bits {b}", f"ops.pack_bits({v}, {b})", "ValueError", "1, 2, 4, 8")
                for b in (0, 3, 16)
            ),
            ErrorCase(
                "int32",
                "ops.pack_bits(torch.zeros(3, dtype=torch.int32, device=dev), 2)",
                "TypeError",
                "values must be uint8 or bool, got int32",
            ),
            ErrorCase(
                "sparse",
                "ops.pack_bits(torch.eye(3, device=dev).to(torch.uint8).to_sparse(), 2)",
                "ValueError",
                "dense",
            ),
            ErrorCase(
                "too many values",
                f"ops.pack_bits({v}[:1].expand(2**61), 1)",
                "ValueError",
                r"element count must be in \[0, 2\^60\]",
            ),
        ],
        device,
    )
