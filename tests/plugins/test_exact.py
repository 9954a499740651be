"""The exact plugin: masks, the saved-tensor codec, the activation meter, runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from qtrain.plugins.exact.compressed import (
    BLOCK,
    MIN_BLOCK_BITS,
    CompressedMask,
    CompressedTensor,
    CompressingCodec,
    SharedConstant,
)

from qtrain.ops import masks
from qtrain.train.activations import (
    ActivationMeter,
    copied_from,
    installed_codec,
    note_copy,
    storage_key,
)

# ------------------------------------------------------------------ masks


def _grads(fn: Any, x: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    torch.manual_seed(seed)
    y = fn(x)
    y.backward(torch.arange(y.numel(), dtype=torch.float32).reshape(y.shape))
    return y.detach(), x.grad


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (masks.relu, F.relu),
        (lambda x: masks.leaky_relu(x, 0.2), lambda x: F.leaky_relu(x, 0.2)),
        (lambda x: masks.dropout(x, 0.3), lambda x: F.dropout(x, 0.3, training=True)),
    ],
    ids=["relu", "leaky_relu", "dropout"],
)
def test_masked_functions_equal_torch_and_save_only_a_packed_mask(ours: Any, theirs: Any) -> None:
    x = torch.randn(37, 11)
    x[0] = 0.0  # ties at zero take torch's side (x > 0 passes)
    y_ref, g_ref = _grads(theirs, x)
    y, g = _grads(ours, x)
    assert torch.equal(y, y_ref) and torch.equal(g, g_ref)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        ours(x.clone().requires_grad_(True))
    # one packed 1-bit mask: 37 * 11 bits in 51 bytes
    assert [(t.dtype, t.numel()) for t in saved] == [(torch.uint8, (37 * 11 + 7) // 8)]


# ------------------------------------------------------------------ codec


def _codec(**kw: Any) -> CompressingCodec:
    kw.setdefault("backend", "reference")
    codec = CompressingCodec(**kw)
    codec.begin_step()
    return codec


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", [(300, 16), (50, 4, 8), (1000, 3), (700,), (97, 5, 1)])
def test_codec_round_trip_bound(bits: int, shape: tuple[int, ...]) -> None:
    torch.manual_seed(1)
    x = torch.randn(shape)
    codec = _codec(bits=bits)
    stored = codec.encode(x.requires_grad_(True))  # an activation (narrow constants are kept)
    x = x.detach()
    assert isinstance(stored, CompressedTensor)
    y = codec.decode(stored)
    assert y.shape == x.shape and y.dtype == x.dtype
    # blocks of narrow rows (unrelated edges) take at least MIN_BLOCK_BITS, rows take bits
    assert stored.bits == (max(bits, MIN_BLOCK_BITS) if stored.blocked else bits)
    # each value is off by at most one level of its row (block)
    levels = 2**stored.bits - 1
    rows = x.reshape(-1) if stored.blocked else x.reshape(shape[0], -1)
    if stored.blocked:
        pad = -rows.numel() % BLOCK
        rows = torch.cat([rows, rows.new_zeros(pad)]).reshape(-1, BLOCK)
    step = (rows.amax(1) - rows.amin(1)) / levels
    err = (y.reshape(-1) - x.reshape(-1)).abs()
    bound = (step * 1.02 + 1e-2)[:, None].expand(rows.shape).reshape(-1)[: x.numel()]
    assert bool((err <= bound).all())
    # the packed values at their bits each plus two bfloat16 row parameters, nothing else
    n_rows, width = rows.shape
    assert codec.nbytes(stored) == (n_rows * width * stored.bits + 7) // 8 + 4 * n_rows


@pytest.mark.parametrize("rp_ratio", [1, 4])
def test_codec_means_stores_1_bit_rows_at_their_side_means(rp_ratio: int) -> None:
    """rounding = "means": every row (projected or not) stored as its two side means
    (``quantize_rows_means``), deterministic, at a fraction of stochastic rounding's error;
    narrow rows are still blocked at MIN_BLOCK_BITS and rounded stochastically."""
    torch.manual_seed(2)
    x = torch.randn(300, 64, requires_grad=True)
    errors = {}
    for rounding in ("means", "stochastic"):
        codec = _codec(bits=1, rp_ratio=rp_ratio, rounding=rounding)
        stored = codec.encode(x)
        assert isinstance(stored, CompressedTensor) and stored.bits == 1
        assert (stored.projection is not None) == (rp_ratio > 1)
        errors[rounding] = float((codec.decode(stored) - x.detach()).square().mean())
        if rounding == "means":
            again = _codec(bits=1, rp_ratio=rp_ratio, rounding=rounding, seed=9).encode(x)
            assert torch.equal(again.packed, stored.packed) == (rp_ratio == 1)
            if rp_ratio == 1:
                levels = codec.decode(stored)
                assert all(len(torch.unique(row)) <= 2 for row in levels)
    assert errors["means"] < 0.5 * errors["stochastic"], errors
    att = torch.rand(500, 4, 1, requires_grad=True)
    blocked = _codec(bits=1, rounding="means").encode(att)
    assert blocked.blocked and blocked.bits == MIN_BLOCK_BITS


def test_codec_refuses_means_above_1_bit_and_unknown_roundings() -> None:
    with pytest.raises(ValueError, match='rounding = "means" stores rows at 1 bit'):
        CompressingCodec(bits=2, rounding="means")
    with pytest.raises(ValueError, match="rounding must be one of auto, stochastic"):
        CompressingCodec(bits=2, rounding="up")


def test_codec_auto_takes_the_means_at_1_bit_unless_zeros_sit_at_row_ends() -> None:
    """rounding = "auto" at 1 bit: a dense tensor at its rows' side means; one holding
    exact zeros at its rows' minimum (a ReLU's output) stochastically between its rows'
    ends, so those zeros come back exactly zero, which the side means would move."""
    torch.manual_seed(3)
    dense = torch.randn(300, 64, requires_grad=True)
    relu = torch.relu(torch.randn(300, 64)).requires_grad_(True)
    codec = _codec(bits=1, rounding="auto")
    stored_dense, stored_relu = codec.encode(dense), codec.encode(relu)
    assert codec.stats["side_means"] == 1
    means = _codec(bits=1, rounding="means").encode(dense)
    assert torch.equal(stored_dense.packed, means.packed)
    back = codec.decode(stored_relu)
    zeros = relu.detach() == 0
    assert bool((back[zeros] == 0).all())
    moved = _codec(bits=1, rounding="means")
    assert bool((moved.decode(moved.encode(relu))[zeros] != 0).any())
    assert _codec(bits=2, rounding="auto").encode(dense).bits == 2


def test_codec_auto_takes_the_means_for_zeros_inside_their_rows_range() -> None:
    """Dropout's output of signed features holds zeros strictly between its rows' ends,
    which stochastic rounding would move as well: "auto" takes the side means there (the
    smaller error); a row whose zero is its maximum keeps it under stochastic rounding."""
    torch.manual_seed(4)
    signed = torch.randn(300, 64)
    dropped = (signed * (torch.rand(300, 64) < 0.5)).requires_grad_(True)
    codec = _codec(bits=1, rounding="auto")
    assert torch.equal(
        codec.encode(dropped).packed, _codec(bits=1, rounding="means").encode(dropped).packed
    )
    assert codec.stats["side_means"] == 1
    negative = (-torch.relu(torch.randn(300, 64))).requires_grad_(True)
    back = codec.decode(codec.encode(negative))
    assert codec.stats["side_means"] == 1
    zeros = negative.detach() == 0
    assert bool(zeros.any()) and bool((back[zeros] == 0).all())
    # one row with a zero inside its range is enough: stochastic rounding would move it
    mixed = torch.relu(torch.randn(300, 64))
    mixed[7] = torch.randn(64)
    mixed[7, 3] = 0.0
    codec.encode(mixed.requires_grad_(True))
    assert codec.stats["side_means"] == 2


@pytest.mark.parametrize("bits", [1, 2])
def test_exact_run_reports_its_rounding_and_how_many_tensors_took_the_means(
    tmp_path: Path, bits: int
) -> None:
    summary = _run(_recipe(tmp_path, '["exact"]', f"bits = {bits}"))
    assert summary["status"] == "completed"
    report = summary["plugin_reports"]["exact"]
    assert report["rounding"] == "auto"
    taken = report["saved_tensors"]["side_means"]
    assert (taken > 0) if bits == 1 else (taken == 0)
    assert taken < report["saved_tensors"]["quantized"]  # ReLU's outputs hold zeros
    assert summary["kernels"]["compress"]


def test_codec_rows_narrower_than_min_row_are_blocked_and_never_projected() -> None:
    codec = _codec(bits=2, rp_ratio=4)
    att = torch.rand(500, 4, 1, requires_grad=True)  # GAT's per-edge attention: 4 per row
    stored = codec.encode(att)
    assert isinstance(stored, CompressedTensor)
    assert stored.blocked and stored.projection is None and stored.width == BLOCK


def test_codec_projection_is_unbiased_and_regenerated_from_the_seed() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)  # an activation: only those are projected
    mean = torch.zeros_like(x)
    for seed in range(300):
        codec = _codec(bits=8, rp_ratio=4, seed=seed)
        stored = codec.encode(x)
        assert isinstance(stored, CompressedTensor) and stored.projection == (32, 8, 0)
        assert stored.width == 8
        mean += codec.decode(stored)
    mean /= 300
    assert (mean - x).abs().mean() < 0.15 * x.abs().mean()
    # decode twice: the same matrix comes back, so the same values
    assert torch.equal(codec.decode(stored), codec.decode(stored))


def test_codec_masks_are_one_bit_and_exact() -> None:
    codec = _codec(bits=2)
    m = torch.rand(333, 7) > 0.5
    stored = codec.encode(m)
    assert isinstance(stored, CompressedMask)
    assert codec.nbytes(stored) == (m.numel() + 7) // 8
    assert torch.equal(codec.decode(stored), m)


def test_codec_keeps_integer_and_small_tensors() -> None:
    codec = _codec(bits=2)
    assert codec.encode(torch.zeros(1000, 8, dtype=torch.int8)) is None
    assert codec.encode(torch.randn(10)) is None
    assert codec.stats["kept"] == 2


def test_codec_zero_and_constant_rows_come_back_exactly_when_representable() -> None:
    codec = _codec(bits=2)
    x = torch.zeros(40, 16)
    x[1] = 3.0  # bfloat16-representable constant: zero point 3, range 0
    x[2] = -0.5
    assert torch.equal(codec.decode(codec.encode(x)), x)


def test_codec_reuses_a_tensor_saved_twice_but_not_after_an_in_place_change() -> None:
    codec = _codec(bits=2)
    x = torch.randn(100, 16)
    a = codec.encode(x)
    assert codec.encode(x) is a
    x.add_(1.0)
    assert codec.encode(x) is not a


def test_codec_does_not_project_batchnorm_inputs() -> None:
    codec = _codec(bits=2, rp_ratio=4)
    x = torch.randn(100, 32)
    codec.skip_projection(x)
    stored = codec.encode(x)
    assert isinstance(stored, CompressedTensor) and stored.projection is None


# ------------------------------------------------------------------ meter


class _TwoLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32, bias=False)
        self.b = torch.nn.Linear(32, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(x)))


def test_meter_counts_each_saved_storage_once_and_not_inputs_or_parameters() -> None:
    torch.manual_seed(0)
    model = _TwoLayer()
    x = torch.randn(200, 16)
    meter = ActivationMeter(model.parameters(), torch.device("cpu"))
    with meter.step([x]):
        model(x).sum().backward()
    # relu saves its output, b's matmul saves the same tensor: one [200, 32] float32 storage
    assert meter.activation_bytes == 200 * 32 * 4
    assert meter._current == 0 and not meter._live  # everything released after backward
    assert meter.peak_memory_bytes > 0


def test_meter_counts_an_uncounted_input_when_not_declared() -> None:
    model = _TwoLayer()
    x = torch.randn(200, 16)
    meter = ActivationMeter(model.parameters(), torch.device("cpu"))
    with meter.step([]):
        model(x).sum().backward()
    assert meter.activation_bytes == 200 * 32 * 4 + 200 * 16 * 4


class _SavesItsCopy(torch.autograd.Function):
    """x @ w, saving a noted copy of x (as tango saves its int8 features) instead of x."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, copy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(copy)
        return x @ w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:  # type: ignore[override]
        (copy,) = ctx.saved_tensors
        return None, None, copy.t() @ grad


