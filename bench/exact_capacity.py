"""Capacity: a full-graph step that does not fit a memory budget in FP32 fits with ``exact``.

Full-graph GraphSAGE (3 layers x ``--hidden``, 128 by default, mean
aggregator, dropout 0.5: the model of ``examples/products-sage-minibatch.toml``
at half its width, trained here with ``train.mode = "full"``) on ``synthetic-products`` (2,449,029 nodes,
61,859,140 undirected edges; generated on first use, about 1.5 minutes, and
cached). Each variant runs in its own child process that loads the data,
builds the model from the recipe's seed and takes ``--steps`` training steps
with the trainer's own step (forward, backward, Adam).

The budget is enforced from outside: the parent reads the child's ``VmRSS``
from ``/proc/<pid>/status`` every ``--poll-ms`` and sends SIGKILL as soon as
it exceeds ``--budget-gib``; it reports the highest resident size it saw (and
the highest ``VmHWM``, the kernel's own high-water mark, which also catches
peaks between two polls; the child's activation meter resets it at each step
start, so it is the peak since then) and how the child ended. Resident memory
is what competes for this machine's RAM, so that is what is limited, and the
parent can report how far the child got and the highest resident size it
reached. RLIMIT_AS was not used: it limits address space (``VmSize``, which
the child reports after loading, next to ``VmRSS``), which includes mappings
and allocator reservations that are never touched, and a child over it fails
with an allocation error inside whichever operator crossed the line rather
than being measured and stopped from outside.

Safety on a shared machine: no child starts unless ``MemAvailable`` exceeds
the budget by ``--headroom-gib``; each child sets its ``oom_score_adj`` to
1000, so if memory ran out anyway the kernel would end the child, not another
job. There is no swap to fill on this machine.

    python bench/exact_capacity.py --budget-gib 16 --json bench/results/exact_capacity_hidden128.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _record import git_commit, write_json

GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "products-sage-minibatch.toml"
VARIANTS = ("fp32", "int2", "rp8-int2", "int2-unblocked")


def variant_overrides(name: str) -> list[str]:
    """The recipe keys of a variant: FP32, exact INT2 (GraphSAGE's mean layers a block of
    rows at a time and the graph held as its CSC: ``blocked_sage``, the default), INT2
    after a D/R = 8 projection, and INT2 with DGL's own layers and graph
    (``blocked_sage = false``)."""
    if name == "fp32":
        return ["quant.plugin=[]"]
    ratio = 8 if name == "rp8-int2" else 1
    blocked = "false" if name == "int2-unblocked" else "true"
    return [
        'quant.plugin=["exact"]',
        "quant.exact.bits=2",
        f"quant.exact.rp_ratio={ratio}",
        f"quant.exact.blocked_sage={blocked}",
    ]


def _status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, VmHWM, VmSize of a process, in bytes (empty once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    for key in ("VmRSS", "VmHWM", "VmSize"):
        match = re.search(rf"{key}:\s+(\d+)\s+kB", text)
        if match:
            out[key] = int(match.group(1)) * 1024
    return out


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        match = re.search(r"MemAvailable:\s+(\d+)\s+kB", f.read())
    return int(match.group(1)) * 1024 if match else 0


# ---------------------------------------------------------------- the child


def child(variant: str, args: argparse.Namespace) -> int:
    """Load, build, take ``args.steps`` steps; one JSON line per phase on stdout."""
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("1000")

    def say(phase: str, **fields: Any) -> None:
        print(json.dumps({"phase": phase, "t": time.perf_counter() - t0, **_status(), **fields}))
        sys.stdout.flush()

    t0 = time.perf_counter()
    import torch

    from qtrain.ops import dispatch
    from qtrain.plugin import PatchSession, PluginContext
    from qtrain.recipe import load_recipe
    from qtrain.train.loop import Trainer
    from qtrain.train.prepare import prepared

    torch.set_num_threads(args.threads)
    overrides = [
        'train.mode="full"',
        f"train.threads={args.threads}",
        f"model.hidden={args.hidden}",
        f"model.layers={args.layers}",
        *variant_overrides(variant),
        *args.set,
    ]
    recipe = load_recipe(RECIPE, overrides)
    say("start", overrides=overrides)
    with prepared(recipe) as (dataset, graph, model, device):
        context = PluginContext(seed=recipe.train.seed, device=device, model=model)
        session = PatchSession(recipe.quant, context)
        trainer = Trainer(model, graph, metric=dataset.metric, config=recipe.train, device=device)
        say("ready", nodes=int(graph.num_nodes()), edges=int(graph.num_edges()))
        dispatch.reset()
        with session:
            for i in range(args.steps):
                before = _status().get("VmRSS", 0)
                start = time.perf_counter()
                loss, _acc = trainer.train_epoch()
                say(
                    "step",
                    step=i + 1,
                    loss=loss,
                    finite=math.isfinite(loss),
                    # the loss is computed before backward: a step whose gradients
                    # were not finite shows in the parameters Adam wrote
                    params_finite=all(bool(p.isfinite().all()) for p in model.parameters()),
                    seconds=time.perf_counter() - start,
                    rss_before_step=before,
                    activation_bytes=trainer.meter.activation_bytes,
                    step_peak_bytes=trainer.meter.peak_memory_bytes,
                )
        report = session.report().get("exact")
        kernels = {
            k: v
            for k, v in dispatch.snapshot().items()
            if k in ("compress", "decompress", "pack", "unpack", "rademacher")
        }
        say("done", kernels=kernels, exact=report)
    return 0


# ---------------------------------------------------------------- the parent


def run_child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    budget = int(args.budget_gib * GIB)
    available = _mem_available()
    if available < budget + args.headroom_gib * GIB:
        return {
            "outcome": "not started",
            "reason": f"MemAvailable {available / GIB:.1f} GiB < budget + headroom "
            f"{args.budget_gib + args.headroom_gib:.1f} GiB",
        }
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", variant]
    cmd += ["--threads", str(args.threads), "--steps", str(args.steps)]
    cmd += ["--hidden", str(args.hidden), "--layers", str(args.layers)]
    for item in args.set:
        cmd += ["--set", item]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    phases: list[dict[str, Any]] = []
    stderr: list[str] = []

    def read_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with contextlib.suppress(json.JSONDecodeError):
                phase = json.loads(line)
                phases.append(phase)
                shown = {k: v for k, v in phase.items() if k in ("phase", "step", "loss")}
                rss = phase.get("VmRSS", 0) / GIB
                print(f"    {variant}: {shown} RSS {rss:.2f} GiB", flush=True)

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            stderr.append(line)
            del stderr[:-40]

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
    for reader in readers:
        reader.start()
    max_rss = max_hwm = 0
    killed_at: dict[str, Any] | None = None
    while proc.poll() is None:
        status = _status(proc.pid)
        rss, hwm = status.get("VmRSS", 0), status.get("VmHWM", 0)
        max_rss, max_hwm = max(max_rss, rss), max(max_hwm, hwm)
        if rss > budget:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            killed_at = {
                "rss_bytes": rss,
                "seconds": time.perf_counter() - start,
                "last_phase": phases[-1]["phase"] if phases else None,
            }
            proc.wait()
            break
        if time.perf_counter() - start > args.timeout_s:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed_at = {
                "timeout_s": args.timeout_s,
                "last_phase": phases[-1]["phase"] if phases else None,
            }
            break
        time.sleep(args.poll_ms / 1000)
    for reader in readers:
        reader.join(timeout=5)
    steps = [p for p in phases if p["phase"] == "step"]
    done = any(p["phase"] == "done" for p in phases)
    if killed_at is not None and "rss_bytes" in killed_at:
        outcome = "killed at the budget"
    elif killed_at is not None:
        outcome = "killed at the timeout"
    elif done and proc.returncode == 0:
        outcome = "finished"
    else:
        outcome = f"failed (exit status {proc.returncode})"
    ready = next((p for p in phases if p["phase"] == "ready"), {})
    row: dict[str, Any] = {
        "overrides": variant_overrides(variant),
        "outcome": outcome,
        "exit_status": proc.returncode,
        "wall_s": time.perf_counter() - start,
        "max_rss_bytes_polled": max_rss,
        "max_hwm_bytes_polled": max_hwm,
        "steps_finished": len(steps),
        "rss_after_load_bytes": ready.get("VmRSS"),
        "vmsize_after_load_bytes": ready.get("VmSize"),
        "load_s": ready.get("t"),
        "phases": phases,
    }
    if killed_at is not None:
        row["killed"] = killed_at
    if steps:
        last = steps[-1]
        row.update(
            step_seconds=[p["seconds"] for p in steps],
            losses=[p["loss"] for p in steps],
            params_finite=all(p["params_finite"] for p in steps),
            activation_bytes=last["activation_bytes"],
            step_peak_bytes=last["step_peak_bytes"],
        )
    if outcome.startswith("failed"):
        row["stderr_tail"] = "".join(stderr[-15:])
    return row


def _round_summary(row: dict[str, Any]) -> dict[str, Any]:
    return {
        key: row.get(key)
        for key in ("outcome", "max_rss_bytes_polled", "max_hwm_bytes_polled", "step_seconds")
    }


def _pool_rounds(row: dict[str, Any]) -> None:
    """The variant's figures over all its rounds: the highest peak, the worst outcome, and
    the step times after each child's first step (the first builds DGL's formats)."""
    rounds = row["rounds"]
    for key in ("max_rss_bytes_polled", "max_hwm_bytes_polled"):
        row[key] = max(r[key] or 0 for r in rounds)
    unfinished = [r["outcome"] for r in rounds if r["outcome"] != "finished"]
    row["outcome"] = unfinished[0] if unfinished else "finished"
    row["steady_step_seconds"] = [s for r in rounds for s in (r["step_seconds"] or [])[1:]]


def compare_to_fp32(variants: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Peak and steady step time of each exact variant against FP32's, where FP32 finished
    every round under the budget and both have steps after their first."""
    fp32 = variants.get("fp32")
    if not fp32 or fp32["outcome"] != "finished" or not fp32["steady_step_seconds"]:
        return {}
    base_peak = max(fp32["max_rss_bytes_polled"], fp32["max_hwm_bytes_polled"])
    base = fp32["steady_step_seconds"]
    out = {}
    for name, row in variants.items():
        steps = row["steady_step_seconds"]
        if name == "fp32" or row["outcome"] != "finished" or not steps:
            continue
        peak = max(row["max_rss_bytes_polled"], row["max_hwm_bytes_polled"])
        out[name] = {
            "peak_ratio": base_peak / peak,
            "step_time_ratio": statistics.median(steps) / statistics.median(base),
            "step_s_median": statistics.median(steps),
            "step_s_iqr": _iqr(steps),
            "fp32_step_s_median": statistics.median(base),
            "fp32_step_s_iqr": _iqr(base),
        }
    return out


