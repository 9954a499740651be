"""torch.ops.qtrain.int8_segment_gemm on every device against its reference
(qtrain.ops.typed.reference_int8_segment_gemm), bit for bit: every layout, CPU ISA variant
and thread count, empty segments, many relations, odd widths, long inner dimensions (the
split-K paths), strided operands; and the public qtrain.ops.typed.int8_segment_gemm
against per-segment qtrain.ops.gemm.int8_gemm.

The kernels run int8_gemm's GEMM once per segment, written into the output's slice, and
integer sums are exact, so every element must equal the reference's exactly."""

from __future__ import annotations

import pytest
import torch
from gemm_cases import constant, int8s
from support import (
    DEVICES,
    SEGMENT_EDGES,
    ErrorCase,
    assert_same,
    expect_errors,
    library,
    opcheck,
    variants,
)

from qtrain.ops import dispatch
from qtrain.ops.gemm import LAYOUTS, combined_scale
from qtrain.ops.gemm import int8_gemm as dense_int8_gemm
from qtrain.ops.typed import (
    int8_segment_gemm,
    offsets_from_lengths,
    reference_int8_segment_gemm,
)

ODD = (1, 3, 17, 129)
SCALE = combined_scale(0.0123, 0.456)


def _random(seed: int):
    """int8 values in [-127, 127] (the symmetric quantizer's range)."""
    return int8s(seed, -127, 128)