def test_meter_counts_a_noted_copy_of_an_input_apart_and_of_an_activation_as_usual() -> None:
    w = torch.randn(16, 4, requires_grad=True)
    x = torch.randn(200, 16)
    meter = ActivationMeter([w], torch.device("cpu"))
    copy_of_input = x.clone()
    note_copy(copy_of_input, x)
    with meter.step([x]):
        _SavesItsCopy.apply(x, copy_of_input, w).sum().backward()
    assert meter.activation_bytes == 0 and meter.input_copy_bytes == 200 * 16 * 4
    assert meter.summary()["input_copy_bytes"] == 200 * 16 * 4

    hidden = x * 2.0  # not a step input: its copy is an activation
    copy_of_hidden = hidden.clone()
    note_copy(copy_of_hidden, hidden)
    meter = ActivationMeter([w], torch.device("cpu"))
    with meter.step([x]):
        _SavesItsCopy.apply(hidden, copy_of_hidden, w).sum().backward()
    assert meter.activation_bytes == 200 * 16 * 4 and meter.input_copy_bytes == 0

    key = storage_key(copy_of_input)
    assert copied_from(key) == storage_key(x)
    del copy_of_input
    assert copied_from(key) is None  # the record died with the copy


def test_meter_with_codec_counts_the_compressed_bytes_and_grads_stay_close() -> None:
    torch.manual_seed(0)
    model = _TwoLayer()
    x = torch.randn(400, 16)
    model(x).square().sum().backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    codec = CompressingCodec(bits=8, backend="reference")
    meter = ActivationMeter(model.parameters(), torch.device("cpu"))
    with installed_codec(codec), meter.step([x]):
        model(x).square().sum().backward()
    got = [p.grad for p in model.parameters()]
    for a, b in zip(got, ref, strict=True):
        assert F.cosine_similarity(a.reshape(-1), b.reshape(-1), dim=0) > 0.999
    # relu's output: 8-bit rows of 32 values, 32 bytes + 4 bytes of row parameters (against
    # 128); square's input [400, 4] is narrower than MIN_ROW: 25 blocks of 64 values
    assert meter.activation_bytes == 400 * (32 + 4) + 1600 // BLOCK * (BLOCK + 4)


