"""Where tango's int8 primitives start to pay on this machine: the evidence for
``plugins/tango/payoff.py``'s thresholds.

Each case runs one primitive's forward and backward through DGL's own call (``dgl.ops``
or a matmul) inside one tango session, as a run does, twice: with every primitive kept
in float32 (DGL's kernel behind tango's dispatch: what the rule falls back to) and with
every primitive quantized, the two taking turns one call each per round
(``bench/_timing.py``). Entering a session around each call instead would time the
first call after a session starts (about half a millisecond more on these sizes), which
a run pays once. Printed per case: both medians, the ratio FP32 / tango with the
quartiles of the per-round ratios, and what tango's rule decides for it by default
(``int8`` or ``fp32``). A rule is right where ``fp32`` falls on ratios below 1 and
``int8`` on ratios above.

    python bench/crossover.py --threads 2 --json bench/results/crossover.json
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401  (qtrain from this checkout)
import torch
from _record import write_json
from _timing import interleaved

import qtrain
from qtrain._compat import import_dgl

# graphs of Cora's size (2,708 nodes, ~4 edges a node) and ten times it
GRAPHS = ((2708, 4), (20000, 10))


@dataclass(frozen=True)
class Case:
    name: str
    step: Callable[[], object]  # forward and backward of one primitive
    decision: str | None  # payoff's reason to keep it in float32, None: int8


def _graph(nodes: int, degree: int) -> Any:
    dgl = import_dgl()
    src = torch.randint(0, nodes, (nodes * degree,))
    dst = torch.randint(0, nodes, (nodes * degree,))
    return dgl.graph((src, dst), num_nodes=nodes)


def cases() -> Iterator[Case]:
    """The primitives of GCN, SAGE and GAT at widths around the thresholds."""
    from qtrain.plugins.tango import payoff

    dgl = import_dgl()
    for nodes, degree in GRAPHS:
        g = _graph(nodes, degree)
        edges = g.num_edges()
        tag = f"n={nodes} E={edges}"
        for d in (7, 16, 24, 32, 48, 64, 128):
            x = torch.randn(nodes, d, requires_grad=True)
            gy = torch.randn(nodes, d)
            yield Case(
                f"spmm copy_u {tag} width={d}",
                lambda g=g, x=x, gy=gy: dgl.ops.copy_u_sum(g, x).backward(gy),
                payoff.spmm("copy", x, edges),
            )
        for h, d in ((1, 2), (1, 4), (8, 8), (1, 64)):
            x = torch.randn(nodes, h, d, requires_grad=True)
            w = torch.rand(edges, h, 1, requires_grad=True)
            gy = torch.randn(nodes, h, d)
            yield Case(
                f"spmm u_mul_e {tag} heads={h} width={d}",
                lambda g=g, x=x, w=w, gy=gy: dgl.ops.u_mul_e_sum(g, x, w).backward(gy),
                payoff.spmm("mul", x, edges),
            )
        for op, h, d in (
            ("add", 1, 1),
            ("add", 8, 1),
            ("add", 1, 32),
            ("dot", 1, 2),
            ("dot", 1, 4),
            ("dot", 8, 8),
        ):
            a = torch.randn(nodes, h, d, requires_grad=True)
            b = torch.randn(nodes, h, d, requires_grad=True)
            ge = torch.randn(edges, h, 1) if op == "dot" else torch.randn(edges, h, d)
            fn = dgl.ops.u_dot_v if op == "dot" else dgl.ops.u_add_v
            yield Case(
                f"sddmm {op} {tag} heads={h} width={d}",
                lambda g=g, a=a, b=b, ge=ge, fn=fn: fn(g, a, b).backward(ge),
                payoff.sddmm(op, a, edges),
            )
    for m, k, n in (
        (2708, 16, 7),
        (2708, 32, 32),
        (3000, 32, 64),
        (2708, 48, 48),
        (5000, 32, 64),
        (2708, 64, 64),
        (2708, 1433, 16),
        (20000, 128, 128),
    ):
        x = torch.randn(m, k, requires_grad=True)
        w = torch.randn(k, n, requires_grad=True)
        gy = torch.randn(m, n)
        yield Case(
            f"gemm {m}x{k}x{n}",
            lambda x=x, w=w, gy=gy: (x @ w).backward(gy),
            payoff.gemm(x, w, linear=False),
        )


def run(repeat: int, warmup: int) -> list[dict[str, Any]]:
    from qtrain.plugins.tango import payoff

    measured = payoff.MEASURED
    everything = 1 << 62
    all_fp32 = payoff.Thresholds(everything, everything, 0, everything, everything)

    @contextlib.contextmanager
    def around(name: str) -> Iterator[None]:
        payoff.MEASURED = {"cpu": all_fp32} if name == "fp32" else {}
        try:
            yield
        finally:
            payoff.MEASURED = measured

    torch.manual_seed(0)
    all_cases = list(cases())  # each decided under the measured thresholds
    with qtrain.patch("tango"):
        return [_row(case, interleaved_pair(case, repeat, warmup, around)) for case in all_cases]


def interleaved_pair(case: Case, repeat: int, warmup: int, around: Any) -> dict[str, Any]:
    """The case's call timed kept in float32 and quantized, in turns."""
    return interleaved({"fp32": case.step, "tango": case.step}, repeat, warmup, around=around)


def _row(case: Case, t: dict[str, Any]) -> dict[str, Any]:
    ratios = torch.tensor(
        [a / b for a, b in zip(t["fp32"].times_s, t["tango"].times_s, strict=True)]
    ).double()
    q1, q3 = (float(q) for q in torch.quantile(ratios, torch.tensor([0.25, 0.75]).double()))
    row = {
        "case": case.name,
        "fp32_ms": t["fp32"].median_s * 1e3,
        "tango_ms": t["tango"].median_s * 1e3,
        "speedup": t["fp32"].median_s / t["tango"].median_s,
        "speedup_iqr": [q1, q3],
        "default": "fp32" if case.decision else "int8",
        "why": case.decision,
    }
    print(
        f"{case.name:48s} fp32 {row['fp32_ms']:8.3f} ms  tango {row['tango_ms']:8.3f} ms  "
        f"{row['speedup']:5.2f}x ({q1:.2f}-{q3:.2f})  default: {row['default']}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--repeat", type=int, default=20, help="timed rounds per case")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds per case")
    parser.add_argument("--json", type=Path, default=None, help="where to write the rows")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args.repeat, args.warmup)
    wrong = [r for r in rows if (r["default"] == "fp32") != (r["speedup"] < 1.0)]
    print(f"{len(rows) - len(wrong)} of {len(rows)} cases decided as measured")
    for r in wrong:
        print(f"  decided {r['default']} at {r['speedup']:.2f}x: {r['case']}")
    write_json(
        args.json,
        {
            "command": " ".join(["python", *sys.argv]),
            "threads": torch.get_num_threads(),
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
