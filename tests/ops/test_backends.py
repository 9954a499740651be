"""Backend discovery, dispatch and the kernel counter: nothing falls back silently."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from qtrain.errors import QtrainError
from qtrain.ops import backends, dispatch, fakes
from qtrain.ops.quantize import QUANTIZE_KERNELS, dequantize, quantize
from qtrain.quant import quantize_symmetric

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.fixture(autouse=True)
def fresh_counter() -> Iterator[None]:
    dispatch.reset()
    yield
    dispatch.reset()


@pytest.fixture
def missing_ext(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make the CPU extension look unbuilt for the duration of a test."""
    monkeypatch.setattr(backends, "MODULE", "qtrain._ext_missing_for_test")
    backends.refresh()
    yield
    backends.refresh()


@pytest.fixture
def broken_ext(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Make the CPU extension look built but broken (as after a torch upgrade)."""
    (tmp_path / "qtrain_broken_ext_for_test.py").write_text(
        textwrap.dedent("""
        raise ImportError("undefined symbol: _ZN3c1017RegisterOperators")
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(backends, "MODULE", "qtrain_broken_ext_for_test")
    backends.refresh()
    yield
    backends.refresh()
    sys.modules.pop("qtrain_broken_ext_for_test", None)


def _need_ext() -> None:
    # a missing build fails: CI builds the extension, and these tests are its proof
    assert backends.available("ext-cpu"), f"qtrain._ext not built: {backends.error('ext-cpu')}"


# ------------------------------------------------------------------ status


def test_status_shape() -> None:
    st = backends.status()
    assert set(st) == {"ext-cpu", "ext-cuda"}
    for entry in st.values():
        assert isinstance(entry["built"], bool)
        assert entry["built"] == (entry["error"] is None)
    assert st["ext-cpu"]["built"], st["ext-cpu"]["error"]  # CI builds it
    cpu = st["ext-cpu"]
    assert cpu["path"].endswith(".so") or cpu["path"].endswith(".pyd")
    assert cpu["isa"] in ("avx512vnni", "avx512f", "avx2", "default")
    assert cpu["isa"] in cpu["isa_supported"]
    assert cpu["threads"] >= 1 and cpu["compiler"]


def test_status_cuda() -> None:
    cuda = backends.status()["ext-cuda"]
    if not torch.version.cuda:
        assert cuda["built"] is False and "has no CUDA" in cuda["error"]
        with pytest.raises(QtrainError, match="has no CUDA"):
            backends.ext_cuda()
    elif not backends.ext_cpu().info()["cuda_kernels"]:  # QTRAIN_BUILD_CUDA=0, or no nvcc
        assert cuda["built"] is False and "without CUDA kernels" in cuda["error"]
    else:  # one library: the CUDA kernels sit beside the CPU ones
        assert cuda["built"] is True, cuda["error"]
        assert cuda["archs_compiled"] and cuda["path"] == backends.status()["ext-cpu"]["path"]


def test_the_library_defines_every_op_with_its_front_kernels_and_fake() -> None:
    _need_ext()
    assert backends.library_problems() == []
    kernels = backends.op_kernels()
    assert set(kernels) == set(fakes.FAKES) and len(kernels) == 36  # every op of the library
    want = {"front", "cpu", "fake", *(["cuda"] if backends.available("ext-cuda") else [])}
    assert all(set(parts) == want for parts in kernels.values()), kernels


def test_a_missing_kernel_is_a_library_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    _need_ext()
    kernels = backends.op_kernels()
    kernels["qspmm"] = [part for part in kernels["qspmm"] if part != "cpu"]
    monkeypatch.setattr(backends, "op_kernels", lambda: kernels)
    assert backends.library_problems() == ["op qspmm has no cpu"]


def test_missing_extension_is_reported(missing_ext: None) -> None:
    st = backends.status()["ext-cpu"]
    assert st["built"] is False and "not built" in st["error"]
    assert backends.available("ext-cpu") is False
    with pytest.raises(QtrainError, match="make build"):
        backends.ext_cpu()


def test_broken_extension_reports_the_import_error(broken_ext: None) -> None:
    st = backends.status()["ext-cpu"]
    assert st["built"] is False
    assert "undefined symbol: _ZN3c1017RegisterOperators" in st["error"]
    with pytest.raises(QtrainError, match="undefined symbol"):
        backends.ext_cpu()


# ------------------------------------------------------------------ dispatch


@pytest.mark.parametrize("device", DEVICES)
def test_auto_uses_the_devices_kernel_and_counts(device: str) -> None:
    _need_ext()
    x = torch.randn(100)
    for _ in range(3):
        q, scale = quantize(x.to(device), 4, "stochastic", seed=2, offset=5)
    backend = "ext-cuda" if device == "cuda" else "ext-cpu"
    assert dispatch.snapshot() == {"quantize": {backend: 3}}
    assert dispatch.fallbacks() == []
    want_q, want_scale = quantize_symmetric(x, 4, "stochastic", 2, 5)
    assert torch.equal(q.cpu(), want_q) and torch.equal(scale.cpu(), want_scale)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_backends_agree(rounding: str) -> None:
    _need_ext()
    x = torch.randn(5, 1001, dtype=torch.float64)[:, ::3]  # float64, non-contiguous
    a = quantize(x, 5, rounding, seed=3, offset=2**33, backend="ext-cpu")
    b = quantize(x, 5, rounding, seed=3, offset=2**33, backend="reference")
    c = quantize_symmetric(x, 5, rounding, seed=3, offset=2**33)
    assert torch.equal(a[0], b[0]) and torch.equal(a[0], c[0]) and torch.equal(a[1], b[1])
    assert dispatch.snapshot() == {"quantize": {"ext-cpu": 1, "reference": 1}}


def test_auto_falls_back_loudly(missing_ext: None) -> None:
    x = torch.randn(10)
    q, _ = quantize(x, 8)
    quantize(x, 8)
    assert torch.equal(q, quantize_symmetric(x, 8)[0])
    assert dispatch.snapshot() == {"quantize": {"reference": 2}}
    reasons = dispatch.fallbacks()
    assert len(reasons) == 1  # one distinct reason, counted twice
    assert "quantize" in reasons[0] and "ext-cpu unavailable" in reasons[0]
    assert "not built" in reasons[0]
    assert dispatch.COUNTER.fallback_counts()[reasons[0]] == 2
    with pytest.raises(QtrainError, match="make build"):
        quantize(x, 8, backend="ext-cpu")


def test_no_kernel_for_device_is_recorded() -> None:
    x = torch.empty(4, device="meta")
    assert dispatch.resolve("quantize", x, "auto", kernels=("ext-cpu",)) == "reference"
    assert "no compiled kernel for meta tensors" in dispatch.fallbacks()[0]
    # a primitive with only a reference implementation is not a fallback
    dispatch.reset()
    assert dispatch.resolve("dequantize", x, "auto", kernels=()) == "reference"
    assert dispatch.fallbacks() == []


def test_bad_arguments() -> None:
    x = torch.randn(8)
    with pytest.raises(ValueError, match="'auto', 'reference', 'ext-cpu'"):
        quantize(x, 8, backend="gpu")
    with pytest.raises(ValueError, match=r"2\.\.8"):
        quantize(x, 1)
    with pytest.raises(ValueError, match="rounding"):
        quantize(x, 8, rounding="floor")
    with pytest.raises(ValueError, match="cannot run on a cpu tensor"):
        quantize(x, 8, backend="ext-cuda")
    with pytest.raises(ValueError, match="no 'ext-cpu' kernel"):
        dequantize(torch.zeros(3, dtype=torch.int8), 1.0, backend="ext-cpu")
    with pytest.raises(ValueError, match="offset"):
        quantize(x, 8, offset=-1, backend="reference")
    with pytest.raises(TypeError, match="seed"):
        quantize(x, 8, seed=1.5, backend="reference")  # type: ignore[arg-type]
    assert dispatch.snapshot() == {}


def test_dequantize_round_trip() -> None:
    x = torch.randn(50)
    q, s = quantize(x, 8, backend="reference")
    y = dequantize(q, s)
    assert y.dtype == torch.float32 and (y - x).abs().max() <= float(s) / 2 * (1 + 1e-5)
    assert dispatch.snapshot()["dequantize"] == {"reference": 1}


def test_counter_snapshot_is_a_copy() -> None:
    c = dispatch.KernelCounter()
    c.record("spmm", "ext-cpu")
    snap = c.snapshot()
    snap["spmm"]["ext-cpu"] = 99
    assert c.snapshot() == {"spmm": {"ext-cpu": 1}}
    c.record_fallback("why")
    c.reset()
    assert c.snapshot() == {} and c.fallbacks == []


def test_calls_set_aside_are_not_counted_even_when_they_raise() -> None:
    c = dispatch.KernelCounter()
    c.record("gemm", "ext-cpu", 2)
    with c.set_aside():
        c.record("gemm", "ext-cpu", 5)
        c.record("spmm", "reference")
        c.record_fallback("no extension")
        assert c.snapshot() == {"gemm": {"ext-cpu": 7}, "spmm": {"reference": 1}}
    assert c.snapshot() == {"gemm": {"ext-cpu": 2}} and c.fallbacks == []
    with pytest.raises(RuntimeError, match="trial"), c.set_aside():
        c.record("gemm", "ext-cpu")
        raise RuntimeError("trial step failed")
    c.record("gemm", "ext-cpu")
    assert c.snapshot() == {"gemm": {"ext-cpu": 3}}


def test_ops_package_exports() -> None:
    import qtrain.ops as ops

    assert QUANTIZE_KERNELS == ("ext-cpu", "ext-cuda")
    # the package attribute is the function (it shadows the submodule of the same name)
    assert ops.quantize is quantize and ops.dequantize is dequantize
    assert ops.COUNTER is dispatch.COUNTER and ops.BACKENDS == dispatch.BACKENDS


def test_the_profiler_names_the_front_and_the_op() -> None:
    _need_ext()
    with torch.profiler.profile() as prof:
        quantize(torch.randn(1000), 4)
    names = {event.name for event in prof.events()}
    assert {"qtrain::quantize[ext-cpu]", "qtrain::quantize_symmetric"} <= names