def test_only_one_codec_at_a_time() -> None:
    from qtrain.errors import PluginError

    with (
        installed_codec(CompressingCodec(bits=2)),
        pytest.raises(PluginError, match="only one"),
        installed_codec(CompressingCodec(bits=2)),
    ):
        pass


# ------------------------------------------------------------------ runs


def _recipe(
    tmp_path: Path, plugins: str, extra: str = "", model: str = "gcn", mode: str = "full"
) -> Path:
    fanouts = "fanouts = [5, 5]\nbatch_size = 512" if mode == "minibatch" else ""
    path = tmp_path / "r.toml"
    path.write_text(
        f"""
[model]
name = "{model}"
hidden = 32
[dataset]
name = "synthetic-small"
[train]
epochs = 2
mode = "{mode}"
{fanouts}
[output]
dir = "{tmp_path / "runs"}"
[quant]
plugin = {plugins}
[quant.exact]
{extra}
"""
    )
    return path


def _run(path: Path) -> dict[str, Any]:
    from qtrain.recipe import load_recipe
    from qtrain.runner import execute
    from qtrain.train.progress import Reporter

    return execute(load_recipe(path, []), reporter=Reporter())


@pytest.mark.parametrize(
    ("model", "mode"),
    [("gcn", "full"), ("gat", "full"), ("sage", "full"), ("gcnii", "full"), ("sage", "minibatch")],
)
def test_exact_shrinks_activation_memory(tmp_path: Path, model: str, mode: str) -> None:
    fp32 = _run(_recipe(tmp_path, "[]", model=model, mode=mode))
    int2 = _run(_recipe(tmp_path, '["exact"]', model=model, mode=mode))
    rp = _run(_recipe(tmp_path, '["exact"]', "rp_ratio = 8", model=model, mode=mode))
    for s in (fp32, int2, rp):
        assert s["status"] == "completed" and s["activation_bytes"] > 0
        assert s["peak_memory_bytes"] > 0
    assert int2["activation_bytes"] * 4 < fp32["activation_bytes"]
    assert rp["activation_bytes"] <= int2["activation_bytes"]
    report = int2["plugin_reports"]["exact"]
    assert report["saved_tensors"]["quantized"] > 0 and report["compression_ratio"] > 8