def _operands(
    lengths: list[int], k: int, m: int, layout: str, make
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qa, qb, offsets) of ``layout`` on the CPU: "nn" qa [N, k], qb [R, k, m]; "nt" qa
    [N, m], qb [R, k, m]; "tn" qa [N, k], qb [N, m]."""
    offsets = offsets_from_lengths(torch.tensor(lengths, dtype=torch.int64))
    n, r = int(offsets[-1]), len(lengths)
    if layout == "tn":
        return make((n, k)), make((n, m)), offsets
    return make((n, m if layout == "nt" else k)), make((r, k, m)), offsets


def _reference(qa, qb, offsets, scale: float, layout: str) -> torch.Tensor:
    """The reference on CPU copies, on one thread (the result does not depend on it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return reference_int8_segment_gemm(qa.cpu(), qb.cpu(), offsets, scale, layout)
    finally:
        torch.set_num_threads(before)


def _check(device: str, qa, qb, offsets, layout: str, scale: float = SCALE, what: str = "") -> None:
    """The op equals the reference bit for bit in every kernel variant of ``device``."""
    ops = library(device)
    want = _reference(qa, qb, offsets, scale, layout)
    qa_d, qb_d = qa.to(device), qb.to(device)
    for variant in variants(device):
        got = ops.int8_segment_gemm(qa_d, qb_d, offsets, scale, layout)
        assert got.device.type == torch.device(device).type
        assert got.is_contiguous()
        assert_same(got, want, f"{what} {layout} {tuple(qa.shape)} x {tuple(qb.shape)}, {variant}")


def _power_law(relations: int, seed: int) -> list[int]:
    """Segment sizes of a heavy-tailed relation mix: a few large, many small or empty."""
    g = torch.Generator().manual_seed(seed)
    sizes = (3000.0 / torch.arange(1, relations + 1, dtype=torch.float64) ** 1.6).long()
    return sizes[torch.randperm(relations, generator=g)].tolist()


# ---------------------------------------------------------------- the reference itself


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reference_is_int8_gemm_per_segment(layout: str) -> None:
    """Each segment's block of the reference is the dense reference GEMM of its slices."""
    lengths = [4, 0, 9, 1]
    qa, qb, offsets = _operands(lengths, 5, 7, layout, _random(1))
    out = reference_int8_segment_gemm(qa, qb, offsets, SCALE, layout)
    bounds = offsets.tolist()
    for r in range(len(lengths)):
        s, e = bounds[r], bounds[r + 1]
        if layout == "tn":
            want = dense_int8_gemm(qa[s:e], qb[s:e], SCALE, 1.0, "tn", backend="reference")
            assert_same(out[r], want if e > s else torch.zeros(5, 7), f"relation {r}")
        else:
            want = dense_int8_gemm(qa[s:e], qb[r], SCALE, 1.0, layout, backend="reference")
            assert_same(out[s:e], want, f"relation {r}")


# ---------------------------------------------------------------- against the reference


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_reference(device: str, layout: str) -> None:
    lengths = [5, 0, 33, 1, 7, 0, 64, 2]
    make = _random(10 + LAYOUTS.index(layout))
    for k in ODD:
        for m in ODD:
            qa, qb, offsets = _operands(lengths, k, m, layout, make)
            _check(device, qa, qb, offsets, layout, what=f"k={k}, m={m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths", SEGMENT_EDGES)
def test_segment_edges(device: str, lengths: list[int]) -> None:
    for layout in LAYOUTS:
        qa, qb, offsets = _operands(lengths, 6, 5, layout, _random(2))
        _check(device, qa, qb, offsets, layout, what=str(lengths))
        if layout == "tn":  # relations without rows: zeros
            got = library(device).int8_segment_gemm(
                qa.to(device), qb.to(device), offsets, -1.5, "tn"
            )
            empty = torch.tensor([n == 0 for n in lengths], dtype=torch.bool)
            assert_same(got.cpu()[empty], torch.zeros(int(empty.sum()), 6, 5))


@pytest.mark.parametrize("device", DEVICES)
def test_many_relations_power_law(device: str) -> None:
    lengths = _power_law(474, 1)
    assert lengths.count(0) > 100 and max(lengths) > 1000  # empty ones and large ones
    for layout in LAYOUTS:
        qa, qb, offsets = _operands(lengths, 16, 24, layout, _random(3))
        _check(device, qa, qb, offsets, layout, what="474 relations")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_widths(device: str, layout: str) -> None:
    """K or M of 0: empty outputs, or int8_gemm's zero products (their sign that of scale)."""
    lengths = [3, 0, 4]
    for k, m in ((0, 5), (5, 0), (0, 0)):
        qa, qb, offsets = _operands(lengths, k, m, layout, _random(4))
        for scale in (SCALE, -1.5):
            _check(device, qa, qb, offsets, layout, scale, what=f"k={k}, m={m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("value", [0, 127, -127])
def test_constant_operands(device: str, layout: str, value: int) -> None:
    lengths = [3, 0, 70, 1]
    qa, qb, offsets = _operands(lengths, 33, 65, layout, constant(value))
    _check(device, qa, qb, offsets, layout, scale=1.0, what=f"all {value}")
    got = library(device).int8_segment_gemm(qa.to(device), qb.to(device), offsets, 1.0, layout)
    if layout == "tn":  # out[r] = len_r * value^2 in every element
        want = torch.tensor(lengths, dtype=torch.float32)[:, None, None] * value * value
        assert_same(got, want.expand(len(lengths), 33, 65).contiguous())
    else:  # the inner dimension (K, or M for "nt") times value^2
        inner = 33 if layout == "nn" else 65
        assert bool((got == float(inner * value * value)).all())
    # opposite extremes: the largest magnitudes the accumulator sees
    _check(device, qa, -qb, offsets, layout, what=f"{value} x {-value}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_long_inner_dimension(device: str, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large inner dimension: K = 4096 columns ("nn"; M for "nt"), or a segment of 5000
    rows ("tn", whose inner dimension is the segment): the split-K paths (CPU "tn" both
    strategies, CUDA few output tiles with a long K); the first rows at -127."""
    if layout == "tn":
        lengths, k, m = [5000, 0, 3, 4100], 7, 9
    else:
        lengths, k, m = [19, 0, 2, 40], 4096, 13
        if layout == "nt":
            k, m = 13, 4096
    qa, qb, offsets = _operands(lengths, k, m, layout, _random(5))
    qa[:2] = -127
    qb[:2] = -127
    cpu_tn = device == "cpu" and layout == "tn"
    for strategy in ("split", "rows") if cpu_tn else ("auto",):
        monkeypatch.setenv("QTRAIN_GEMM_TN", strategy)
        _check(device, qa, qb, offsets, layout, scale=1e-4, what=f"long K, {strategy}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_operands(device: str, layout: str) -> None:
    lengths = [4, 0, 17, 2]
    make = _random(6)
    qa, qb, offsets = _operands(lengths, 9, 7, layout, make)
    qa_t = qa.t().contiguous().t()  # a transposed view: column-major
    assert not qa_t.is_contiguous()
    if layout == "tn":
        qb_s = torch.cat([qb, make(qb.shape)], 1)[:, : qb.shape[1]]  # a strided slice
    else:
        qb_s = qb.transpose(1, 2).contiguous().transpose(1, 2)
    assert not qb_s.is_contiguous()
    strided_offsets = torch.stack([offsets, offsets], 1)[:, 0]
    assert not strided_offsets.is_contiguous()
    want = _reference(qa, qb, offsets, SCALE, layout)
    ops = library(device)
    for variant in variants(device):
        got = ops.int8_segment_gemm(
            qa_t.to(device), qb_s.to(device), strided_offsets, SCALE, layout
        )
        assert_same(got, want, f"strided {layout}, {variant}")
    # views at an odd byte offset of tensors on the device: unaligned slices
    base_a = torch.zeros(qa.numel() + 1, dtype=torch.int8, device=device)
    base_a[1:] = qa.reshape(-1).to(device)
    got = ops.int8_segment_gemm(base_a[1:].view(qa.shape), qb.to(device), offsets, SCALE, layout)
    assert_same(got, want, f"unaligned {layout}")


# ---------------------------------------------------------------- the public function


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_public_function_is_int8_gemm_per_segment(device: str, layout: str) -> None:
    """With two scales, each segment's block is qtrain.ops.gemm.int8_gemm's, bit for bit,
    on the device's kernel and on the reference; each call counted once."""
    library(device)
    lengths = [7, 0, 30, 1, 0, 12]
    qa, qb, offsets = _operands(lengths, 19, 33, layout, _random(7))
    qa, qb = qa.to(device), qb.to(device)
    scale_a = torch.tensor(0.0123, device=device)  # a scale tensor, as quantize returns it
    scale_b = 0.456
    dispatch.reset()
    try:
        got = int8_segment_gemm(qa, qb, offsets, scale_a, scale_b, layout)
        ref = int8_segment_gemm(qa, qb, offsets, scale_a, scale_b, layout, backend="reference")
        kernel = "ext-cuda" if device == "cuda" else "ext-cpu"
        assert dispatch.snapshot() == {"int8_segment_gemm": {kernel: 1, "reference": 1}}
        assert dispatch.fallbacks() == []
    finally:
        dispatch.reset()
    assert_same(got, ref, "kernel vs reference")
    bounds = offsets.tolist()
    for r in range(len(lengths)):
        s, e = bounds[r], bounds[r + 1]
        if layout == "tn":
            if e == s:
                assert not bool(got[r].any())
                continue
            want = dense_int8_gemm(qa[s:e], qb[s:e], scale_a, scale_b, "tn")
            assert_same(got[r], want, f"relation {r}")
        else:
            want = dense_int8_gemm(qa[s:e], qb[r], scale_a, scale_b, layout)
            assert_same(got[s:e], want, f"relation {r}")


def test_reference_refuses_what_the_op_refuses() -> None:
    qa = torch.zeros(6, 4, dtype=torch.int8)
    qb = torch.zeros(3, 4, 5, dtype=torch.int8)
    off = torch.tensor([0, 2, 2, 6])
    for args, error, match in (
        ((qa.float(), qb, off, 1.0, "nn"), TypeError, "qa must be int8, got float32"),
        ((qa, qb, off.int(), 1.0, "nn"), TypeError, "offsets must be int64"),
        ((qa, qb, off[None], 1.0, "nn"), ValueError, "offsets must be 1-d"),
        ((qa, qb, torch.tensor([1, 2, 2, 6]), 1.0, "nn"), ValueError, "start at 0"),
        ((qa, qb, torch.tensor([0, 3, 2, 6]), 1.0, "nn"), ValueError, "non-decreasing"),
        ((qa, qb, torch.tensor([0, 2, 2, 5]), 1.0, "nn"), ValueError, r"rows of qa \(6\)"),
        ((qa, qb, off, 1.0, "tt"), ValueError, "layout must be one of"),
        ((qa, qb[:2], off, 1.0, "nn"), ValueError, "qb has 2 relations but offsets give R = 3"),
        ((qa, qb, off, 1.0, "nt"), ValueError, "qa has M = 4 columns"),
        ((qa, qb[:, :3], off, 1.0, "nn"), ValueError, "qa has K = 4 columns"),
        ((qa, qb[0, :5], off, 1.0, "tn"), ValueError, "qb has 4 rows but qa has 6"),
    ):
        with pytest.raises(error, match=match):
            reference_int8_segment_gemm(*args)


# ---------------------------------------------------------------- opcheck, errors


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device: str) -> None:
    ops = library(device)
    for lengths in ([3, 0, 2, 1], [0, 0], []):
        for layout in LAYOUTS:
            qa, qb, offsets = _operands(lengths, 4, 3, layout, _random(8))
            opcheck(
                ops.int8_segment_gemm.default,
                (qa.to(device), qb.to(device), offsets, 0.25, layout),
            )


_SETUP = """
qa = torch.randint(-127, 128, (6, 4), dtype=torch.int8).to(dev)
off = torch.tensor([0, 2, 2, 6])
qb = torch.randint(-127, 128, (3, 4, 5), dtype=torch.int8).to(dev)
qt = torch.randint(-127, 128, (6, 5), dtype=torch.int8).to(dev)
"""


def _call(qa: str = "qa", qb: str = "qb", off: str = "off", layout: str = "'nn'") -> str:
    return f"ops.int8_segment_gemm({qa}, {qb}, {off}, 0.5, {layout})"


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device: str) -> None:
    fn = "qtrain::int8_segment_gemm"
    cases = [
        ErrorCase(
            "qa float32", _call(qa="qa.float()"), "TypeError", f"{fn}: qa must be int8, got float32"
        ),
        ErrorCase(
            "qb uint8",
            _call(qb="qb.to(torch.uint8)"),
            "TypeError",
            "qb must be int8, got uint8",
        ),
        ErrorCase("qa 1-d", _call(qa="qa[0]"), "ValueError", "qa must be 2-d"),
        ErrorCase("qa sparse", _call(qa="qa.to_sparse()"), "ValueError", "qa must be a dense"),
        ErrorCase("qb sparse", _call(qb="qb.to_sparse()"), "ValueError", "qb must be a dense"),
        ErrorCase(
            "int32 offsets",
            _call(off="off.int()"),
            "TypeError",
            f"{fn}: offsets must be int64, got int32",
        ),
        ErrorCase(
            "2-d offsets",
            _call(off="off[None]"),
            "ValueError",
            r"offsets must be 1-d with R \+ 1 >= 1 elements, got shape \[1, 4\]",
        ),
        ErrorCase("no offsets", _call(off="off[:0]"), "ValueError", r"offsets must be 1-d"),
        ErrorCase(
            "offsets not on the CPU",
            _call(off="off.to(dev if dev.type == 'cuda' else other)"),
            "ValueError",
            f"{fn}: offsets must be on the CPU",
        ),
        ErrorCase("qb device", _call(qb="qb.to(other)"), "ValueError", f"{fn}: qb is on"),
        ErrorCase(
            "bad layout",
            _call(layout="'tt'"),
            "ValueError",
            f"{fn}: layout must be one of 'nn', 'nt', 'tn', got 'tt'",
        ),
        ErrorCase("layout case", _call(layout="'NN'"), "ValueError", "layout must be one of"),
        ErrorCase(
            "qb relations",
            _call(qb="qb[:2]"),
            "ValueError",
            f"{fn}: qb has 2 relations but offsets give R = 3",
        ),
        ErrorCase(
            "qb relations nt",
            _call(qa="qa.new_zeros(6, 5)", qb="qb[:2]", layout="'nt'"),
            "ValueError",
            "qb has 2 relations but offsets give R = 3",
        ),
        ErrorCase(
            "qb 2-d for nn",
            _call(qb="qb[0]"),
            "ValueError",
            r"qb must be 3-d \[R, K, M\] for layout 'nn', got shape \[4, 5\]",
        ),
        ErrorCase(
            "qb 3-d for tn",
            _call(qb="qb", layout="'tn'"),
            "ValueError",
            r"qb must be 2-d \[N, M\] for layout 'tn', got shape \[3, 4, 5\]",
        ),
        ErrorCase(
            "K mismatch",
            _call(qb="qb.new_zeros(3, 5, 5)"),
            "ValueError",
            r"qa has K = 4 columns but qb \[R, K, M\] of shape \[3, 5, 5\] has K = 5",
        ),
        ErrorCase(
            "M mismatch nt",
            _call(layout="'nt'"),
            "ValueError",
            r"qa has M = 4 columns but qb \[R, K, M\] of shape \[3, 4, 5\] has M = 5",
        ),
        ErrorCase(
            "tn row mismatch",
            _call(qb="qt[:5]", layout="'tn'"),
            "ValueError",
            f"{fn}: qb has 5 rows but qa has 6",
        ),
    ]
    # the offsets' values, found by the kernels as they read them, in every layout
    for layout, qb in (("nn", "qb"), ("nt", "qb.transpose(1, 2)"), ("tn", "qt")):

        def call(off: str, qb: str = qb, layout: str = layout) -> str:
            return _call(qb=qb, off=off, layout=repr(layout))

        cases += [
            ErrorCase(
                f"{layout}: offsets not from 0",
                call("torch.tensor([1, 2, 2, 6])"),
                "ValueError",
                rf"{fn}: offsets must start at 0, got offsets\[0\] = 1",
            ),
            ErrorCase(
                f"{layout}: decreasing offsets",
                call("torch.tensor([0, 3, 2, 6])"),
                "ValueError",
                r"offsets must be non-decreasing, got offsets\[2\] = 2 < offsets\[1\] = 3",
            ),
            ErrorCase(
                f"{layout}: offsets not to N",
                call("torch.tensor([0, 2, 2, 5])"),
                "ValueError",
                r"offsets must end at the rows of qa \(6\), got offsets\[3\] = 5",
            ),
        ]
    expect_errors(cases, device, setup=_SETUP)
