"""Pure-PyTorch quantization math: the reference every compiled kernel must match."""

from __future__ import annotations

from qtrain.quant.quantize import (
    ERROR_X_EPS,
    MAX_BITS,
    MIN_BITS,
    ROUNDINGS,
    check_bits,
    check_rounding,
    dequantize,
    error_x,
    qmax_for,
    quantize_symmetric,
)
from qtrain.quant.rng import counter_uniform

__all__ = [
    "ERROR_X_EPS",
    "MAX_BITS",
    "MIN_BITS",
    "ROUNDINGS",
    "check_bits",
    "check_rounding",
    "counter_uniform",
    "dequantize",
    "error_x",
    "qmax_for",
    "quantize_symmetric",
]