def test_exact_composes_with_tango(tmp_path: Path) -> None:
    both = _run(_recipe(tmp_path, '["tango", "exact"]'))
    assert both["status"] == "completed"
    report = both["plugin_reports"]["exact"]
    assert report["saved_tensors"]["kept"] > 0  # tango's int8 operands, kept as they are
    assert both["kernels"]["gemm"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("bits = 3", "quant.exact.bits"),
        ("rp_ratio = 3", "rp_ratio"),
        ('rounding = "up"', "rounding"),
        ('bits = 2\nrounding = "means"', 'rounding = "means" stores two levels a row'),
    ],
)
def test_bad_exact_options_are_one_line_errors(tmp_path: Path, extra: str, message: str) -> None:
    from qtrain.errors import RecipeError
    from qtrain.recipe import load_recipe

    with pytest.raises(RecipeError, match=message):
        load_recipe(_recipe(tmp_path, '["exact"]', extra), [])


def test_exact_compresses_a_users_own_loop_under_qtrain_patch() -> None:
    """Without the trainer's meter the plugin's own hooks compress; parameters stay as they are."""
    import qtrain

    torch.manual_seed(0)
    model = _TwoLayer()
    x = torch.randn(400, 16)
    saved: list[Any] = []
    with qtrain.patch({"plugin": ["exact"], "exact": {"bits": 8}}) as session:
        model(x).square().sum().backward()
        codec = session.plugins[0].codec
        # the plugin's hooks sit outside any meter: a nested pair replaces them
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            model(x).sum()
    report = session.report()["exact"]
    assert report["saved_tensors"]["quantized"] >= 2  # relu's output, square's input
    assert report["masked_calls"] == {"relu": 2}  # both forwards
    assert codec.stored_bytes < codec.original_bytes / 3
    assert all(p.grad is not None for p in model.parameters())
    assert saved  # the inner pair saw the second forward's tensors
    # afterwards, nothing is compressed any more
    before = codec.stats["quantized"]
    model(x).square().sum().backward()
    assert codec.stats["quantized"] == before


