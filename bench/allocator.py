"""Training epochs with the qtrain command's allocator settings against glibc's defaults.

The setting is per process (glibc's ``mallopt`` cannot be undone cleanly), so each
round starts one ``bench/epoch.py`` process per setting, the order alternating from
round to round: ``--allocator command`` (huge pages for torch and freed memory kept,
what ``qtrain`` sets up, ``qtrain/_malloc.py``) and ``--allocator default`` (huge pages
only, glibc's malloc as it comes). Each process times ``--repeat`` epochs of every
variant after one untimed epoch and ``--settle`` more (``bench/epoch.py``); a round's
ratio is the default process's median over the command process's (> 1: the command's
settings are faster). Printed per model and variant: each setting's median ± IQR over
all its epochs, the ratio of those medians, and the range and median of the per-round
ratios.

    python bench/allocator.py --models gcn gat --variants fp32 tango-8 tango-4 --rounds 3 \
        --json bench/results/allocator.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _record import ROOT, provenance, write_json
from _timing import Timing

SETTINGS = ("command", "default")


def one_process(setting: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``bench/epoch.py`` in a process of its own with ``setting``; its JSON results."""
    command = [
        sys.executable,
        str(ROOT / "bench" / "epoch.py"),
        "--allocator",
        setting,
        "--threads",
        str(args.threads),
        "--models",
        *args.models,
        "--variants",
        *args.variants,
        "--repeat",
        str(args.repeat),
        "--settle",
        str(args.settle),
        "--json",
        str(out),
    ]
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    if done.returncode != 0:  # epoch.py said why on stderr (a bad model or variant name)
        raise SystemExit(f"bench/epoch.py --allocator {setting} failed (exit {done.returncode})")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gcn", "gat"])
    parser.add_argument("--variants", nargs="+", default=["fp32", "tango-8", "tango-4"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="processes per setting")
    parser.add_argument("--repeat", type=int, default=3, help="timed epochs per process")
    parser.add_argument("--settle", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.repeat < 1:
        parser.error("--rounds and --repeat must be at least 1")
    # times[model][variant][setting]: every epoch; medians[...]: one per round
    times: dict[str, dict[str, dict[str, list[float]]]] = {}
    medians: dict[str, dict[str, dict[str, list[float]]]] = {}
    kept: dict[str, list[bool]] = {setting: [] for setting in SETTINGS}
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(args.rounds):
            order = SETTINGS if r % 2 == 0 else SETTINGS[::-1]
            for setting in order:
                result = one_process(setting, args, Path(scratch) / f"{setting}-{r}.json")
                kept[setting].append(bool(result.get("freed_memory_kept")))
                for model, rows in result["models"].items():
                    for variant, row in rows.items():
                        if not isinstance(row, dict) or "times_s" not in row:
                            continue
                        at = times.setdefault(model, {}).setdefault(variant, {})
                        at.setdefault(setting, []).extend(row["times_s"])
                        per = medians.setdefault(model, {}).setdefault(variant, {})
                        per.setdefault(setting, []).append(row["median_s"])
            print(f"round {r + 1} of {args.rounds} done", flush=True)
    if not all(kept["command"]) or any(kept["default"]):
        print(f"warning: freed memory kept per process: {kept}", flush=True)
    print(
        f"\n{'model':7} {'variant':10} {'command ms':>18} {'default ms':>18} "
        f"{'default / command':>18} {'rounds (min-max, median)':>26}"
    )
    summary: dict[str, Any] = {}
    for model, variants in times.items():
        for variant, by_setting in variants.items():
            if set(by_setting) != set(SETTINGS):
                continue
            timing = {s: Timing.of(by_setting[s], s) for s in SETTINGS}
            ratio = timing["default"].median_s / timing["command"].median_s
            rounds = [
                d / c
                for d, c in zip(
                    medians[model][variant]["default"],
                    medians[model][variant]["command"],
                    strict=True,
                )
            ]
            summary.setdefault(model, {})[variant] = {
                "command_s": by_setting["command"],
                "default_s": by_setting["default"],
                "default_over_command": ratio,
                "round_ratios": rounds,
            }
            print(
                f"{model:7} {variant:10} {timing['command'].ms():>18} "
                f"{timing['default'].ms():>18} {ratio:17.2f}x "
                f"{min(rounds):9.2f}-{max(rounds):.2f}x, {statistics.median(rounds):.2f}x"
            )
    write_json(
        args.json,
        {
            **provenance(),
            "threads": args.threads,
            "rounds": args.rounds,
            "repeat": args.repeat,
            "settle": args.settle,
            "freed_memory_kept": kept,
            "models": summary,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
