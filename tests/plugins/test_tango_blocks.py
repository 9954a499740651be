"""tango's weight gradient with one scale per block of nodes (``scales = "block"``) and the
unsigned levels of nonnegative tensors (``unsigned``), issue 32: the products are the
block-quantized ones, blocks keep a power-law gradient column that one scale per column
loses at 2 bits, a nonnegative tensor at 2 bits keeps four levels, and a run reports
what it used."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from qtrain.plugins.tango import payoff
from qtrain.plugins.tango.cache import QuantCache
from qtrain.plugins.tango.functions import quant_linear
from qtrain.plugins.tango.policy import NODE_BLOCKS, ROWS, QuantPolicy

from qtrain.ops import dispatch
from qtrain.quant.granular import dequantize_tiles, quantize_col_blocks, quantize_rows_symmetric


@pytest.fixture(autouse=True)
def _every_primitive_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payoff, "MEASURED", {})
    dispatch.reset()


def _rows(t: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows_symmetric(t.detach().contiguous(), bits)


def _nt(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    acc = (a[0].to(torch.float64) @ b[0].to(torch.float64).t()).to(torch.float32)
    return acc * (a[1] * b[1].reshape(1, -1))


def _blocks_tn(a: torch.Tensor, b: torch.Tensor, bits: int, block: int) -> torch.Tensor:
    """a^T b of block-quantized columns, the blocks added in order (reference_block_gemm)."""
    qa, sa = quantize_col_blocks(a.detach().contiguous(), bits, block)
    qb, sb = quantize_col_blocks(b.detach().contiguous(), bits, block)
    out = torch.zeros(a.shape[1], b.shape[1])
    for i, k0 in enumerate(range(0, a.shape[0], block)):
        acc = qa[k0 : k0 + block].double().t() @ qb[k0 : k0 + block].double()
        out = out + acc.float() * (sa[i][:, None] * sb[i][None, :])
    return out


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("linear", [True, False])
def test_block_scaled_weight_gradient_is_the_block_quantized_product(
    linear: bool, cache: bool, packed: bool
) -> None:
    """Forward and dX as with one scale per row; dW from blocks of 16 nodes of each column
    of X and dY (round to nearest: no stream to replay), one thread (the blocks add in
    order). Packed (4 bits), the X columns kept for dW are quantized straight into two values
    a byte and the block GEMM reads them so: the same bits, no int8 copy packed or
    unpacked."""
    torch.manual_seed(0)
    bits, block = 4, 16
    x = torch.randn(70, 13, requires_grad=True)  # 70 nodes: 4 full blocks and one of 6
    w = torch.randn(7, 13) if linear else torch.randn(13, 7)
    w.requires_grad_(True)
    policy = QuantPolicy(
        bits=bits,
        rounding="nearest",
        scales="block",
        scale_block=block,
        cache=QuantCache() if cache else None,
        packed=packed,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        y = quant_linear(policy, x, w, linear=linear)
        g = torch.randn(70, 7)
        dx, dw = torch.autograd.grad(y, (x, w), g)
    finally:
        torch.set_num_threads(threads)
    w_out_rows = w if linear else w.t()
    assert torch.equal(y, _nt(_rows(x, bits), _rows(w_out_rows, bits)))
    assert torch.equal(dx, _nt(_rows(g, bits), _rows(w_out_rows.t(), bits)))
    dw_want = _blocks_tn(g, x, bits, block)  # [7, 13]
    assert torch.equal(dw, dw_want if linear else dw_want.t())
    snapshot = dispatch.snapshot()
    assert sum(snapshot["block_gemm"].values()) == 1 and sum(snapshot["gemm"].values()) == 2
    assert "pack_int4" not in snapshot and "unpack_int4" not in snapshot, snapshot
    assert policy.operands_packed == (1 if packed and cache else 0)


def test_blocks_keep_a_power_law_weight_gradient_at_two_bits() -> None:
    """dW = dY^T X over nodes of power-law magnitudes (hubs): at 2 bits one scale per
    column rounds most nodes to 0; one per block of 64 nodes does not."""
    torch.manual_seed(2)
    nodes = 20_000
    hubs = (torch.rand(nodes, 1) ** -2.0).clamp(max=1e4)
    x = (torch.randn(nodes, 32) * hubs).requires_grad_(True)
    w = torch.randn(16, 32, requires_grad=True)
    g = torch.randn(nodes, 16) * hubs
    want = g.t() @ x.detach()
    errors = {}
    for scales in ("row", "block"):
        policy = QuantPolicy(bits=2, rounding="stochastic", scales=scales, seed=3)
        y = quant_linear(policy, x, w, linear=True)
        (dw,) = torch.autograd.grad(y, (w,), g)
        errors[scales] = float((dw - want).norm() / want.norm())
    assert errors["block"] < 0.5 * errors["row"], errors


def test_the_cache_keeps_node_blocks_apart_and_packs_them() -> None:
    """A tensor's row quantization and its node blocks are two cache entries; at 4 bits
    the blocks a product keeps for backward are packed and unpack to the same values."""
    policy = QuantPolicy(bits=4, scales="block", scale_block=8, packed=True)
    x = torch.randn(20, 5, requires_grad=True)
    with torch.enable_grad():
        rows = policy.cached(x, True, ROWS)
        blocks = policy.cached(x, True, NODE_BLOCKS, packed=True)
    assert rows[1].shape == (20, 1)
    assert blocks[0].dtype == torch.uint8 and blocks[1].shape == (3, 5)
    q, s = policy.unpacked(blocks, policy.quantized_width(x, NODE_BLOCKS))
    want = dequantize_tiles(q, s, (8, 1))
    assert float((want - x.detach()).abs().max()) <= float(s.max()) * 1.0001


def test_unsigned_levels_for_a_nonnegative_tensor() -> None:
    """At 2 bits a ReLU's output keeps 0..3 times its row's scale (the symmetric levels
    give it 0 and 1); a tensor with a negative value, 4 bits and unsigned = False keep
    the symmetric levels."""
    torch.manual_seed(5)
    relu = torch.randn(50, 40).clamp(min=0)
    signed = torch.randn(50, 40)
    on = QuantPolicy(bits=2, rounding="nearest", scales="row", unsigned=True)
    off = QuantPolicy(bits=2, rounding="nearest", scales="row", unsigned=False)
    q, s = on.fresh(relu, by=ROWS)
    assert set(q.unique().tolist()) == {0, 1, 2, 3}
    torch.testing.assert_close(s, relu.amax(1, keepdim=True) / 3)
    assert on.unsigned_quantized == 1
    assert set(off.fresh(relu, by=ROWS)[0].unique().tolist()) == {0, 1}
    assert set(on.fresh(signed, by=ROWS)[0].unique().tolist()) == {-1, 0, 1}
    four = QuantPolicy(bits=4, rounding="nearest", scales="row", unsigned=True)
    assert int(four.fresh(relu, by=ROWS)[0].max()) == 7 and four.unsigned_quantized == 0
    err = {
        name: float((p.fresh(relu, by=ROWS)[0] * p.fresh(relu, by=ROWS)[1] - relu).norm())
        for name, p in (("on", on), ("off", off))
    }
    assert err["on"] < 0.6 * err["off"], err


def test_unsigned_levels_still_pack_and_refuse_nan() -> None:
    policy = QuantPolicy(bits=3, scales="row", unsigned=True, packed=True)
    relu = torch.rand(9, 11)
    value = policy.cached(relu, False, ROWS, packed=True)
    q, _ = policy.unpacked(value, 11)
    assert value[0].dtype == torch.uint8 and int(q.max()) == 7 and int(q.min()) >= 0
    bad = torch.rand(4, 4)
    bad[1, 1] = float("nan")
    from qtrain.plugins.tango.policy import NonFiniteOperand

    with pytest.raises(NonFiniteOperand):
        policy.fresh(bad, by=ROWS)


@pytest.mark.parametrize("extra", ['bits = 2\nscales = "block"', 'bits = 4\nscales = "block"'])
def test_a_run_reports_blocks_and_runs_the_block_kernels(
    tango_recipe: Callable[[str], Path], extra: str
) -> None:
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    # 3 layers: the hidden layer reads the first one's ReLU output (the last is float32)
    recipe = load_recipe(tango_recipe(extra), ["model.layers=3"])
    summary = execute(recipe, reporter=Reporter())
    report = summary["plugin_reports"]["tango"]
    assert report["scales"] == "block" and report["scale_block"] == 64
    kernels = summary["kernels"]
    assert kernels["block_gemm"].get("ext-cpu", 0) > 0, kernels
    assert kernels["quantize_cols"].get("ext-cpu", 0) > 0, kernels
    assert report["unsigned"] is True
    if "bits = 2" in extra:  # the GCN's ReLU outputs
        assert report["unsigned_quantized"] > 0, report
    else:
        assert report["unsigned_quantized"] == 0, report


def test_bad_block_options_are_refused(tango_recipe: Callable[[str], Path]) -> None:
    from qtrain.recipe import load_recipe

    for extra, match in (
        ("scale_block = 0", "scale_block"),
        ("scale_block = 70000", "scale_block"),
        ('scales = "blocks"', "scales"),
        ('unsigned = "yes"', "unsigned"),
        ('scales = "block"\nrotation = 16', "rotation = 16 needs one scale per row"),
    ):
        with pytest.raises(Exception, match=match):
            load_recipe(tango_recipe(extra), [])


def test_calibration_measures_the_unsigned_levels_the_run_uses() -> None:
    """Error_X of a nonnegative first-layer output: lower with the unsigned levels at 2 and
    3 bits, the same from 4 bits on (where the run keeps the symmetric ones)."""
    from qtrain.plugins.tango.calibrate import error_x_by_bits

    torch.manual_seed(6)
    x = torch.randn(400, 24).clamp(min=0)
    on = error_x_by_bits(x, "nearest", 0, "block", unsigned=True)
    off = error_x_by_bits(x, "nearest", 0, "block", unsigned=False)
    assert on[2] < 0.7 * off[2] and on[3] < 0.7 * off[3], (on, off)
    assert all(on[b] == off[b] for b in range(4, 9))
    signed = torch.randn(400, 24)
    assert error_x_by_bits(signed, "nearest", 0, "row", unsigned=True) == error_x_by_bits(
        signed, "nearest", 0, "row"
    )
