"""torch.ops.qtrain.unpack_bits on every device against its reference
(qtrain.quant.rowwise.unpack_bits), bit for bit: partial last groups, longer buffers
than the values need, misaligned streams (CUDA's scalar path), every ISA variant and
1 / 2 threads on the CPU."""

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
        packed = torch.randint(0, 256, (ref.packed_size(n, bits),), dtype=torch.uint8, generator=g)
        want = ref.unpack_bits(packed, bits, n)
        got = ops.unpack_bits(packed.to(device), bits, n)
        assert got.device.type == torch.device(device).type
        assert_same(got, want, f"n={n}")
        if n < 5000:
            # a longer buffer (as a caller may keep) decodes the same prefix
            longer = torch.cat([packed, torch.full((5,), 255, dtype=torch.uint8)])
            assert_same(ops.unpack_bits(longer.to(device), bits, n), want, f"longer n={n}")
            assert_same(ops.unpack_bits(misaligned(packed, device), bits, n), want, f"odd n={n}")
            assert_same(ops.unpack_bits(packed.to(device), bits, n // 2), want[: n // 2])


@pytest.mark.parametrize("bits", (1, 2, 4))
def test_cpu_same_for_any_thread_count_and_isa(bits: int, threads: None) -> None:
    ops = library("cpu")
    packed = torch.randint(
        0, 256, (ref.packed_size(PACK_BIG, bits),), dtype=torch.uint8, generator=gen(3)
    )
    want = ref.unpack_bits(packed, bits, PACK_BIG)
    for what in variants("cpu"):
        assert_same(ops.unpack_bits(packed, bits, PACK_BIG), want, what)
        for size in PACK_SIZES:
            assert_same(ops.unpack_bits(packed, bits, size), want[:size], f"{what}, n={size}")


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device: str) -> None:
    ops = library(device)
    for bits in BITS:
        out = ops.unpack_bits(torch.empty(0, dtype=torch.uint8, device=device), bits, 0)
        assert out.shape == (0,) and out.dtype == torch.uint8
        assert out.device.type == torch.device(device).type


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    packed = torch.randint(0, 256, (23,), dtype=torch.uint8, generator=gen(1)).to(device)
    for args in ((packed, 2, 90), (packed, 1, 184), (packed, 8, 23), (packed[:0], 4, 0)):
        opcheck(ops.unpack_bits.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    p = "torch.zeros(3, dtype=torch.uint8, device=dev)"
    expect_errors(
        [
            *(
                ErrorCase(f"bits {b}", f"ops.unpack_bits({p}, {b}, 3)", "ValueError", "1, 2, 4, 8")
                for b in (0, 3, 16)
            ),
            ErrorCase(
                "2-d",
                "ops.unpack_bits(torch.zeros(2, 2, dtype=torch.uint8, device=dev), 2, 3)",
                "TypeError",
                "packed must be a 1-d uint8 tensor",
            ),
            ErrorCase("int32", f"ops.unpack_bits({p}.int(), 2, 3)", "TypeError", "1-d uint8"),
            ErrorCase("short", f"ops.unpack_bits({p}[:2], 2, 9)", "ValueError", "need"),
            ErrorCase("negative n", f"ops.unpack_bits({p}, 2, -1)", "ValueError", "element count"),
            ErrorCase(
                "too many values", f"ops.unpack_bits({p}, 1, 2**61)", "ValueError", "element count"
            ),
        ],
        device,
    )
