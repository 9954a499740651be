"""The exact plugin's dense products whose backward reads the stored input: weight
gradients from the projected rows, or from the quantized rows a block at a time."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import codec_hooks
from qtrain.plugins.exact import compressed
from qtrain.plugins.exact.compressed import CompressingCodec
from qtrain.plugins.exact.projected import projected_product, row_blocked_product

from qtrain.train.activations import ActivationMeter, installed_codec


def _operands(form: str, rows: int, d: int, out: int) -> tuple[Any, ...]:
    x = torch.randn(rows, d, requires_grad=True)
    if form == "linear":
        w = torch.nn.Parameter(torch.randn(out, d))
    else:
        w = torch.nn.Parameter(torch.randn(d, out))
    bias = torch.nn.Parameter(torch.randn(out)) if form in ("linear", "addmm") else None
    return x, w, bias


def _product(form: str, x: torch.Tensor, w: torch.Tensor, bias: Any) -> torch.Tensor:
    if form == "linear":
        return F.linear(x, w, bias)
    if form == "addmm":
        return torch.addmm(bias, x, w)
    return x @ w


@pytest.mark.parametrize("form", ["linear", "mm", "addmm"])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("d", [37, 64, 256])
def test_weight_gradient_equals_the_unprojected_one_up_to_rounding(
    form: str, bits: int, d: int
) -> None:
    torch.manual_seed(bits * 1000 + d)
    x, w, bias = _operands(form, 300, d, 11)
    params = [p for p in (x, w, bias) if p is not None]
    grad = torch.randn(300, 11)
    routed_codec = CompressingCodec(bits, rp_ratio=8, seed=5)
    with codec_hooks(routed_codec):
        out = projected_product(routed_codec, x, w, bias, form == "linear")
    assert out is not None
    assert torch.equal(out, _product(form, x, w, bias))  # forward is the float product
    got = torch.autograd.grad(out, params, grad)
    # the same stored form, projected back to d columns, as backward had it before
    codec = CompressingCodec(bits, rp_ratio=8, seed=5)
    x_hat = codec.decode(codec.encode(x)).requires_grad_()
    want = torch.autograd.grad(
        _product(form, x_hat, w, bias), [x_hat, w, bias][: len(params)], grad
    )
    assert torch.equal(got[0], want[0])  # the input gradient needs only w
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4 * want[1].abs().max().item())
    if bias is not None:
        assert torch.equal(got[2], want[2])
    assert routed_codec.stats["projected"] == 1


def test_products_the_codec_would_not_project_are_left_alone() -> None:
    codec = CompressingCodec(2, rp_ratio=8)
    w = torch.nn.Parameter(torch.randn(8, 64))
    assert projected_product(codec, torch.randn(100, 64), w, None, True) is None  # no grad
    narrow = torch.randn(100, 16, requires_grad=True)  # 16 -> 2 < 32 / bits: kept
    assert (
        projected_product(codec, narrow, torch.nn.Parameter(torch.randn(8, 16)), None, True) is None
    )
    batched = torch.randn(4, 100, 64, requires_grad=True)
    assert projected_product(codec, batched, w, None, True) is None
    x = torch.randn(100, 64, requires_grad=True)
    codec.skip_projection(x)  # a BatchNorm input
    assert projected_product(codec, x, w, None, True) is None
    with codec.suspended():
        assert (
            projected_product(codec, torch.randn(100, 64, requires_grad=True), w, None, True)
            is None
        )
    plain = CompressingCodec(2, rp_ratio=1)
    assert projected_product(plain, torch.randn(100, 64, requires_grad=True), w, None, True) is None
    assert codec.stats["projected"] == 0


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 256)
        self.b = torch.nn.Linear(256, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def test_plugin_routes_linear_layers_and_the_meter_counts_the_same_bytes() -> None:
    """tanh saves h; b's product saves it too: one stored form, counted once."""
    import qtrain

    def step(quant: dict[str, Any]) -> tuple[int, dict[str, Any], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = _Mlp()
        x = torch.randn(500, 16)
        with qtrain.patch(quant, seed=3) as session:
            meter = ActivationMeter(model.parameters(), torch.device("cpu"))
            with meter.step([x]):
                model(x).square().sum().backward()
        return (
            meter.activation_bytes,
            session.report()["exact"],
            [p.grad for p in model.parameters()],
        )

    plain_bytes, plain, plain_grads = step({"plugin": ["exact"], "exact": {"rp_ratio": 8}})
    assert plain["projected_products"] == 1  # b; a's input is the step's input
    # the same codec through the hooks alone: b's weight gradient from x^ = y R^T
    torch.manual_seed(0)
    model = _Mlp()
    x = torch.randn(500, 16)
    codec = CompressingCodec(2, rp_ratio=8, seed=3)
    meter = ActivationMeter(model.parameters(), torch.device("cpu"))
    with installed_codec(codec), meter.step([x]):
        model(x).square().sum().backward()
    assert plain_bytes == meter.activation_bytes
    for got, want in zip(plain_grads, [p.grad for p in model.parameters()], strict=True):
        assert F.cosine_similarity(got.reshape(-1), want.reshape(-1), dim=0) > 0.9999


def test_no_projected_products_with_tango_or_without_projection() -> None:
    import qtrain

    x = torch.randn(300, 16)
    for quant in (
        {"plugin": ["exact"], "exact": {"rp_ratio": 1}},
        {"plugin": ["tango", "exact"], "exact": {"rp_ratio": 8}},
    ):
        model = _Mlp()
        with qtrain.patch(quant) as session:
            model(x).sum().backward()
        assert session.report()["exact"]["projected_products"] == 0
        assert all(p.grad is not None for p in model.parameters())


# ---------------------------------------------------------------- unprojected: row blocks


@pytest.mark.parametrize("form", ["linear", "mm", "addmm"])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize(("rows", "d"), [(300, 37), (1001, 64), (32, 8)])
def test_weight_gradient_equals_the_one_from_the_rebuilt_input(
    monkeypatch: pytest.MonkeyPatch, form: str, bits: int, rows: int, d: int
) -> None:
    # blocks of a few rows: many blocks, a short last one, boundaries inside packed bytes
    monkeypatch.setattr(compressed, "GRAD_BLOCK_BYTES", 4 * d * 24)
    torch.manual_seed(bits * 1000 + d)
    x = torch.randn(rows, d, requires_grad=True)
    x.data[:3] = 0.0  # all-zero rows
    x.data[3:5] = 1.5  # constant rows
    w = torch.nn.Parameter(torch.randn(11, d) if form == "linear" else torch.randn(d, 11))
    bias = torch.nn.Parameter(torch.randn(11)) if form != "mm" else None
    params = [p for p in (x, w, bias) if p is not None]
    grad = torch.randn(rows, 11)
    codec = CompressingCodec(bits, rp_ratio=1, seed=5)
    decoded: list[Any] = []
    decode = codec.decode
    monkeypatch.setattr(codec, "decode", lambda s: decoded.append(s) or decode(s))
    with codec_hooks(codec):
        out = row_blocked_product(codec, x, w, bias, form == "linear")
    assert out is not None
    assert torch.equal(out, _product(form, x, w, bias))  # forward is the float product
    got = torch.autograd.grad(out, params, grad)
    assert decoded == []  # backward never rebuilt x
    # the same stored form, rebuilt whole, as torch's own backward had it
    reference = CompressingCodec(bits, rp_ratio=1, seed=5)
    x_hat = reference.decode(reference.encode(x)).requires_grad_()
    want = torch.autograd.grad(
        _product(form, x_hat, w, bias), [x_hat, w, bias][: len(params)], grad
    )
    assert torch.equal(got[0], want[0])  # the input gradient needs only w
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5 * want[1].abs().max().item())
    if bias is not None:
        assert torch.equal(got[2], want[2])


