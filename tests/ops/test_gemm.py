"""INT8 GEMM: the references and the Python fronts (qtrain.ops.gemm): dispatch, counting,
``backend=`` choice, and the same refusals on every backend.

The ops themselves (torch.ops.qtrain.int8_gemm / quantized_gemm against the references,
bit for bit, on every device) are tested in tests/ops/test_int8_gemm.py and
tests/ops/test_quantized_gemm.py.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch
from conftest import require_ext

from qtrain.ops import dispatch
from qtrain.ops.gemm import (
    GEMM_KERNELS,
    LAYOUTS,
    QUANTIZED_GEMM_KERNELS,
    combined_scale,
    int8_gemm,
    quantized_gemm,
    reference_int8_gemm,
    reference_quantized_gemm,
)
from qtrain.quant.quantize import quantize_symmetric

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
COMPILED = {"cpu": "ext-cpu", "cuda": "ext-cuda"}


def _int8(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.int32)


# ------------------------------------------------------------------ the references


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reference_int8_gemm_is_the_integer_product(layout: str) -> None:
    qa = _int8((6, 5), 1) if layout != "tn" else _int8((5, 6), 1)
    qb = _int8((5, 4), 2) if layout != "nt" else _int8((4, 5), 2)
    a = qa.long().t() if layout == "tn" else qa.long()
    b = qb.long().t() if layout == "nt" else qb.long()
    out = reference_int8_gemm(qa, qb, 0.5, layout, torch.ones(4))
    assert out.dtype == torch.float32 and out.shape == (6, 4)
    assert torch.equal(out, (a @ b).float() * 0.5 + 1)
    # a zero output carries the sign of the scale, never of a float64 -0.0 product
    zero = reference_int8_gemm(
        torch.zeros(1, 1, dtype=torch.int8), torch.full((1, 1), -3, dtype=torch.int8), 1.0
    )
    assert _bits(zero).item() == 0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_reference_quantized_gemm_with_true_ranges(layout: str, rounding: str) -> None:
    """With the operands' own absmax: quantize_symmetric of each, then the int8 product."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn((9, 7) if layout == "tn" else (7, 9), generator=g)
    b = torch.randn((5, 9) if layout == "nt" else (9, 5), generator=g)
    stochastic = rounding == "stochastic"
    out, absmax = reference_quantized_gemm(
        a, b, a.abs().max(), float(b.abs().max()), 6, 8, layout, None, stochastic, 4, 10, 20
    )
    qa, sa = quantize_symmetric(a, 6, rounding, 4, 10)
    qb, sb = quantize_symmetric(b, 8, rounding, 4, 20)
    want = reference_int8_gemm(qa, qb, combined_scale(sa, sb), layout)
    assert torch.equal(_bits(out), _bits(want))
    assert torch.equal(_bits(absmax), _bits(want.abs().max()))


def test_reference_quantized_gemm_clamps_beyond_the_range() -> None:
    a = torch.tensor([[4.0, -4.0, 0.5]])
    b = torch.ones(3, 1)
    out, absmax = reference_quantized_gemm(a, b, 1.0, 1.0, 8, 8)
    # a quantizes to (127, -127, 64) with scale 1/127: the values beyond 1 clamp
    scale = combined_scale(1.0 / 127, 1.0 / 127)
    assert torch.equal(out, torch.tensor([[64.0 * 127]]) * torch.tensor(scale))
    assert absmax.shape == () and absmax.dtype == torch.float32


# ------------------------------------------------------------------ the fronts


