"""Inputs the row-quantizer tests share (quantize_symmetric_rows, quantize_symmetric_rows4):
rows of mixed magnitudes and the special rows every row quantizer must get right."""

from __future__ import annotations

import torch
from support import gen


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