def test_products_the_codec_would_store_otherwise_are_left_alone() -> None:
    codec = CompressingCodec(2, rp_ratio=1)
    w = torch.nn.Parameter(torch.randn(8, 64))
    narrow = torch.randn(100, 4, requires_grad=True)  # rows below MIN_ROW: stored in blocks
    assert (
        row_blocked_product(codec, narrow, torch.nn.Parameter(torch.randn(8, 4)), None, True)
        is None
    )
    assert (
        row_blocked_product(codec, torch.randn(4, 100, 64, requires_grad=True), w, None, True)
        is None
    )
    assert row_blocked_product(codec, torch.randn(2, 64, requires_grad=True), w, None, True) is None
    with codec.suspended():
        assert (
            row_blocked_product(codec, torch.randn(100, 64, requires_grad=True), w, None, True)
            is None
        )
    projecting = CompressingCodec(2, rp_ratio=8)  # it would project: the projected product's
    assert (
        row_blocked_product(projecting, torch.randn(100, 64, requires_grad=True), w, None, True)
        is None
    )


def test_the_plugin_routes_products_without_projection_and_not_under_tango() -> None:
    import qtrain

    x = torch.randn(300, 16)
    for quant, routed in (
        ({"plugin": ["exact"], "exact": {"rp_ratio": 1}}, 1),  # b; a's input is the step's
        ({"plugin": ["tango", "exact"], "exact": {"rp_ratio": 1}}, 0),
    ):
        model = _Mlp()
        with qtrain.patch(quant) as session:
            model(x).sum().backward()
        assert session.report()["exact"]["row_blocked_products"] == routed
        assert all(p.grad is not None for p in model.parameters())