def test_batchnorm_inputs_are_quantized_but_not_projected() -> None:
    import qtrain

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    x = torch.randn(300, 16)
    with qtrain.patch({"plugin": ["exact"], "exact": {"bits": 8, "rp_ratio": 4}}) as session:
        codec = session.plugins[0].codec
        stored: list[Any] = []
        encode = codec.encode
        codec.encode = lambda t: stored.append((t.shape, encode(t))) or stored[-1][1]
        model(x).square().sum().backward()
    # each stored form once (the projected product and its saved input share one)
    unique = {id(f): (tuple(s), f) for s, f in stored if isinstance(f, CompressedTensor)}
    forms = list(unique.values())
    shapes = [s for s, _ in forms]
    assert shapes == [(300, 16), (300, 32), (300, 32), (300, 4)]  # in the order forward saves
    # x needs no grad (data, often sparse): quantized, never projected
    assert forms[0][1].projection is None
    # the first linear's output feeds BatchNorm: quantized at full width
    assert forms[1][1].projection is None and forms[1][1].width == 32
    # the ReLU output the second linear saves is projected again
    assert forms[2][1].projection is not None and forms[2][1].width == 8
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_codec_keeps_narrow_graph_constants_that_backward_may_divide_by() -> None:
    codec = _codec(bits=2)
    degrees = torch.randint(1, 500, (5000, 1)).float()  # DGL's mean reducer saves them
    kept = codec.encode(degrees)
    assert isinstance(kept, SharedConstant) and kept.tensor is degrees
    scores = torch.rand(5000, 1, requires_grad=True) * 1  # an activation: compressed
    assert isinstance(codec.encode(scores), CompressedTensor)


