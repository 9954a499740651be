"""What the accuracy tests check of a run besides its accuracy: that the plugin really did
what the bar is about (a plugin that silently stayed float32 would pass any bar), and how
``bits = "auto"`` chose. Shared by the slow accuracy tests and the hours-long bars of
issue 32 (test_lowbit_bars.py)."""

from __future__ import annotations

from typing import Any

Summary = dict[str, Any]

# the primitives a low-bit tango step runs quantized: the dense products (the weight
# gradient by node blocks), the SpMM, and the row and column quantizers
LOW_BIT_PRIMITIVES = ("gemm", "block_gemm", "spmm", "quantize_rows", "quantize_cols")


def assert_tango_low_bits_ran(example: str, summary: Summary, bits: int) -> None:
    """tango ran at ``bits`` with its defaults: blocks, float32 evaluation, the features and
    weights at 8 bits, the operands packed, and every low-bit primitive quantized."""
    report = summary["plugin_reports"]["tango"]
    assert report["bits"] == bits and report["scales"] == "block", report
    # the trained float32 weights are what is evaluated (the default)
    assert report["evaluation"] == "fp32", report
    # the features and weights at 8 bits (the defaults), the rest at bits
    assert (report["input_bits"], report["weight_bits"]) == (8, 8), report
    assert report["step_inputs_quantized"] > 0 and report["weights_quantized"] > 0, report
    # at 4 bits or fewer the operands stored packed, two 4-bit values a byte (the default;
    # rows and columns are quantized straight into nibbles)
    if bits <= 4:
        assert report["packed"] and report["operands_packed"] > 0, report
    kernels = summary["kernels"]
    for primitive in LOW_BIT_PRIMITIVES:
        quantized = {b for b, n in kernels.get(primitive, {}).items() if n and b != "fp32"}
        assert quantized, f"{example}: no quantized {primitive} ran ({kernels})"


def assert_auto_chose_by_gradient(example: str, summary: Summary) -> int:
    """The count ``"auto"`` chose is the smallest whose step gradient error met the target
    (8 where none did); returns it."""
    report = summary["plugin_reports"]["tango"]
    calibration = report["calibration"]
    errors = {int(b): e for b, e in calibration["gradient_error"].items()}
    assert calibration["criterion"] == "gradient"
    assert report["bits"] == calibration["bits"]
    met = [
        b for b in sorted(errors) if errors[b] is not None and errors[b] <= calibration["target"]
    ]
    assert report["bits"] == (met[0] if met else 8), (example, errors)
    return int(report["bits"])


def assert_activations_compressed(example: str, name: str, plain: Summary, packed: Summary) -> None:
    """exact compressed what autograd saved: less than a quarter of the FP32 run's bytes
    (32 / 2 bits at INT2, less the tensors kept as they are), through its codec."""
    assert packed["activation_bytes"] < plain["activation_bytes"] / 4, (
        f"{example} {name}: activations {packed['activation_bytes']} bytes against "
        f"FP32's {plain['activation_bytes']}"
    )
    assert sum(packed["kernels"].get("compress", {}).values()) > 0
