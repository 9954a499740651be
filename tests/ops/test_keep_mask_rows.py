"""torch.ops.qtrain.keep_mask_rows on every device against its reference
(qtrain.ops.masks.reference_keep_mask, packed by qtrain.quant.rowwise.pack_bits)."""

from __future__ import annotations

import pytest
import torch
from support import DEVICES, WIDTHS, ErrorCase, assert_same, expect_errors, library, opcheck

from qtrain.ops.masks import keep_threshold, reference_keep_mask
from qtrain.quant import rowwise
from qtrain.quant.rng import op_seed


def _want(ids: torch.Tensor, width: int, threshold: int, seed: int) -> torch.Tensor:
    return rowwise.pack_bits(reference_keep_mask(ids, width, threshold, seed).reshape(-1), 1)


def _check(ids: torch.Tensor, width: int, p: float, seed: int, device: str) -> torch.Tensor:
    threshold = keep_threshold(p)
    got = library(device).keep_mask_rows(ids.to(device), width, threshold, op_seed(seed))
    assert got.device.type == torch.device(device).type
    assert_same(got, _want(ids, width, threshold, seed), f"width={width}, p={p}, seed={seed}")
    return got.cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [0, *WIDTHS, 8, 64])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_matches_reference(device: str, width: int, p: float) -> None:
    ids = torch.randperm(5000, generator=torch.Generator().manual_seed(width))[:333]
    got = _check(ids, width, p, 11, device)
    kept = rowwise.unpack_bits(got, 1, ids.numel() * width).float()
    if width >= 64 and 0.0 < p < 1.0:
        assert kept.mean().item() == pytest.approx(1.0 - p, abs=0.02)
    if p == 0.0:
        assert bool(kept.all())
    if p == 1.0:
        assert not bool(kept.any())


@pytest.mark.parametrize("device", DEVICES)
def test_edges_threads_and_counters_past_2_32(device: str, threads: None) -> None:
    _check(torch.empty(0, dtype=torch.int64), 7, 0.5, 1, device)
    # ids * width crosses 2^32 inside a row and on a row boundary
    width = 100
    ids = torch.tensor([2**32 // width - 1, 2**32 // width, 3, 2**40, 2**40 + 7])
    big = torch.randperm(200_000)  # several threads' byte ranges, odd width
    for n in (1, 2):
        torch.set_num_threads(n)
        _check(ids, width, 0.3, 5, device)
        _check(big, 3, 0.5, 2**64 - 9, device)
    _check(ids[:, None].expand(5, 2)[:, 1], width, 0.3, 5, device)  # a strided view
    # the largest id allowed (its counters end just below 2^62), alone: the reference
    # hashes a table of every high word between the smallest and the largest counter
    _check(torch.tensor([2**62 // width - 1]), width, 0.3, 5, device)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    ids = torch.tensor([7, 3, 9, 3], device=device)
    opcheck(ops.keep_mask_rows.default, (ids, 13, keep_threshold(0.5), 2))
    opcheck(ops.keep_mask_rows.default, (ids[:0], 13, 0, -1))


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    ids = "torch.tensor([7, 3], device=dev)"
    expect_errors(
        [
            ErrorCase(
                "int32 ids",
                f"ops.keep_mask_rows({ids}.int(), 4, 0)",
                "TypeError",
                "ids must be int64, got int32",
            ),
            ErrorCase(
                "2-d ids", f"ops.keep_mask_rows({ids}[None], 4, 0)", "ValueError", "ids must be 1-d"
            ),
            ErrorCase("negative width", f"ops.keep_mask_rows({ids}, -1, 0)", "ValueError", "width"),
            ErrorCase(
                "threshold", f"ops.keep_mask_rows({ids}, 4, 2**24 + 1)", "ValueError", r"2\^24\]"
            ),
            ErrorCase(
                "negative threshold", f"ops.keep_mask_rows({ids}, 4, -1)", "ValueError", r"2\^24\]"
            ),
            ErrorCase(
                "too large",
                "ops.keep_mask_rows(torch.zeros(2**20, dtype=torch.int64, device=dev), 2**41, 0)",
                "ValueError",
                "too large",
            ),
            ErrorCase(
                "negative id",
                "ops.keep_mask_rows(torch.tensor([3, -1], device=dev), 4, 0)",
                "ValueError",
                r"\[0, 2\^62 / width\)",
            ),
            ErrorCase(
                "id past 2^62 / width",
                "ops.keep_mask_rows(torch.tensor([2**60], device=dev), 4, 0)",
                "ValueError",
                r"\[0, 2\^62 / width\)",
            ),
            ErrorCase(
                "sparse ids",
                f"ops.keep_mask_rows({ids}.to_sparse(), 4, 0)",
                "ValueError",
                "dense",
            ),
        ],
        device,
    )