def test_codec_pads_the_last_block_without_widening_its_range() -> None:
    codec = _codec(bits=2, rounding="nearest")
    x = torch.full((300, 2), 7.0, requires_grad=True) * 1  # 600 values: the last block is short
    stored = codec.encode(x)
    assert isinstance(stored, CompressedTensor) and stored.blocked
    assert torch.equal(codec.decode(stored), x.detach())  # range 0 everywhere: exact


def test_exact_sage_mean_trains_with_finite_gradients(tmp_path: Path) -> None:
    summary = _run(_recipe(tmp_path, '["exact"]', model="sage"))
    assert summary["status"] == "completed"
    lines = Path(summary["run_dir"], "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in lines]
    assert len(losses) == 2
    assert all(math.isfinite(v) for v in losses)


@pytest.mark.parametrize(
    ("width", "bits", "projected"),
    [(16, 2, None), (64, 2, (64, 16, 0)), (256, 2, (256, 32, 0)), (16, 8, (16, 4, 0))],
)
def test_codec_projects_to_no_fewer_than_32_over_bits_columns(
    width: int, bits: int, projected: tuple[int, int, int] | None
) -> None:
    codec = _codec(bits=bits, rp_ratio=8)
    stored = codec.encode(torch.randn(300, width, requires_grad=True) * 1)
    assert isinstance(stored, CompressedTensor) and stored.projection == projected


def test_losses_and_softmaxes_keep_what_they_save_in_fp32() -> None:
    """log_softmax's backward takes exp() of its saved output: quantizing it breaks the gradient."""
    import qtrain

    torch.manual_seed(0)
    logits = (torch.randn(500, 40) * 20).requires_grad_(True)
    labels = torch.randint(0, 40, (500,))
    F.cross_entropy(logits * 1, labels).backward()
    want = logits.grad.clone()
    logits.grad = None
    with qtrain.patch({"plugin": ["exact"], "exact": {"bits": 2, "rp_ratio": 8}}) as session:
        F.cross_entropy(logits * 1, labels).backward()
    assert torch.allclose(logits.grad, want)
    report = session.report()["exact"]
    assert report["fp32_calls"] == {"cross_entropy": 1} and report["masked_calls"] == {}
    assert report["saved_tensors"]["quantized"] == 0


def test_equal_graph_constants_in_a_step_share_one_storage() -> None:
    torch.manual_seed(0)
    degrees = torch.randint(1, 50, (3000, 1)).float()
    codec = _codec(bits=2)
    first = codec.encode(degrees.pow(-0.5))
    again = codec.encode(degrees.pow(-0.5))  # a new tensor with the same values
    other = codec.encode(degrees.pow(-1.0))
    assert first is again and other is not first
    assert torch.equal(codec.decode(again), degrees.pow(-0.5))
    assert codec.stats["constants"] == 2 and codec.stats["shared"] == 1
    meter = ActivationMeter([], torch.device("cpu"))
    with installed_codec(_codec(bits=2)), meter.step():
        y = degrees.pow(-0.5) * torch.ones(3000, 1, requires_grad=True)
        z = degrees.pow(-0.5) * y
        z.sum().backward()
    assert meter.activation_bytes == 3000 * 4  # one stored norm, not two


def test_keyed_dropout_with_a_seed_past_2_63_runs_under_a_profiler_recording_shapes() -> None:
    """torch.profiler(record_shapes=True) records an autograd function's arguments; an int
    of 2^63 or more made it raise inside a user's profiled step."""
    x = torch.rand(50, 8, requires_grad=True)
    ids = torch.arange(50)
    seed = 2**63 + 5
    with masks.packed_dropout_masks(lambda: None):
        plain = masks.keyed_dropout(x, ids, 0.5, seed)
        with torch.profiler.profile(record_shapes=True):
            profiled = masks.keyed_dropout(x, ids, 0.5, seed)
            profiled.sum().backward()
    assert torch.equal(plain, profiled)
