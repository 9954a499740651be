"""One full training epoch (forward + backward + Adam step): tango vs DGL FP32 vs bf16 autocast.

Uses the example recipes (``examples/arxiv-gcn.toml``: GCN 3 x 256;
``examples/arxiv-gat.toml``: GAT 3 layers, 4 heads x 64) on the synthetic
ogbn-arxiv-shaped graph, or (``--models cora-gcn ...``) the Cora and Citeseer
ones, and the trainer's own ``train_epoch``, so the step timed is the step
``qtrain run`` takes. Each variant gets a fresh model with the same seed; the
variants take turns, one epoch each per round with the order rotated
(``bench/_timing.py``), each epoch timed by ``torch.utils.benchmark.Timer``.
Reported: the median of ``--repeat`` epochs after ``--warmup`` with its
interquartile range (``iqr_s``), the ratio of the medians against FP32 and
bf16 measured in the same process, and the quartiles of the per-round ratios
against FP32 (``speedup_vs_fp32_iqr``): the spread of the comparison itself.

    python bench/epoch.py --threads 2 --json bench/results/epoch.json
    python bench/epoch.py --threads 2 --models cora-gcn cora-gat cora-sage citeseer-gcn \
        citeseer-gat citeseer-sage   # Planetoid from ../shared/datasets or --planetoid-root
    python bench/epoch.py --variants fp32 tango-tensor tango-row --bits 4   # scales per tensor / row
    python bench/epoch.py --variants fp32 tango-row tango-block --bits 4   # per row / node blocks
    python bench/epoch.py --variants tango-8 tango-4 tango-4-int8 tango-2 --baseline tango-8
    python bench/epoch.py --variants tango-8 tango-4 --baseline tango-8 --repeat 8 --settle 1
    python3 bench/epoch.py --device cuda --variants fp32 tango-8 tango-4 --baseline tango-8

``tango-B`` is tango at B bits whatever ``--bits`` says, ``tango-B-int8`` the same with
``packed = false`` (issue 32: below 5 bits tango stores its operands two values a byte;
this variant keeps them int8, so the pair shows what packing changes). Every row also has
the bytes its steps saved for backward (``activation_bytes``, the trainer's meter, highest
step), and with ``--baseline`` the ratios of time and bytes against that variant.

``--settle N`` runs N untimed epochs of a variant after entering it on the synthetic-arxiv
recipes too (``--small-settle`` on the small ones): without it the epoch right after
another variant's was about 0.4 s slower on synthetic-arxiv GCN (a 1 s epoch) whichever
variant ran it, and with two variants the rotation puts one of them in that slot each
round, so the per-round ratios alternated (``bench/results/vm-2026-11-30-epoch-lowbit*``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401  (qtrain from this checkout)
import torch
from _record import write_json
from _timing import interleaved

from qtrain._malloc import set_up_allocator
from qtrain.errors import RecipeError
from qtrain.plugin import PatchSession, PluginContext
from qtrain.recipe import load_recipe, parse_quant
from qtrain.train.loop import Trainer
from qtrain.train.prepare import prepared, resolve_device

ROOT = Path(__file__).resolve().parents[1]
# the synthetic-arxiv recipes, and the small graphs tango must never be slower on:
# Planetoid's and the default recipe's (synthetic-small, 3,000 nodes)
PLANETOID = [f"{d}-{m}" for d in ("cora", "citeseer") for m in ("gcn", "gat", "sage")]
SMALL = [*PLANETOID, "default-gcn"]
# recipe per key, relative to the checkout
MODELS = {
    "gcn": "examples/arxiv-gcn.toml",
    "gat": "examples/arxiv-gat.toml",
    **{key: f"examples/{key}.toml" for key in PLANETOID},
    "default-gcn": "qtrain.toml",
}
# where the Planetoid files are looked for unless --planetoid-root says otherwise
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"


ALLOCATORS = ("command", "default")
NAMED_VARIANTS = ["fp32", "bf16-autocast", "tango", "tango-tensor", "tango-row", "tango-block"]
# tango at a bit count of its own, optionally with its operands kept int8 (not packed)
BITS_VARIANT = re.compile(r"tango-([2-8])(-int8)?")


def epochs_count(text: str) -> int:
    """A number of epochs, 0 or more (argparse's type: refused in one line otherwise)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of epochs, 0 or more: {text!r}")
    return n


def device_name(text: str) -> str:
    """A ``train.device`` value naming a device torch sees (argparse's type: refused in one
    line otherwise)."""
    if not (text in ("cpu", "cuda", "auto") or re.fullmatch(r"cuda:\d+", text)):
        raise argparse.ArgumentTypeError(f"use 'cpu', 'cuda', 'cuda:N' or 'auto', not {text!r}")
    try:
        resolve_device(text)  # the run's own check: a GPU torch does not see is refused
    except RecipeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def variant(name: str) -> str:
    """``name`` if it names a variant (argparse's check), else ValueError."""
    if name in NAMED_VARIANTS or BITS_VARIANT.fullmatch(name):
        return name
    raise ValueError(name)


def _session(name: str, model: Any, bits: int, seed: int) -> Any:
    """What a variant's epochs run inside: nothing, bf16 autocast, or tango's patch session."""
    if name == "fp32":
        return None
    if name == "bf16-autocast":
        return "bf16"
    tango: dict[str, Any] = {"bits": bits}  # "tango": the plugin's default scales
    if name in ("tango-tensor", "tango-row", "tango-block"):
        tango["scales"] = name.removeprefix("tango-")
    own_bits = BITS_VARIANT.fullmatch(name)
    if own_bits:
        tango["bits"] = int(own_bits.group(1))
        tango["packed"] = own_bits.group(2) is None
    quant = parse_quant({"plugin": ["tango"], "tango": tango})
    return PatchSession(quant, PluginContext(seed=seed, model=model))


@contextlib.contextmanager
def _entered(session: Any, device_type: str = "cpu") -> Iterator[None]:
    if session is None:
        yield
    elif session == "bf16":
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            yield
    else:
        with session:
            yield


def bench_model(
    key: str,
    variants: list[str],
    bits: int,
    warmup: int,
    repeat: int,
    planetoid_root: Path | None = None,
    settle: int = 0,
    baseline: str | None = None,
    device_name: str = "cpu",
) -> dict[str, Any]:
    """Every variant's epochs, interleaved: one epoch each per round, the order rotated.

    Each variant has its own model (same seed) and trainer. tango's patch session is
    entered around each of its epochs and left after, so the other variants run
    unpatched; entered again, it goes on as one session would (its cache keeps the
    int8 node features, quantized once, as in a run). With ``settle``, every variant
    runs that many untimed epochs after its session is entered and before the timed
    one: entering (and leaving) replaces functions in module namespaces and methods on
    ``torch.Tensor``, which resets the interpreter's specialized lookups, and the
    epochs after pay for re-specializing them, which a run pays once. On the default
    recipe (a 5 ms epoch, a one-off script while a CI run shared the cores, so noisy)
    tango measured 0.79x FP32 with one settling epoch, 1.02x with five and 1.04x in
    blocks of ten epochs per entry.
    """
    overrides = [f"train.device={json.dumps(device_name)}"]
    if key in PLANETOID and planetoid_root:
        overrides.append(f"dataset.root={json.dumps(str(planetoid_root))}")
    recipe = load_recipe(ROOT / MODELS[key], overrides)
    from qtrain.errors import DatasetError
    from qtrain.ops import dispatch

    rows: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        epochs, sessions, kernels, meters = {}, {}, {}, {}
        for name in variants:
            try:
                dataset, graph, model, device = stack.enter_context(prepared(recipe))
            except DatasetError as exc:  # Planetoid files absent: say so, time the rest
                print(f"  {key}: no dataset ({exc})", flush=True)
                return {"error": f"dataset: {exc}"}
            trainer = Trainer(
                model, graph, metric=dataset.metric, config=recipe.train, device=device
            )
            sessions[name] = _session(name, model, bits, recipe.train.seed)
            epochs[name] = trainer.train_epoch
            kernels[name] = {}
            meters[name] = trainer.meter
        usable = {}
        for name, epoch in epochs.items():  # one untimed epoch: does the variant run at all
            try:
                with _entered(sessions[name], device.type):
                    epoch()
                usable[name] = epoch
            except Exception as exc:  # e.g. a DGL kernel without bf16 support
                rows[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"  {key} {name}: not supported ({rows[name]['error'][:120]})", flush=True)

        @contextlib.contextmanager
        def around(name: str) -> Iterator[None]:
            with _entered(sessions[name], device.type):
                for _ in range(settle):
                    epochs[name]()
                dispatch.reset()
                yield
            for primitive, per in dispatch.snapshot().items():
                mine = kernels[name].setdefault(primitive, {})
                for backend, n in per.items():
                    mine[backend] = mine.get(backend, 0) + n

        timings = interleaved(usable, repeat, max(warmup - 1, 0), around=around)
        for name, t in timings.items():
            session = sessions[name]
            report = session.report().get("tango") if isinstance(session, PatchSession) else None
            rows[name] = {
                "median_s": t.median_s,
                "iqr_s": t.iqr_s,
                "times_s": t.times_s,
                "kernels": kernels[name],
                "activation_bytes": meters[name].activation_bytes,
                **({"tango": report} if report else {}),
            }
            print(f"  {key} {name}: {t.ms('.1f')} ms/epoch (median ± IQR)", flush=True)
    base = rows.get("fp32", {}).get("median_s")
    bf16 = rows.get("bf16-autocast", {}).get("median_s")
    for row in rows.values():
        if "median_s" in row:
            row["speedup_vs_fp32"] = base / row["median_s"] if base else None
            row["speedup_vs_bf16"] = bf16 / row["median_s"] if bf16 else None
            row["speedup_vs_fp32_iqr"] = (
                _ratio_quartiles(rows["fp32"]["times_s"], row["times_s"]) if base else None
            )
    against = rows.get(baseline or "", {})
    if "median_s" in against:
        for row in rows.values():
            if "median_s" in row:
                row["speedup_vs_baseline"] = against["median_s"] / row["median_s"]
                row["speedup_vs_baseline_iqr"] = _ratio_quartiles(
                    against["times_s"], row["times_s"]
                )
                saved = row["activation_bytes"]
                row["saved_vs_baseline"] = against["activation_bytes"] / saved if saved else None
    return rows


def _ratio_quartiles(baseline: list[float], times: list[float]) -> list[float]:
    """First and third quartile of the per-round ratios baseline / time (same round, same
    load on the machine)."""
    ratios = torch.tensor([b / t for b, t in zip(baseline, times, strict=True)])
    return [float(q) for q in torch.quantile(ratios.double(), torch.tensor([0.25, 0.75]).double())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gcn", "gat"], choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--device",
        type=device_name,
        default="cpu",
        help="train.device for every recipe: 'cpu', 'cuda' (qtrain's device route) or 'auto'",
    )
    parser.add_argument("--bits", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--small-warmup", type=int, default=5, help="--warmup for the Cora / Citeseer recipes"
    )
    parser.add_argument(
        "--small-repeat", type=int, default=30, help="--repeat for the Cora / Citeseer recipes"
    )
    parser.add_argument(
        "--small-settle",
        type=int,
        default=5,
        help="untimed epochs after each session entry before the timed one (small recipes)",
    )
    parser.add_argument(
        "--settle",
        type=epochs_count,
        default=0,
        help="untimed epochs after each session entry before the timed one (synthetic-arxiv "
        "recipes): an epoch right after another variant's pays for bringing this variant's "
        "model, graph and buffers back into memory and caches",
    )
    parser.add_argument(
        "--planetoid-root",
        type=Path,
        default=SHARED_DATASETS if (SHARED_DATASETS / "planetoid").is_dir() else None,
        help="folder holding planetoid/ (default: ../shared/datasets where it exists, "
        "else $QTRAIN_DATA_DIR)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["fp32", "bf16-autocast", "tango"],
        type=variant,
        metavar="VARIANT",
        help=f"{', '.join(NAMED_VARIANTS)}, tango-B or tango-B-int8 (B in 2..8)",
    )
    parser.add_argument(
        "--baseline",
        type=variant,
        default=None,
        help="a variant to take the ratios of time and saved bytes against too (one of --variants)",
    )
    parser.add_argument(
        "--allocator",
        choices=ALLOCATORS,
        default="command",
        help="'command': huge pages and freed memory kept, as the qtrain command sets up its "
        "process (qtrain._malloc); 'default': huge pages only, glibc's malloc as it comes "
        "(bench/allocator.py times the two)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    # before the first allocation (torch reads THP_MEM_ALLOC_ENABLE then)
    kept = set_up_allocator(keep_freed=args.allocator == "command")
    if args.baseline is not None and args.baseline not in args.variants:
        parser.error(f"--baseline {args.baseline} is not one of --variants")
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "threads": args.threads,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "device": args.device,
        "allocator": args.allocator,
        "freed_memory_kept": kept,
        "gpu": torch.cuda.get_device_name()
        if args.device != "cpu" and torch.cuda.is_available()
        else None,
        "models": {},
    }
    print(
        f"epoch benchmark on {args.device}, {args.threads} threads, tango at {args.bits} bits",
        flush=True,
    )
    for key in args.models:
        small = key in SMALL
        results["models"][key] = bench_model(
            key,
            args.variants,
            args.bits,
            args.small_warmup if small else args.warmup,
            args.small_repeat if small else args.repeat,
            args.planetoid_root,
            settle=args.small_settle if small else args.settle,
            baseline=args.baseline,
            device_name=args.device,
        )
    print()
    print(
        f"{'model':13} {'variant':14} {'ms/epoch':>9} {'± IQR':>7} {'vs fp32':>8} "
        f"{'rounds IQR':>13} {'vs bf16':>8}"
    )
    for key, rows in results["models"].items():
        if "error" in rows:
            print(f"{key:13} {rows['error'][:80]}")
            continue
        for name, row in rows.items():
            if "error" in row:
                print(f"{key:13} {name:14} {'n/a':>9} {'':>7}  {row['error'][:60]}")
                continue
            vs32, vs16, spread = (
                row["speedup_vs_fp32"],
                row["speedup_vs_bf16"],
                row["speedup_vs_fp32_iqr"],
            )
            print(
                f"{key:13} {name:14} {row['median_s'] * 1e3:9.1f} {row['iqr_s'] * 1e3:7.1f} "
                + (f"{vs32:7.2f}x" if vs32 else "     n/a")
                + (f" {spread[0]:5.2f}-{spread[1]:5.2f}x" if spread else " " * 14)
                + (f" {vs16:7.2f}x" if vs16 else "      n/a")
            )
    if args.baseline is not None:
        print_against(results["models"], args.baseline)
    write_json(args.json, results)
    return 0


def print_against(models: dict[str, Any], baseline: str) -> None:
    """The time and saved-bytes ratios against ``baseline`` (> 1: faster, smaller)."""
    print()
    print(
        f"{'model':13} {'variant':14} {'ms/epoch':>9} {'vs ' + baseline:>13} "
        f"{'rounds IQR':>13} {'saved MiB':>10} {'vs ' + baseline:>13}"
    )
    for key, rows in models.items():
        for name, row in rows.items():
            if not isinstance(row, dict) or "speedup_vs_baseline" not in row:
                continue
            spread = row["speedup_vs_baseline_iqr"]
            saved = row["saved_vs_baseline"]
            print(
                f"{key:13} {name:14} {row['median_s'] * 1e3:9.1f} "
                f"{row['speedup_vs_baseline']:12.2f}x {spread[0]:5.2f}-{spread[1]:5.2f}x "
                f"{row['activation_bytes'] / 2**20:10.1f} "
                + (f"{saved:12.2f}x" if saved else "          n/a")
            )


if __name__ == "__main__":
    raise SystemExit(main())