def _iqr(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0]]
    quartiles = statistics.quantiles(values, n=4)
    return [quartiles[0], quartiles[2]]


def main(argv: list[str] | None = None) -> int:
    # huge pages for torch's CPU allocator, as the qtrain command sets (qtrain.cli.main);
    # `import qtrain` no longer does. In time: torch reads it at its first allocation.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-gib", type=float, default=16.0)
    parser.add_argument(
        "--headroom-gib", type=float, default=2.0, help="free memory kept for others"
    )
    parser.add_argument(
        "--variants", nargs="+", default=["fp32", "int2", "rp8-int2"], choices=VARIANTS
    )
    # two steps: DGL builds the graph's CSC and CSR during the first and keeps them, so the
    # second step's peak (1 GiB above the first's for exact INT2 at 3 x 128) is the steady one
    parser.add_argument("--steps", type=int, default=2, help="training steps per variant")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every variant this many times, alternating the order (step times pooled)",
    )
    parser.add_argument("--threads", type=int, default=2)
    # 3 x 256 does not fit 16 GiB even with exact: the forward's own FP32 tensors
    # (2.34 GiB each at 256 wide) pass it before anything is saved; at 128 FP32
    # still does not fit and exact does
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--poll-ms", type=float, default=20.0)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per child")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--child", choices=VARIANTS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args)

    budget = int(args.budget_gib * GIB)
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": git_commit(),
        "recipe": str(RECIPE.relative_to(ROOT)),
        "budget_bytes": budget,
        "budget_gib": args.budget_gib,
        "enforcement": "parent polls the child's VmRSS (/proc/<pid>/status) and SIGKILLs it past the budget",
        "poll_ms": args.poll_ms,
        "threads": args.threads,
        "steps": args.steps,
        "hidden": args.hidden,
        "layers": args.layers,
        "cpu": platform.processor() or platform.machine(),
        "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "variants": {},
    }
    print(
        f"capacity: full-graph SAGE {args.layers} x {args.hidden} on synthetic-products, "
        f"budget {args.budget_gib:g} GiB of resident memory, {args.steps} step(s) per variant",
        flush=True,
    )
    total = time.perf_counter()
    for round_index in range(args.rounds):
        order = list(args.variants) if round_index % 2 == 0 else list(reversed(args.variants))
        for variant in order:
            print(f"  {variant}: starting (round {round_index + 1} of {args.rounds})", flush=True)
            row = run_child(variant, args)
            print(f"  {variant}: {row['outcome']}", flush=True)
            first = results["variants"].setdefault(variant, row)
            first.setdefault("rounds", []).append(_round_summary(row))
    for row in results["variants"].values():
        _pool_rounds(row)
    results["total_s"] = time.perf_counter() - total

    print()
    print(
        f"{'variant':9} {'outcome':22} {'max RSS GiB':>11} {'max HWM GiB':>11} {'after load':>10} {'activations MiB':>15} {'step s':>7}"
    )
    for variant, row in results["variants"].items():
        act = row.get("activation_bytes")
        secs = row.get("step_seconds")
        print(
            f"{variant:9} {row['outcome']:22} {row.get('max_rss_bytes_polled', 0) / GIB:11.2f} "
            f"{row.get('max_hwm_bytes_polled', 0) / GIB:11.2f} "
            f"{(row.get('rss_after_load_bytes') or 0) / GIB:10.2f} "
            f"{'-' if act is None else f'{act / 2**20:.1f}':>15} "
            f"{'-' if not secs else f'{secs[-1]:.1f}':>7}"
        )
    results["comparison"] = compare_to_fp32(results["variants"])
    fp32 = results["variants"].get("fp32", {})
    exact = {k: v for k, v in results["variants"].items() if k != "fp32"}
    fp32_over = fp32.get("outcome") == "killed at the budget" or (
        fp32.get("max_hwm_bytes_polled", 0) > budget
    )
    results["bars"] = {"fp32 exceeds the budget": fp32_over if fp32 else None}
    for name, row in exact.items():
        fits = (
            row.get("outcome") == "finished"
            and row.get("steps_finished", 0) >= 1
            and max(row.get("max_rss_bytes_polled", 0), row.get("max_hwm_bytes_polled", 0))
            <= budget
            and all(math.isfinite(x) for x in row.get("losses", [math.nan]))
            and row.get("params_finite", False)
        )
        results["bars"][f"{name} trains under the budget"] = fits
        versus = results["comparison"].get(name)
        if versus is not None:
            results["bars"][f"{name} peak at least 3x below fp32's"] = versus["peak_ratio"] >= 3.0
            results["bars"][f"{name} step time within 10% of fp32's"] = (
                versus["step_time_ratio"] <= 1.10
            )
    for name, versus in results["comparison"].items():
        print(
            f"{name}: peak {versus['peak_ratio']:.2f}x below fp32's; step time "
            f"{versus['step_time_ratio']:.2f}x fp32's (steps after each child's first: "
            f"median {versus['step_s_median']:.1f} s, IQR {versus['step_s_iqr'][0]:.1f}-"
            f"{versus['step_s_iqr'][1]:.1f}; fp32 {versus['fp32_step_s_median']:.1f} s, IQR "
            f"{versus['fp32_step_s_iqr'][0]:.1f}-{versus['fp32_step_s_iqr'][1]:.1f})"
        )
    print()
    for bar, ok in results["bars"].items():
        where = f" ({args.budget_gib:g} GiB)" if "budget" in bar else ""
        print(f"{ {True: 'PASS', False: 'FAIL', None: 'n/a '}[ok] }  {bar}{where}")
    print(f"total {results['total_s']:.0f} s")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
