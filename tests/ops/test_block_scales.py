"""Scales per block of rows of a column (issue 32): torch.ops.qtrain.quantize_symmetric_cols
with ``block`` against its reference (qtrain.quant.granular.quantize_col_blocks) bit for bit,
and torch.ops.qtrain.int8_block_gemm against reference_block_gemm (int8 or packed 4-bit
operands), on every device."""

from __future__ import annotations

import pytest
import torch
from quantize_cases import column_inputs, power_law_columns
from support import DEVICES, ErrorCase, assert_same, expect_errors, gen, library, opcheck, variants

from qtrain.ops import dispatch
from qtrain.ops.gemm import int8_block_gemm, int8_gemm, reference_block_gemm
from qtrain.ops.quantize import quantize_per_column
from qtrain.quant import quantize_symmetric
from qtrain.quant.granular import dequantize_tiles, quantize_col_blocks
from qtrain.quant.packed import pack_int4
from qtrain.quant.rng import op_seed

ROUNDINGS = ("nearest", "stochastic")


BLOCKS = (1, 7, 64, 128, 10_000)  # one row a block, odd, the default, larger than the tensor


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(column_inputs()))
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_col_blocks_match_reference(device: str, name: str, rounding: str) -> None:
    x = column_inputs()[name]
    ops = library(device)
    for block in BLOCKS:
        for bits in range(2, 9):
            seed, offset = bits, 2**32 - 50 if rounding == "stochastic" else 0
            q, scale = ops.quantize_symmetric_cols(
                x.to(device), bits, rounding == "stochastic", op_seed(seed), offset, block
            )
            want_q, want_scale = quantize_col_blocks(x, bits, block, rounding, seed, offset)
            assert scale.shape == (-(-x.shape[0] // block), x.shape[1])
            what = f"block={block}, bits={bits}"
            assert_same(q, want_q, what)
            assert_same(scale, want_scale, what)


@pytest.mark.parametrize("device", DEVICES)
def test_each_block_is_quantize_symmetric_of_its_rows(device: str) -> None:
    ops = library(device)
    x = power_law_columns(300, 5, 3)
    q, scale = ops.quantize_symmetric_cols(x.to(device), 3, False, 0, 0, 64)
    assert scale.shape == (5, 5)
    for b in range(5):
        for j in range(5):
            want_q, want_scale = quantize_symmetric(x[64 * b : 64 * (b + 1), j].contiguous(), 3)
            assert_same(q[64 * b : 64 * (b + 1), j], want_q, f"block {b}, column {j}")
            assert_same(scale[b, j], want_scale, f"block {b}, column {j}")
    # a block as long as the tensor is one scale per column, bit for bit
    whole = ops.quantize_symmetric_cols(x.to(device), 4, True, 9, 3, 300)
    cols = ops.quantize_symmetric_cols(x.to(device), 4, True, 9, 3)
    assert_same(whole[0], cols[0])
    assert_same(whole[1], cols[1])


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_col_blocks_same_for_any_thread_count_and_isa(rounding: str, threads: None) -> None:
    ops = library("cpu")
    x = power_law_columns(200_003, 7, 4)  # over 2^20 elements: two threads split the blocks
    x[-1, 6] = 1e6  # a block's max in the last thread's rows
    offset = 2**32 - 555_555
    want_q, want_scale = quantize_col_blocks(x, 2, 64, rounding, 11, offset)
    for what in variants("cpu"):
        q, scale = ops.quantize_symmetric_cols(
            x, 2, rounding == "stochastic", op_seed(11), offset, 64
        )
        assert_same(q, want_q, what)
        assert_same(scale, want_scale, what)


def test_blocks_lose_less_than_columns_at_two_bits() -> None:
    """Why the granularity exists: a column of power-law magnitudes keeps more of itself."""
    x = power_law_columns(20_000, 16, 5)
    q, s = quantize_per_column(x, 2, "nearest", block=64)
    qc, sc = quantize_per_column(x, 2, "nearest")
    block_err = (dequantize_tiles(q, s, (64, 1)) - x).norm() / x.norm()
    column_err = (qc * sc - x).norm() / x.norm()
    assert block_err < 0.5 * column_err, (block_err, column_err)


def _operands(k: int, m: int, n: int, block: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = gen(seed)
    qa = torch.randint(-128, 128, (k, m), dtype=torch.int8, generator=g)
    qb = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)
    blocks = -(-k // block)
    sa = torch.rand(blocks, m, generator=g) * torch.logspace(-3, 3, max(blocks, 1))[:blocks, None]
    sb = torch.rand(blocks, n, generator=g)
    return qa, qb, sa, sb


GEMM_SHAPES = [  # (K, M, N, block)
    (1000, 37, 65, 64),
    (3, 1, 1, 64),
    (130, 130, 7, 1),
    (200, 6, 64, 33),
    (129, 17, 3, 128),
    (64, 5, 5, 64),
    (5000, 70, 130, 64),
    (64, 1500, 1500, 4),  # 7 groups of 16 blocks: the 64 MiB of partial sums binds
    (0, 4, 5, 8),
    (10, 0, 5, 4),
    (10, 5, 0, 4),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", GEMM_SHAPES)
def test_block_gemm_matches_reference(device: str, shape: tuple[int, ...]) -> None:
    """Bit for bit on every device, ISA and thread count: the blocks add in the groups the
    shape fixes, in the reference's order."""
    k, m, n, block = shape
    qa, qb, sa, sb = _operands(k, m, n, block, sum(shape))
    want = reference_block_gemm(qa, qb, sa, sb, block)
    ops = library(device)
    args = [t.to(device) for t in (qa, qb, sa, sb)]
    for what in variants(device):
        assert_same(ops.int8_block_gemm(*args, block), want, what)


@pytest.mark.parametrize("device", DEVICES)
def test_block_gemm_edge_values(device: str) -> None:
    """-128 (VNNI's u8 offset), all-zero operands and scales, one block the whole K."""
    ops = library(device)
    k, m, n = 300, 9, 70
    qa = torch.full((k, m), -128, dtype=torch.int8)
    qb = torch.full((k, n), -128, dtype=torch.int8)
    for block in (1, 64, 300):
        blocks = -(-k // block)
        sa, sb = torch.ones(blocks, m), torch.full((blocks, n), 0.5)
        want = reference_block_gemm(qa, qb, sa, sb, block)
        assert float(want[0, 0]) == 128 * 128 * k * 0.5
        got = ops.int8_block_gemm(qa.to(device), qb.to(device), sa.to(device), sb.to(device), block)
        assert_same(got, want, f"block={block}")
    zeros = ops.int8_block_gemm(
        torch.zeros(100, 3, dtype=torch.int8, device=device),
        torch.ones(100, 4, dtype=torch.int8, device=device),
        torch.zeros(2, 3, device=device),
        torch.zeros(2, 4, device=device),
        64,
    )
    assert_same(zeros, torch.zeros(3, 4))


def _packed_with_junk(q: torch.Tensor, seed: int) -> torch.Tensor:
    """``q`` (int8 4-bit values) packed two a byte, with random bits in the unused high
    nibble of an odd width's last byte: the kernels must not read it."""
    packed = pack_int4(q)
    if q.shape[1] % 2:
        junk = torch.randint(0, 16, (q.shape[0],), dtype=torch.uint8, generator=gen(seed))
        packed[:, -1] |= junk << 4
    return packed


PACKED_SHAPES = [  # (K, M, N, block): odd widths, one column, widths past a 64-column tile
    (1000, 37, 65, 64),
    (3, 1, 1, 64),
    (130, 130, 7, 1),
    (200, 6, 64, 33),
    (129, 17, 3, 128),
    (5000, 71, 130, 64),
    (0, 4, 5, 8),
    (10, 0, 5, 4),
    (10, 5, 0, 4),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", PACKED_SHAPES)
def test_packed_operands_are_read_as_their_values(device: str, shape: tuple[int, ...]) -> None:
    """Either operand, or both, stored packed (uint8, two 4-bit values a byte; issue 32: a
    GEMM reads the packed X columns tango saves): bit for bit the product of the unpacked
    int8 operands and the reference's, every ISA and thread count, junk in a padding nibble
    ignored."""
    k, m, n, block = shape
    _, _, sa, sb = _operands(k, m, n, block, sum(shape))
    g = gen(sum(shape) + 1)
    qa = torch.randint(-8, 8, (k, m), dtype=torch.int8, generator=g)
    qb = torch.randint(-8, 8, (k, n), dtype=torch.int8, generator=g)
    if k > 2:
        qa[1], qb[2] = -8, 7  # the extremes of a nibble
    want = reference_block_gemm(qa, qb, sa, sb, block)
    pa, pb = _packed_with_junk(qa, 1), _packed_with_junk(qb, 2)
    ops = library(device)
    sa, sb = sa.to(device), sb.to(device)
    for a, b, what in ((pa, qb, "qa packed"), (qa, pb, "qb packed"), (pa, pb, "both packed")):
        assert_same(reference_block_gemm(a, b, sa.cpu(), sb.cpu(), block), want, what)
        for variant in variants(device):
            got = ops.int8_block_gemm(a.to(device), b.to(device), sa, sb, block)
            assert_same(got, want, f"{what}, {variant}")


def test_one_block_is_int8_gemm_with_column_scales() -> None:
    qa, qb, sa, sb = _operands(500, 20, 30, 500, 8)
    got = int8_block_gemm(qa, qb, sa, sb, 500, backend="ext-cpu")
    want = int8_gemm(qa, qb, sa[0][:, None], sb[0][None, :], "tn", backend="ext-cpu")
    assert_same(got, want)


def test_block_gemm_of_quantized_blocks_is_close_to_the_float_product() -> None:
    """The weight gradient it exists for: dY^T X over power-law nodes at 2 bits is closer
    to float32 with blocks of 64 nodes than with one scale per column."""
    x, dy = power_law_columns(30_000, 24, 6), power_law_columns(30_000, 16, 7)
    exact = dy.t() @ x
    qg, sg = quantize_per_column(dy, 2, "stochastic", 1, block=64)
    qx, sx = quantize_per_column(x, 2, "stochastic", 2, block=64)
    blocks = int8_block_gemm(qg, qx, sg, sx, 64)
    qg, sg = quantize_per_column(dy, 2, "stochastic", 1)
    qx, sx = quantize_per_column(x, 2, "stochastic", 2)
    columns = int8_gemm(qg, qx, sg, sx, "tn")
    error = lambda got: float((got - exact).norm() / exact.norm())  # noqa: E731
    assert error(blocks) < 0.5 * error(columns), (error(blocks), error(columns))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    x = torch.randn(130, 5, generator=gen(2)).to(device)
    for args in ((x, 4, True, 3, 7, 64), (x.t(), 2, False, 0, 0, 1), (x[:0], 3, True, 0, 0, 8)):
        opcheck(ops.quantize_symmetric_cols.default, args)
    for k, m, n, block in ((200, 6, 7, 64), (0, 3, 2, 4), (5, 1, 1, 1)):
        qa, qb, sa, sb = (t.to(device) for t in _operands(k, m, n, block, 3))
        opcheck(ops.int8_block_gemm.default, (qa, qb, sa, sb, block))
        four_a, four_b = (pack_int4(q.cpu() >> 4).to(device) for q in (qa, qb))  # odd widths
        opcheck(ops.int8_block_gemm.default, (four_a, qb, sa, sb, block))
        opcheck(ops.int8_block_gemm.default, (qa, four_b, sa, sb, block))


def test_front_dispatches_to_the_kernel() -> None:
    library("cpu")
    dispatch.reset()
    try:
        qa, qb, sa, sb = _operands(300, 7, 9, 64, 4)
        a = int8_block_gemm(qa, qb, sa, sb, 64, backend="ext-cpu")
        b = int8_block_gemm(qa, qb, sa, sb, 64, backend="reference")
        assert_same(a, b)
        x = torch.randn(300, 5, generator=gen(1))
        q1 = quantize_per_column(x, 3, "stochastic", 4, 9, "ext-cpu", block=32)
        q2 = quantize_per_column(x, 3, "stochastic", 4, 9, "reference", block=32)
        assert_same(q1[0], q2[0])
        assert_same(q1[1], q2[1])
        assert dispatch.snapshot() == {
            "block_gemm": {"ext-cpu": 1, "reference": 1},
            "quantize_cols": {"ext-cpu": 1, "reference": 1},
        }
    finally:
        dispatch.reset()


def test_reference_refuses_what_the_op_refuses() -> None:
    qa, qb, sa, sb = _operands(100, 3, 4, 64, 5)
    for bad, error, match in (
        ({"block": 0}, ValueError, r"block must be an integer in 1\.\.65536"),
        ({"block": 70_000}, ValueError, r"1\.\.65536"),
        ({"scale_a": sa[:1]}, ValueError, r"scale_a must have shape \(2, 3\)"),
        ({"scale_b": sb.double()}, TypeError, "scale_b must be float32"),
        ({"qb": qb[:50]}, ValueError, "inner dimensions differ"),
        ({"qa": qa.float()}, TypeError, "qa must be int8, or uint8 holding 4-bit values"),
        ({"qa": pack_int4(qa >> 4)[:, :1]}, ValueError, r"scale_a's 3 columns need 2 bytes"),
        ({"qb": pack_int4(qb >> 4), "scale_b": sb[0]}, ValueError, "scale_b must be 2-d"),
        ({"qb": pack_int4(qb >> 4)[:50]}, ValueError, "inner dimensions differ"),
    ):
        args = {"qa": qa, "qb": qb, "scale_a": sa, "scale_b": sb, "block": 64, **bad}
        with pytest.raises(error, match=match):
            reference_block_gemm(**args)
        with pytest.raises(error, match=match):
            int8_block_gemm(**args, backend="ext-cpu")
    with pytest.raises(ValueError, match="block must be >= 0"):
        quantize_per_column(torch.ones(3, 3), 4, block=-1)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    cols, gemm = "ops.quantize_symmetric_cols", "ops.int8_block_gemm"
    setup = (
        "qa = torch.zeros(100, 3, dtype=torch.int8, device=dev); "
        "qb = torch.zeros(100, 4, dtype=torch.int8, device=dev); "
        "sa = torch.ones(2, 3, device=dev); sb = torch.ones(2, 4, device=dev)"
    )
    expect_errors(
        [
            ErrorCase(
                "negative block",
                f"{cols}(torch.ones(4, 3, device=dev), 4, False, 0, 0, -1)",
                "ValueError",
                "block must be >= 0",
            ),
            ErrorCase(
                "NaN in a late block",
                f"x = torch.zeros(5000, 3, device=dev); x[4999, 2] = float('nan'); "
                f"{cols}(x, 4, True, 0, 0, 64)",
                "ValueError",
                "NaN or Inf",
            ),
            ErrorCase(
                "Inf, two threads",
                "torch.set_num_threads(2); x = torch.zeros(400_000, 3, device=dev); "
                f"x[1, 0] = float('inf'); {cols}(x, 2, False, 0, 0, 64)",
                "ValueError",
                "NaN or Inf",
            ),
            ErrorCase("block 0", f"{gemm}(qa, qb, sa, sb, 0)", "ValueError", r"1\.\.65536"),
            ErrorCase("block too long", f"{gemm}(qa, qb, sa, sb, 65537)", "ValueError", "65536"),
            ErrorCase(
                "scale rows",
                f"{gemm}(qa, qb, sa[:1], sb, 64)",
                "ValueError",
                r"scale_a must have shape \(2, 3\)",
            ),
            ErrorCase(
                "scale columns",
                f"{gemm}(qa, qb, sa, sb[:, :3], 64)",
                "ValueError",
                r"scale_b must have shape \(2, 4\)",
            ),
            ErrorCase(
                "scale dtype", f"{gemm}(qa, qb, sa.double(), sb, 64)", "TypeError", "float32"
            ),
            ErrorCase("operand dtype", f"{gemm}(qa.float(), qb, sa, sb, 64)", "TypeError", "int8"),
            ErrorCase(
                "packed bytes",
                f"{gemm}(torch.zeros(100, 1, dtype=torch.uint8, device=dev), qb, sa, sb, 64)",
                "ValueError",
                r"qa is packed .*scale_a's 3 columns need 2 bytes a row, got 1",
            ),
            ErrorCase(
                "packed, 1-d scales",
                f"{gemm}(qa, torch.zeros(100, 2, dtype=torch.uint8, device=dev), sa, sb[0], 64)",
                "ValueError",
                "scale_b must be 2-d",
            ),
            ErrorCase(
                "packed 1-d",
                f"{gemm}(torch.zeros(100, dtype=torch.uint8, device=dev), qb, sa, sb, 64)",
                "ValueError",
                "qa must be 2-d",
            ),
            ErrorCase(
                "inner", f"{gemm}(qa[:50], qb, sa, sb, 64)", "ValueError", "inner dimensions"
            ),
            ErrorCase("1-d", f"{gemm}(qa[:, 0], qb, sa, sb, 64)", "ValueError", "2-d"),
            ErrorCase("device", f"{gemm}(qa, qb.to(other), sa, sb, 64)", "ValueError", "is on"),
            ErrorCase(
                "scale device", f"{gemm}(qa, qb, sa.to(other), sb, 64)", "ValueError", "is on"
            ),
        ],
        device,
        setup,
    )


def test_block_groups_follow_the_shape() -> None:
    """16 groups at most, one per block at most, fewer where 16 partial sums of a large
    output would pass 64 MiB; the big-output case still matches the reference."""
    from qtrain.ops.gemm import block_gemm_groups

    assert block_gemm_groups(2650, 256, 128) == 16
    assert block_gemm_groups(3, 256, 128) == 3
    assert block_gemm_groups(0, 5, 5) == 1
    assert block_gemm_groups(100, 2048, 2048) == 4  # 16 MiB a partial
    assert block_gemm_groups(100, 8192, 8192) == 1
    qa, qb, sa, sb = _operands(640, 1100, 1100, 64, 9)  # 10 blocks, 4.6 MiB partials: 10
    assert block_gemm_groups(10, 1100, 1100) == 10
    assert_same(
        int8_block_gemm(qa, qb, sa, sb, 64, backend="ext-cpu"),
        reference_block_gemm(qa, qb, sa, sb, 64),
    )