@pytest.mark.parametrize("device", DEVICES)
def test_int8_gemm_dispatch_counts(device: str) -> None:
    require_ext()
    qa, qb = _int8((4, 5), 2), _int8((5, 6), 3)
    dispatch.reset()
    try:
        bias = torch.zeros(6)
        out = int8_gemm(
            qa.to(device), qb.to(device), torch.tensor(0.5), 0.25, "nn", bias.to(device)
        )
        assert out.device.type == device
        assert torch.equal(_bits(out), _bits(reference_int8_gemm(qa, qb, 0.125, "nn", bias)))
        ref = int8_gemm(qa.to(device), qb.to(device), 0.5, 0.25, "nn", backend="reference")
        assert torch.equal(_bits(ref), _bits(out))
        compiled = COMPILED[device]
        int8_gemm(qa.to(device), qb.to(device), 1.0, 1.0, backend=compiled)
        assert dispatch.snapshot() == {"gemm": {compiled: 2, "reference": 1}}
        assert dispatch.fallbacks() == []
    finally:
        dispatch.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_quantized_gemm_dispatch_counts_and_chains(device: str) -> None:
    """The compiled kernel serves "auto" on every device; its returned absmax (left on the
    device) is the next call's range, as a layer feeds the next."""
    require_ext()
    assert set(QUANTIZED_GEMM_KERNELS) == set(GEMM_KERNELS) == {"ext-cpu", "ext-cuda"}
    g = torch.Generator().manual_seed(4)
    a, b, w = torch.randn(30, 12, generator=g), torch.randn(12, 9, generator=g), torch.randn(9, 5)
    dispatch.reset()
    try:
        c, m = quantized_gemm(
            a.to(device), b.to(device), a.abs().max(), b.abs().max(), rounding="stochastic", seed=3
        )
        c2, m2 = quantized_gemm(c, w.to(device), m, w.abs().max(), 6, 8, rounding="stochastic")
        assert m.device.type == m2.device.type == device
        want, want_max = reference_quantized_gemm(
            a, b, a.abs().max(), b.abs().max(), stochastic=True, seed=3
        )
        assert torch.equal(_bits(c), _bits(want)) and torch.equal(_bits(m), _bits(want_max))
        want2, want2_max = reference_quantized_gemm(
            want, w, want_max, w.abs().max(), 6, 8, stochastic=True
        )
        assert torch.equal(_bits(c2), _bits(want2)) and torch.equal(_bits(m2), _bits(want2_max))
        r2, rm2 = quantized_gemm(
            c, w.to(device), m, w.abs().max(), 6, 8, rounding="stochastic", backend="reference"
        )
        assert torch.equal(_bits(r2), _bits(want2)) and torch.equal(_bits(rm2), _bits(want2_max))
        assert dispatch.snapshot() == {"quantized_gemm": {COMPILED[device]: 2, "reference": 1}}
        assert dispatch.fallbacks() == []
    finally:
        dispatch.reset()


def test_quantized_gemm_takes_ranges_as_numbers_or_tensors() -> None:
    require_ext()
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(8, 6, generator=g), torch.randn(6, 3, generator=g)
    want = reference_quantized_gemm(a, b, 2.0, 1.5, 7, 5, "nn", None, True, 9)
    for ra, rb in ((2.0, 1.5), (torch.tensor(2.0, dtype=torch.float64), torch.tensor([1.5]))):
        for backend in ("auto", "reference"):
            got = quantized_gemm(a, b, ra, rb, 7, 5, rounding="stochastic", seed=9, backend=backend)
            assert torch.equal(_bits(got[0]), _bits(want[0]))
            assert torch.equal(_bits(got[1]), _bits(want[1]))


