"""Where qtrain's GPU route waits on the host: the issue-30 bar "no host sync inside a
training step", measured, with the Python line of every sync.

Each model (GCN, GAT, GraphSAGE: ``bench/gpu_e2e.py``'s) trains a few full-graph epochs
through qtrain's runner on the device route, once per plugin set (FP32, tango 8-bit,
exact INT2), under ``torch.cuda.set_sync_debug_mode("warn")``. Every warning that a
synchronizing CUDA call makes is caught with its Python stack and counted

* by phase: ``step`` (inside ``train_epoch``: forward, loss, backward, optimizer step, and
  the loss and accuracy read back after it; a stack that does not start in this script is
  autograd's device thread running the backward), ``eval`` (``evaluate``), ``epoch`` (the
  runner's per-epoch work around the step: the finiteness check, the best model's copy)
  and ``setup`` (before the first epoch);
* by site: the innermost three qtrain frames.

    python bench/gpu_syncs.py                       # cuda, 20,000-node synthetic-arxiv
    python bench/gpu_syncs.py --models gcn --log syncs.log

On a machine without CUDA it says so and exits 2: the debug mode exists only there.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401  (qtrain from this checkout)
import gpu_e2e
import torch
from _record import ROOT

VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "tango": {"plugin": ["tango"], "tango": {"bits": 8}},
    "exact": {"plugin": ["exact"], "exact": {"bits": 2}},
}
PHASES = ("step", "eval", "epoch", "setup")
# the runner's functions that open a phase, innermost first wins
_PHASE_OF = {"train_epoch": "step", "evaluate": "eval", "run": "epoch"}
_ENTRY = "bench/gpu_syncs.py"  # every stack of the measuring thread starts here


def phase_and_site(stack: list[traceback.FrameSummary]) -> tuple[str, str]:
    """The phase a sync happened in and its site (innermost three qtrain frames, innermost
    first), from the Python stack at the warning."""
    ours = [f for f in stack if _in_qtrain(f.filename)]
    phase = "setup"
    for frame in reversed(ours):
        if frame.name in _PHASE_OF and frame.filename.endswith("train/loop.py"):
            phase = _PHASE_OF[frame.name]
            break
    else:
        if not any(f.filename.endswith(_ENTRY) for f in stack):
            # autograd runs a CUDA graph's backward on its own device thread, whose Python
            # stack starts at the backward function: only the step's backward gets there
            phase = "step"
    site = "  <-  ".join(f"{_short(f.filename)}:{f.lineno} {f.name}" for f in reversed(ours[-3:]))
    return phase, site or "(outside qtrain)"


def _in_qtrain(filename: str) -> bool:
    return "/qtrain/" in filename and "/site-packages/torch/" not in filename


def _short(filename: str) -> str:
    path = Path(filename)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else filename


@contextmanager
def sync_sites() -> Iterator[collections.Counter[tuple[str, str]]]:
    """Count the synchronizing CUDA calls made inside, by (phase, site)."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        passthrough = warnings.showwarning

        def record(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
            if "synchroniz" in str(message):
                counts[phase_and_site(traceback.extract_stack()[:-1])] += 1
            else:
                passthrough(message, category, filename, lineno, *rest)

        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counts
        finally:
            torch.cuda.set_sync_debug_mode("default")


def measure(models: list[str], variants: list[str], nodes: int, epochs: int) -> list[dict]:
    """One row per model and variant: syncs per phase and the sites, most frequent first."""
    size = gpu_e2e.Size(
        "synthetic-arxiv",
        {"nodes": nodes},
        epochs=epochs,
        warmup=0,
        eval_every=2,
        models=gpu_e2e.SIZES["arxiv"].models,
    )
    name, _ = gpu_e2e._in_memory(size)
    rows = []
    with tempfile.TemporaryDirectory(prefix="qtrain-syncs-") as out:
        for model in models:
            for variant in variants:
                with sync_sites() as counts:
                    row = gpu_e2e._guarded(
                        gpu_e2e._qtrain_row,
                        size,
                        model,
                        name,
                        VARIANTS[variant],
                        False,
                        torch.device("cuda"),
                        out,
                    )
                per_phase = {p: sum(n for (ph, _), n in counts.items() if ph == p) for p in PHASES}
                rows.append(
                    {
                        "model": model,
                        "variant": variant,
                        "status": row.get("status"),
                        "epochs": epochs,
                        "syncs": per_phase,
                        "step_syncs_per_epoch": per_phase["step"] / epochs,
                        "sites": [
                            {"phase": ph, "site": site, "count": n}
                            for (ph, site), n in counts.most_common()
                        ],
                    }
                )
    return rows


def report(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        phases = ", ".join(f"{p} {row['syncs'][p]}" for p in PHASES)
        lines.append(
            f"== {row['model']} {row['variant']} ({row['status']}): {row['epochs']} epochs, "
            f"syncs by phase: {phases}; in the step {row['step_syncs_per_epoch']:.1f} per epoch"
        )
        lines += [f"  {s['count']:5d}  {s['phase']:5}  {s['site']}" for s in row["sites"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(gpu_e2e.MODELS), choices=gpu_e2e.MODELS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--log", type=Path, default=None, help="also write the report there")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"gpu_syncs: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    from qtrain.plugin import import_builtin_plugins

    import_builtin_plugins()
    text = report(measure(args.models, args.variants, args.nodes, args.epochs))
    print(text)
    if args.log is not None:
        args.log.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
