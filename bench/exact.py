"""Activation memory and epoch time of the ``exact`` plugin against FP32 on synthetic-arxiv.

Two models, full graph, with the trainer's own step (``Trainer.train_epoch``:
forward + backward + Adam, under the ``ActivationMeter`` that every run uses):

* ``sage``: ``examples/arxiv-sage.toml`` (GraphSAGE, 3 layers x 256) with the mean
  aggregator, as EXACT's experiments use;
* ``gcnii``: ``examples/arxiv-gcn.toml`` with the model swapped for GCNII at its
  defaults (16 GCN2Conv layers x 64, dropout 0.6).

Variants: ``fp32`` (no plugin), ``int2`` (``[quant.exact] bits = 2``) and
``rp8-int2`` (``bits = 2, rp_ratio = 8``); ``--bits`` / ``--rp-ratio`` change them.

Memory part: each variant alone (a fresh model from the recipe's seed, its
own process state otherwise shared), ``--memory-steps`` training steps; it
reports ``activation_bytes`` (peak bytes held by tensors saved for backward,
as the run summary reports it), ``peak_memory_bytes`` (the step's peak
resident memory, VmHWM reset per step) and the resident memory just before
the last step, so their difference is what the step itself added.

Time part (``--time-models``, SAGE by default, the model the time bars are
about): all variants are built first, then after ``--warmup`` epochs each they
run round-robin, one epoch per variant per round with the order rotated each
round, so load from other jobs on a shared machine falls on all of them
alike, each epoch timed by ``torch.utils.benchmark.Timer`` (``bench/_timing.py``);
medians of ``--repeat`` epochs with their interquartile range (``iqr_s``), and the
medians' ratios against FP32, all measured in this process.

The bars (the issue's): SAGE activation memory >= 10x smaller than FP32 with
INT2 and >= 20x with RP 8 + INT2; GCNII (16 layers) trains with >= 25x smaller
activation memory with RP 8 + INT2; SAGE epoch time with INT2 at most 25 %
over FP32; RP 8 + INT2 no slower than INT2. Which backend ran the compression
primitives (``qtrain.ops.dispatch`` counters) is recorded per variant.

    python bench/exact.py --threads 2 --repeat 5 --json bench/results/exact.json
    python bench/exact.py --memory-only --models gcnii
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import math
import platform
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from _record import git_commit, write_json
from _timing import interleaved

from qtrain._malloc import set_up_allocator
from qtrain.ops import backends, compress, dispatch
from qtrain.plugin import PatchSession, PluginContext
from qtrain.recipe import Recipe, load_recipe
from qtrain.train.loop import Trainer
from qtrain.train.prepare import prepared

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20

# model key -> (example recipe, overrides that make the model)
MODELS: dict[str, tuple[str, list[str]]] = {
    "sage": ("arxiv-sage", ['model.aggregator="mean"']),  # EXACT's GraphSAGE aggregator
    "gcnii": (
        "arxiv-gcn",
        # GCNII at its registered defaults (qtrain models): 16 layers x 64, dropout 0.6
        ["model.name=gcnii", "model.hidden=64", "model.layers=16", "model.dropout=0.6"],
    ),
}
VARIANTS = ("fp32", "int2", "rp8-int2")


def variant_overrides(name: str, bits: int, rp_ratio: int, backend: str) -> list[str]:
    if name == "fp32":
        return ["quant.plugin=[]"]
    ratio = rp_ratio if name.startswith("rp") else 1
    return [
        'quant.plugin=["exact"]',
        f"quant.exact.bits={bits}",
        f"quant.exact.rp_ratio={ratio}",
        f'quant.exact.backend="{backend}"',
    ]


def variant_recipe(model: str, variant: str, args: argparse.Namespace) -> Recipe:
    example, model_overrides = MODELS[model]
    overrides = [
        *model_overrides,
        f"train.threads={args.threads}",
        *args.set,
        *variant_overrides(variant, args.bits, args.rp_ratio, args.backend),
    ]
    return load_recipe(ROOT / "examples" / f"{example}.toml", overrides)


def _rss() -> int:
    with open("/proc/self/status") as f:
        match = re.search(r"VmRSS:\s+(\d+)\s+kB", f.read())
    return int(match.group(1)) * 1024 if match else 0


def _release_memory() -> None:
    """Return freed heap to the OS, so resident memory before a step is what is live."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _kernels_used(snapshot: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    names = (
        "compress",
        "decompress",
        "pack",
        "unpack",
        "rademacher",
        "project+compress",
        "decompress+unproject",
    )
    return {k: v for k, v in snapshot.items() if k in names}