def test_backend_choice_errors() -> None:
    qa, qb = _int8((2, 3), 1), _int8((3, 2), 2)
    with pytest.raises(ValueError, match="cannot run on a cpu tensor"):
        int8_gemm(qa, qb, 1.0, 1.0, backend="ext-cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        quantized_gemm(qa.float(), qb.float(), 1.0, 1.0, backend="cuda")
    with pytest.raises(ValueError, match="rounding must be one of"):
        quantized_gemm(qa.float(), qb.float(), 1.0, 1.0, rounding="up")
    with pytest.raises(TypeError, match=r"qa must be a torch\.Tensor"):
        int8_gemm([[1]], qb, 1.0, 1.0)  # type: ignore[arg-type]


# Bad arguments of the fronts: (name, call on the "int8" / "quantized" front, exception, match).
# Every backend refuses them with the same exception: the ops' C++ fronts on the compiled
# path, the references' own checks on the reference path.
_A8 = torch.zeros(3, 4, dtype=torch.int8)
_B8 = torch.zeros(4, 5, dtype=torch.int8)
_AF = torch.ones(4, 3)
_BF = torch.ones(3, 2)
BAD: list[tuple[str, Callable[[str], object], type[Exception], str]] = [
    ("layout", lambda be: int8_gemm(_A8, _B8, 1.0, 1.0, "tt", backend=be), ValueError, "layout"),
    ("qa dtype", lambda be: int8_gemm(_A8.float(), _B8, 1.0, 1.0, backend=be), TypeError,
     "qa must be int8"),
    ("qb dtype", lambda be: int8_gemm(_A8, _B8.to(torch.uint8), 1.0, 1.0, backend=be), TypeError,
     "qb must be int8"),
    ("qa 1-d", lambda be: int8_gemm(_A8[0], _B8, 1.0, 1.0, backend=be), ValueError, "qa must be 2-d"),
    ("qa sparse", lambda be: int8_gemm(_A8.to_sparse(), _B8, 1.0, 1.0, backend=be), ValueError,
     "dense"),
    ("qb device", lambda be: int8_gemm(_A8, _B8.to("meta"), 1.0, 1.0, backend=be), ValueError,
     "qb is on meta"),
    ("inner", lambda be: int8_gemm(_A8, _B8, 1.0, 1.0, "tn", backend=be), ValueError,
     "inner dimensions differ"),
    ("bias shape", lambda be: int8_gemm(_A8, _B8, 1.0, 1.0, bias=torch.zeros(3), backend=be),
     ValueError, r"bias must have shape \(5,\)"),
    ("bias dtype", lambda be: int8_gemm(_A8, _B8, 1.0, 1.0, bias=torch.zeros(5, dtype=torch.int64),
     backend=be), TypeError, "bias must be a floating-point"),
    ("q layout", lambda be: quantized_gemm(_AF, _BF, 1.0, 1.0, layout="NN", backend=be), ValueError,
     "layout"),
    ("q bits_a", lambda be: quantized_gemm(_AF, _BF, 1.0, 1.0, 1, backend=be), ValueError,
     r"bits_a must be an integer in 2\.\.8"),
    ("q bits_b", lambda be: quantized_gemm(_AF, _BF, 1.0, 1.0, 8, 9, backend=be), ValueError,
     r"bits_b must be an integer in 2\.\.8"),
    ("q a dtype", lambda be: quantized_gemm(_AF.double(), _BF, 1.0, 1.0, backend=be), TypeError,
     "a must be float32, got float64"),
    ("q b dtype", lambda be: quantized_gemm(_AF, _BF.to(torch.int8), 1.0, 1.0, backend=be),
     TypeError, "b must be float32, got int8"),
    ("q b 3-d", lambda be: quantized_gemm(_AF, _BF[None], 1.0, 1.0, backend=be), ValueError,
     "b must be 2-d"),
    ("q inner", lambda be: quantized_gemm(_AF, _BF, 1.0, 1.0, layout="nt", backend=be), ValueError,
     "inner dimensions differ"),
    ("q range values", lambda be: quantized_gemm(_AF, _BF, torch.ones(2), 1.0, backend=be),
     ValueError, "absmax_a must hold one value"),
    ("q range device", lambda be: quantized_gemm(_AF, _BF, 1.0, torch.ones((), device="meta"),
     backend=be), ValueError, "absmax_b is on meta"),
    ("q range NaN", lambda be: quantized_gemm(_AF, _BF, float("nan"), 1.0, backend=be), ValueError,
     "absmax_a must be finite and >= 0"),
    ("q range negative", lambda be: quantized_gemm(_AF, _BF, 1.0, torch.tensor(-2.0), backend=be),
     ValueError, "absmax_b must be finite and >= 0"),
    ("q bias", lambda be: quantized_gemm(_AF, _BF, 1.0, 1.0, bias=torch.zeros(3), backend=be),
     ValueError, r"bias must have shape \(2,\)"),
    ("q offset_a", lambda be: quantized_gemm(_AF, _BF, 1.0, 1.0, offset_a=-1, backend=be),
     ValueError, "offset_a must be >= 0"),
    ("q offset_b", lambda be: quantized_gemm(_AF, _BF, 1.0, 1.0, offset_b=2**63 - 2, backend=be),
     ValueError, "offset_b"),
    ("q seed", lambda be: quantized_gemm(_AF, _BF, 1.0, 1.0, seed=1.5, backend=be), TypeError,
     "seed must be an int"),
]  # fmt: skip


@pytest.mark.parametrize("backend", ["reference", "ext-cpu"])
@pytest.mark.parametrize("case", BAD, ids=[case[0] for case in BAD])
def test_every_backend_refuses_the_same_arguments(
    backend: str, case: tuple[str, Callable[[str], object], type[Exception], str]
) -> None:
    if backend != "reference":
        require_ext()
    _, call, error, match = case
    dispatch.reset()
    with pytest.raises(error, match=match):
        call(backend)


def test_isa_names_report_vnni_sensibly(isas: list[str]) -> None:
    ext: ModuleType = require_ext()
    info = ext.info()
    assert info["isa_compiled"][0] == "avx512vnni" or info["isa_compiled"] == ["default"]
    assert info["isa_best"] == info["isa_supported"][0]
    for isa in isas:
        ext.set_isa(isa)
        assert ext.info()["isa"] == isa
    with pytest.raises(ValueError, match="unknown ISA"):
        ext.set_isa("avx512vnni2")
