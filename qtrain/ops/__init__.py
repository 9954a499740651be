"""Quantized primitives with backend dispatch; the math lives in ``qtrain.quant``.

``qtrain.ops.quantize`` is the function (it shadows the submodule of the same
name, as ``from qtrain.ops import quantize`` reads best); reach the module with
``from qtrain.ops.quantize import ...`` or ``sys.modules["qtrain.ops.quantize"]``.
"""

from __future__ import annotations

from qtrain.ops.dispatch import BACKENDS, COUNTER, KernelCounter
from qtrain.ops.quantize import dequantize, quantize

__all__ = ["BACKENDS", "COUNTER", "KernelCounter", "dequantize", "quantize"]