@contextlib.contextmanager
def _trainer(recipe: Recipe) -> Any:
    """A Trainer and its PatchSession (not entered) for ``recipe``, built as a run builds them."""
    with prepared(recipe) as (dataset, graph, model, device):
        context = PluginContext(seed=recipe.train.seed, device=device, model=model)
        session = PatchSession(recipe.quant, context)
        trainer = Trainer(model, graph, metric=dataset.metric, config=recipe.train, device=device)
        yield trainer, session


# ---------------------------------------------------------------- memory


def measure_memory(model: str, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    recipe = variant_recipe(model, variant, args)
    _release_memory()
    dispatch.reset()
    losses, rss_before = [], 0
    start = time.perf_counter()
    with _trainer(recipe) as (trainer, session), session:
        for _ in range(args.memory_steps):
            _release_memory()
            rss_before = _rss()
            loss, _acc = trainer.train_epoch()
            losses.append(loss)
        meter = trainer.meter
        row = {
            "recipe": f"examples/{MODELS[model][0]}.toml",
            "overrides": [
                *MODELS[model][1],
                *variant_overrides(variant, args.bits, args.rp_ratio, args.backend),
            ],
            "steps": args.memory_steps,
            "activation_bytes": meter.activation_bytes,
            "peak_memory_bytes": meter.peak_memory_bytes,
            "peak_memory_source": meter.peak_memory_source,
            "rss_before_last_step_bytes": rss_before,
            "step_added_bytes": meter.peak_memory_bytes - rss_before,
            "losses": losses,
            "trains": all(math.isfinite(x) for x in losses),
            "seconds": time.perf_counter() - start,
            "kernels": _kernels_used(dispatch.snapshot()),
            "kernel_fallbacks": dispatch.fallbacks(),
            "num_params": sum(p.numel() for p in trainer.model.parameters()),
        }
    report = session.report().get("exact")
    if report:
        row["exact"] = report
    del trainer, session
    _release_memory()
    return row


# ---------------------------------------------------------------- time


def measure_time(model: str, variants: list[str], args: argparse.Namespace) -> dict[str, Any]:
    kernels: dict[str, dict[str, dict[str, int]]] = {v: {} for v in variants}
    with contextlib.ExitStack() as stack:
        built = {v: stack.enter_context(_trainer(variant_recipe(model, v, args))) for v in variants}

        @contextlib.contextmanager
        def in_session(variant: str) -> Iterator[None]:
            """The variant's patches around its epoch, and its kernel calls counted (untimed)."""
            dispatch.reset()
            with built[variant][1]:
                yield
            for prim, per in _kernels_used(dispatch.snapshot()).items():
                mine = kernels[variant].setdefault(prim, {})
                for backend, calls in per.items():
                    mine[backend] = mine.get(backend, 0) + calls

        def progress(i: int, seconds: dict[str, float]) -> None:
            line = ", ".join(f"{v} {seconds[v] * 1e3:.0f}" for v in variants)
            print(f"  {model} round {i + 1}/{args.repeat}: {line} ms", flush=True)

        epochs = {v: built[v][0].train_epoch for v in variants}
        timings = interleaved(
            epochs, args.repeat, args.warmup, around=in_session, on_round=progress
        )
    rows: dict[str, Any] = {}
    base = timings["fp32"].median_s if "fp32" in timings else None
    for v in variants:
        med = timings[v].median_s
        rows[v] = {
            "median_s": med,
            "iqr_s": timings[v].iqr_s,
            "times_s": timings[v].times_s,
            "vs_fp32": med / base if base else None,
            "kernels": kernels[v],
        }
    return rows


# ---------------------------------------------------------------- bars


def check_bars(results: dict[str, Any]) -> list[dict[str, Any]]:
    mem, tim = results["memory"], results["time"]
    bars: list[dict[str, Any]] = []

    def mem_ratio(model: str, variant: str) -> float | None:
        rows = mem.get(model, {})
        if "fp32" not in rows or variant not in rows:
            return None
        return rows["fp32"]["activation_bytes"] / rows[variant]["activation_bytes"]

    def add(name: str, value: float | None, ok: bool | None, want: str) -> None:
        bars.append({"bar": name, "value": value, "want": want, "pass": ok})

    for variant, bar in (("int2", 10.0), ("rp8-int2", 20.0)):
        r = mem_ratio("sage", variant)
        add(
            f"sage activation memory fp32 / {variant}",
            r,
            None if r is None else r >= bar,
            f">= {bar:g}x",
        )
    r = mem_ratio("gcnii", "rp8-int2")
    trains = mem.get("gcnii", {}).get("rp8-int2", {}).get("trains")
    ok = None if r is None else (r >= 25.0 and bool(trains))
    add("gcnii 16 layers trains, activation memory fp32 / rp8-int2", r, ok, ">= 25x (finite loss)")
    sage = tim.get("sage", {})
    if "fp32" in sage and "int2" in sage:
        over = sage["int2"]["vs_fp32"] - 1.0
        add("sage epoch time overhead int2 vs fp32", over, over <= 0.25, "<= +25 %")
    else:
        add("sage epoch time overhead int2 vs fp32", None, None, "<= +25 %")
    if "int2" in sage and "rp8-int2" in sage:
        ratio = sage["rp8-int2"]["median_s"] / sage["int2"]["median_s"]
        add("sage epoch time rp8-int2 / int2", ratio, ratio <= 1.0, "<= 1.00")
    else:
        add("sage epoch time rp8-int2 / int2", None, None, "<= 1.00")
    return bars


# ---------------------------------------------------------------- main


def _mib(n: float) -> str:
    return f"{n / MIB:.1f}"


def print_tables(results: dict[str, Any]) -> None:
    print()
    print("activation memory (bytes saved for backward, peak in a step) and per-step peak RSS, MiB")
    head = f"{'model':6} {'variant':9} {'activations':>11} {'vs fp32':>8} {'step peak':>10} {'vs fp32':>8} {'step adds':>10} {'backend':>10}"
    print(head)
    for model, rows in results["memory"].items():
        base = rows.get("fp32")
        for v, row in rows.items():
            ratio = base["activation_bytes"] / row["activation_bytes"] if base else float("nan")
            peak = base["peak_memory_bytes"] / row["peak_memory_bytes"] if base else float("nan")
            used = sorted({b for per in row["kernels"].values() for b in per}) or ["-"]
            print(
                f"{model:6} {v:9} {_mib(row['activation_bytes']):>11} {ratio:7.1f}x "
                f"{_mib(row['peak_memory_bytes']):>10} {peak:7.2f}x "
                f"{_mib(row['step_added_bytes']):>10} {','.join(used):>10}"
            )
    if results["time"]:
        print()
        print(
            "epoch time (forward + backward + Adam), median ms and its IQR, ratio of the "
            "medians to fp32 (> 1 is slower)"
        )
        print(
            f"{'model':6} {'variant':9} {'ms/epoch':>9} {'± IQR':>7} {'vs fp32':>8} {'backend':>10}"
        )
        for model, rows in results["time"].items():
            for v, row in rows.items():
                used = sorted({b for per in row["kernels"].values() for b in per}) or ["-"]
                ratio = "-" if row["vs_fp32"] is None else f"{row['vs_fp32']:.3f}x"
                print(
                    f"{model:6} {v:9} {row['median_s'] * 1e3:9.0f} {row['iqr_s'] * 1e3:7.0f} "
                    f"{ratio:>8} {','.join(used):>10}"
                )
    print()
    for bar in results["bars"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[bar["pass"]]
        value = bar["value"]
        shown = "-" if value is None else f"{value:.3f}"
        print(f"{verdict}  {bar['bar']}: {shown} (want {bar['want']})")


def main(argv: list[str] | None = None) -> int:
    set_up_allocator()  # as the qtrain command sets up its process (qtrain._malloc)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--time-models",
        nargs="*",
        default=["sage"],
        choices=list(MODELS),
        help="models whose epochs are timed (default sage; the time bars are about it)",
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--bits", type=int, default=2, choices=[1, 2, 4, 8])
    parser.add_argument("--rp-ratio", type=int, default=8, choices=[2, 4, 8])
    parser.add_argument("--backend", default="auto", choices=["auto", "reference", "ext-cpu"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--memory-only", action="store_true", help="skip the time part")
    parser.add_argument("--time-only", action="store_true", help="skip the memory part")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="recipe override applied to every variant, as qtrain run --set",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    variants = [v for v in VARIANTS if v in args.variants]
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": git_commit(),
        "threads": args.threads,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "compress_kernels": list(compress.COMPRESS_KERNELS),
        "ext_cpu": backends.status().get("ext-cpu"),
        "bits": args.bits,
        "rp_ratio": args.rp_ratio,
        "backend": args.backend,
        "memory": {},
        "time": {},
    }
    print(
        f"exact benchmark: {args.threads} threads, INT{args.bits}, RP {args.rp_ratio}, "
        f"compress kernels {list(compress.COMPRESS_KERNELS) or ['reference only']}",
        flush=True,
    )
    if not args.time_only:
        for model in args.models:
            results["memory"][model] = {}
            for v in variants:
                row = measure_memory(model, v, args)
                results["memory"][model][v] = row
                print(
                    f"  {model} {v}: activations {_mib(row['activation_bytes'])} MiB, "
                    f"step peak {_mib(row['peak_memory_bytes'])} MiB, "
                    f"losses {[round(x, 4) for x in row['losses']]}, {row['seconds']:.0f} s",
                    flush=True,
                )
    if not args.memory_only:
        for model in args.time_models:
            if model in args.models:
                results["time"][model] = measure_time(model, variants, args)
    results["bars"] = check_bars(results)
    print_tables(results)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
