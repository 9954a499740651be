"""Inputs the quantizer tests share: rows of mixed magnitudes and the special rows every row
quantizer must get right (quantize_symmetric_rows, quantize_symmetric_rows4); columns of
power-law magnitudes and the special columns every column quantizer must get right
(quantize_symmetric_cols, quantize_symmetric_cols4); the errors every 2-d quantizer
raises (quantize_symmetric_rows, quantize_symmetric_cols, and their packed twins)."""

from __future__ import annotations

import torch
from support import ErrorCase, gen


def mixed_rows(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Rows of very different magnitudes, a row of zeros, a constant row, a tiny row (the
    2^64 pre-scaling path), a subnormal row and a huge row among normal ones."""
    g = gen(seed)
    x = torch.randn(rows, cols, generator=g)
    x *= torch.logspace(-3, 3, rows)[:, None]
    special = {
        0: torch.zeros(cols),
        1: torch.full((cols,), -0.731),
        2: torch.randn(cols, generator=g) * 1e-39,
        3: torch.randn(cols, generator=g) * 1e-44,
        4: (torch.rand(cols, generator=g) * 2 - 1) * 3.4e38,
        5: torch.full((cols,), 3.0e-38),
    }
    for i, row in special.items():
        if i < rows:
            x[i] = row
    return x


def row_inputs() -> dict[str, torch.Tensor]:
    g = gen(4321)
    wide = torch.randn(66, 40, generator=g)
    inputs = {f"13x{w}": mixed_rows(13, w, w) for w in (1, 3, 7, 33, 129, 1000)}
    inputs.update(
        {
            "1x1": torch.randn(1, 1, generator=g),
            "1x5000": torch.randn(1, 5000, generator=g) * 7,
            "300x17": torch.randn(300, 17, generator=g),
            "transposed": wide.t(),
            "strided": wide[::3, ::2],
            "zeros": torch.zeros(9, 33),
            "constant": torch.full((4, 129), 0.731),
            "signed zeros": torch.tensor([[-0.0, 0.0, -0.0], [0.0, -0.0, 0.0]]),
            "tiny": torch.randn(5, 77, generator=g) * 1e-39,
            "huge": (torch.rand(6, 129, generator=g) * 2 - 1) * 3.4e38,
            "ties": (torch.arange(-20, 22, dtype=torch.float32) / 2).reshape(6, 7),
            "no columns": torch.empty(5, 0),
            "no rows": torch.empty(0, 7),
            "nothing": torch.empty(0, 0),
        }
    )
    return inputs


def power_law_columns(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Rows of power-law magnitudes (hub nodes), a zero column, a constant column and a
    block of zero rows: what a weight gradient's columns look like."""
    g = gen(seed)
    x = torch.randn(rows, cols, generator=g)
    x *= (torch.rand(rows, 1, generator=g) ** -2.0).clamp(max=1e4)
    if cols > 1:
        x[:, 0] = 0.0
        x[:, 1] = -0.731
    x[rows // 3 : rows // 3 + 70] = 0.0
    return x


def column_inputs() -> dict[str, torch.Tensor]:
    g = gen(77)
    wide = torch.randn(300, 40, generator=g)
    return {
        "power law 1000x37": power_law_columns(1000, 37, 1),
        "power law 5000x3": power_law_columns(5000, 3, 2),
        "odd 131x7": torch.randn(131, 7, generator=g),
        "one row": torch.randn(1, 9, generator=g),
        "one column": torch.randn(777, 1, generator=g),
        "zeros": torch.zeros(200, 5),
        "constant": torch.full((129, 4), 0.731),
        "tiny": torch.randn(150, 3, generator=g) * 1e-39,
        "huge": (torch.rand(129, 6, generator=g) * 2 - 1) * 3.4e38,
        "transposed": wide.t(),
        "strided": wide[::3, ::2],
        "no rows": torch.empty(0, 7),
        "no columns": torch.empty(70, 0),
        "nothing": torch.empty(0, 0),
    }


def quantizer_error_cases(op: str) -> list[ErrorCase]:
    """The bad inputs every 2-d int8 quantizer op ``op`` (``"ops.NAME"``, called as
    ``op(x, bits, stochastic, seed, offset)``) must refuse with one clear error: bit counts
    outside 2..8, a dtype other than float32, a tensor that is not 2-d, counters that
    overflow, NaN or Inf, a sparse tensor. Each test adds the cases of its own layout."""
    name = op.removeprefix("ops.")
    return [
        ErrorCase("bits 9", f"{op}(torch.ones(2, 3, device=dev), 9)", "ValueError", r"2\.\.8"),
        ErrorCase("bits 1", f"{op}(torch.ones(2, 3, device=dev), 1)", "ValueError", r"2\.\.8"),
        ErrorCase(
            "float64",
            f"{op}(torch.ones(2, 3, device=dev, dtype=torch.float64), 8)",
            "TypeError",
            "x must be float32, got float64",
        ),
        ErrorCase("1-d", f"{op}(torch.ones(3, device=dev), 8)", "ValueError", "x must be 2-d"),
        ErrorCase(
            "3-d", f"{op}(torch.ones(2, 3, 4, device=dev), 8)", "ValueError", "x must be 2-d"
        ),
        ErrorCase("0-d", f"{op}(torch.ones((), device=dev), 8)", "ValueError", "x must be 2-d"),
        ErrorCase(
            "negative offset",
            f"{op}(torch.ones(2, 3, device=dev), 8, True, 0, -1)",
            "ValueError",
            "offset must be >= 0",
        ),
        ErrorCase(
            "counter overflow",
            f"{op}(torch.ones(3, 3, device=dev), 8, True, 0, 2**63 - 9)",
            "ValueError",
            "2\\^63",
        ),
        ErrorCase(
            "counter overflow, nearest",
            f"{op}(torch.ones(3, 3, device=dev), 8, False, 0, 2**63 - 5)",
            "ValueError",
            "2\\^63",
        ),
        ErrorCase(
            "NaN",
            f"{op}(torch.tensor([[1.0, 2.0], [0.0, float('nan')]], device=dev), 8)",
            "ValueError",
            f"qtrain::{name}: x contains NaN or Inf; quantization needs finite values",
        ),
        ErrorCase(
            "Inf",
            f"{op}(torch.tensor([[float('-inf')]], device=dev), 8, True)",
            "ValueError",
            "NaN or Inf",
        ),
        ErrorCase(
            "sparse",
            f"{op}(torch.eye(3, device=dev).to_sparse(), 8)",
            "ValueError",
            "dense",
        ),
    ]


def packed_quantizer_error_cases(op: str, reference: str) -> list[ErrorCase]:
    """The bad inputs a packed 2-d quantizer op ``op`` (2 to 4 bits, two values a byte) and
    its reference function ``reference`` must both refuse, then those only the raw op sees
    (the reference takes any dtype and layout). ``reference`` must be imported by the
    test's setup."""
    name = op.removeprefix("ops.")
    cases = []
    for call in (op, reference):
        tag = "raw" if call == op else "reference"
        stochastic = "True" if call == op else "'stochastic'"
        cases += [
            ErrorCase(
                f"{tag} bits 5",
                f"{call}(torch.ones(2, 3, device=dev), 5)",
                "ValueError",
                r"bits must be an integer in 2\.\.4, got 5",
            ),
            ErrorCase(
                f"{tag} bits 1",
                f"{call}(torch.ones(2, 3, device=dev), 1)",
                "ValueError",
                r"bits must be an integer in 2\.\.",
            ),
            ErrorCase(f"{tag} 1-d", f"{call}(torch.ones(3, device=dev), 4)", "ValueError", "2-d"),
            ErrorCase(
                f"{tag} NaN",
                f"{call}(torch.tensor([[1.0, 2.0], [0.0, float('nan')]], device=dev), 4)",
                "ValueError",
                "NaN",
            ),
            ErrorCase(
                f"{tag} negative offset",
                f"{call}(torch.ones(2, 3, device=dev), 4, {stochastic}, 0, -1)",
                "ValueError",
                "offset must be (>= 0|a non-negative int)",
            ),
        ]
    cases += [
        ErrorCase(
            "raw float64",
            f"{op}(torch.ones(2, 3, device=dev, dtype=torch.float64), 4)",
            "TypeError",
            "x must be float32, got float64",
        ),
        ErrorCase(
            "raw NaN message",
            f"{op}(torch.tensor([[float('inf')]], device=dev), 3, True)",
            "ValueError",
            f"{name}: x contains NaN or Inf; quantization needs finite values",
        ),
        ErrorCase(
            "raw counter overflow",
            f"{op}(torch.ones(3, 3, device=dev), 4, True, 0, 2**63 - 9)",
            "ValueError",
            "2\\^63",
        ),
        ErrorCase(
            "raw sparse", f"{op}(torch.eye(3, device=dev).to_sparse(), 4)", "ValueError", "dense"
        ),
    ]
    return cases
