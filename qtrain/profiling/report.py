"""``qtrain profile``'s outputs: the rich table, the JSON object and the PNG bar chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from qtrain.profiling.session import Profile

MIB = 1024 * 1024


def speedups(profile: Profile, baseline: Profile) -> dict[str, float | None]:
    """Baseline ms / profiled ms per primitive (all backends together) and for the epoch."""
    mine, theirs = profile.by_name(), baseline.by_name()
    out: dict[str, float | None] = {
        name: (theirs[name] / ms if ms > 0 and name in theirs else None)
        for name, ms in mine.items()
    }
    out["epoch"] = baseline.epoch_ms / profile.epoch_ms if profile.epoch_ms else None
    return out


def epoch_spread(profile: Profile, baseline: Profile) -> dict[str, Any]:
    """The epoch speedup from the epochs' wall times: the ratio of the medians, and the
    range it can take over the profiled epochs (baseline's fastest over this slowest, and
    the other way round). One run each: a range that straddles 1 is no speedup."""
    return {
        "median": baseline.epoch_ms_median / profile.epoch_ms_median,
        "min": baseline.epoch_ms_min / profile.epoch_ms_max,
        "max": baseline.epoch_ms_max / profile.epoch_ms_min,
        "epochs": [profile.epochs, baseline.epochs],
    }


def plugin_facts(profile: Profile) -> dict[str, Any]:
    """Cache hits / misses, activation bytes and message bytes, where the run produced them."""
    facts: dict[str, Any] = {}
    if profile.activation_bytes is not None:
        facts["activation_bytes"] = profile.activation_bytes
    if profile.input_copy_bytes:
        facts["input_copy_bytes"] = profile.input_copy_bytes
    for name, report in profile.plugin_reports.items():
        if not isinstance(report, dict):
            continue
        cache = report.get("cache")
        if isinstance(cache, dict):
            facts[f"{name}_cache"] = cache
        for key in ("compressed_bytes_out", "comm_bytes_per_epoch"):
            if report.get(key) is not None:
                facts[f"{name}_{key}"] = report[key]
    return facts


def to_json(
    profile: Profile, baseline: Profile | None, compare: str | None, **extra: Any
) -> dict[str, Any]:
    """The ``--json`` object: ``primitives`` rows and ``epoch_ms``, plus the comparison."""
    out: dict[str, Any] = {
        "epoch_ms": profile.epoch_ms,
        "epoch_ms_median": profile.epoch_ms_median,
        "unprofiled_epoch_ms": profile.unprofiled_epoch_ms,
        "epochs": profile.epochs,
        "primitives": [r.to_json() for r in profile.rows],
        "traced_share": profile.traced_share,
        "untraced_ms": profile.untraced_ms,
        "other_ops": [{"name": n, "total_ms": ms} for n, ms in profile.other_ops],
        "kernels": profile.kernels,
        **plugin_facts(profile),
    }
    if baseline is not None:
        out["compare"] = {
            "baseline": compare,
            "epoch_ms": baseline.epoch_ms,
            "primitives": [r.to_json() for r in baseline.rows],
            "speedup": speedups(profile, baseline),
            "epoch_speedup_spread": epoch_spread(profile, baseline),
        }
    out.update(extra)
    return out


def _ms(value: float) -> str:
    return f"{value:,.1f}" if value >= 0.1 else f"{value:.3f}"


def table(profile: Profile, baseline: Profile | None, compare: str | None) -> Table:
    """Time per primitive and epoch, with the speedup over ``compare`` when given."""
    title = f"ms per epoch by primitive (mean of {profile.epochs} profiled epochs)"
    t = Table(title=title, caption="ms/call: median; quant: share of the call spent quantizing")
    for col, justify in (
        ("primitive", "left"),
        ("backend", "left"),
        ("calls", "right"),
        ("ms", "right"),
        ("ms/call", "right"),
        ("share", "right"),
        ("quant", "right"),
    ):
        t.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    ratio = speedups(profile, baseline) if baseline is not None else {}
    if baseline is not None:
        t.add_column(f"vs {compare}", justify="right", no_wrap=True)
    shown: set[str] = set()
    for r in profile.rows:
        cells = [
            r.name,
            r.backend,
            f"{r.calls:g}",
            _ms(r.total_ms),
            _ms(r.median_ms),
            f"{r.share:.1%}",
            "" if r.quantizing_share is None else f"{r.quantizing_share:.0%}",
        ]
        if baseline is not None:
            s = ratio.get(r.name)
            cells.append("" if r.name in shown or s is None else f"{s:.2f}x")
            shown.add(r.name)
        t.add_row(*cells)
    cells = ["untraced", "python", "", _ms(profile.untraced_ms), "", "", ""]
    cells[5] = f"{profile.untraced_ms / profile.epoch_ms:.1%}" if profile.epoch_ms else ""
    if baseline is not None:
        cells.append("")
    t.add_row(*cells, style="dim")
    cells = ["epoch", "", "", _ms(profile.epoch_ms), "", "100.0%", ""]
    if baseline is not None:
        s = ratio.get("epoch")
        cells.append("" if s is None else f"{s:.2f}x")
    t.add_row(*cells, style="bold")
    return t


def footer(profile: Profile, baseline: Profile | None, compare: str | None) -> list[str]:
    """The lines under the table: traced share, overhead, plugin facts, baseline epoch."""
    lines = [
        f"traced: {profile.traced_share:.1%} of the epoch; "
        f"{profile.epoch_ms:,.1f} ms/epoch profiled"
        + (
            f", {profile.unprofiled_epoch_ms:,.1f} ms unprofiled (warm-up)"
            if profile.unprofiled_epoch_ms is not None
            else ""
        )
    ]
    if profile.other_ops:
        ops = ", ".join(f"{name} {ms:,.1f}" for name, ms in profile.other_ops)
        lines.append(f"other, largest (ms/epoch): {ops}")
    for key, value in plugin_facts(profile).items():
        if key.endswith("bytes") or key.endswith("bytes_out") or key.endswith("per_epoch"):
            lines.append(f"{key}: {value / MIB:,.1f} MiB")
        else:
            lines.append(f"{key}: {value}")
    lines.append(
        f"epoch wall time: median {profile.epoch_ms_median:,.1f} ms "
        f"({profile.epoch_ms_min:,.1f}-{profile.epoch_ms_max:,.1f}) over {profile.epochs} epochs"
    )
    if baseline is not None:
        spread = epoch_spread(profile, baseline)
        lines.append(
            f"baseline {compare}: {baseline.epoch_ms:,.1f} ms/epoch "
            f"(traced {baseline.traced_share:.1%}); wall median {baseline.epoch_ms_median:,.1f} ms "
            f"({baseline.epoch_ms_min:,.1f}-{baseline.epoch_ms_max:,.1f})"
        )
        verdict = (
            "no clear difference: the range straddles 1"
            if spread["min"] <= 1 <= spread["max"]
            else ("faster" if spread["min"] > 1 else "slower")
        )
        lines.append(
            f"epoch speedup vs {compare}: {spread['median']:.2f}x (range {spread['min']:.2f}-"
            f"{spread['max']:.2f}x over the profiled epochs; {verdict}; for repeated runs with "
            "seeds use qtrain compare)"
        )
    return lines


def write_chart(
    path: Path, profile: Profile, baseline: Profile | None, compare: str | None
) -> Path:
    """A horizontal bar chart of ms per primitive (next to the baseline's) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = profile.by_name()
    mine["untraced"] = profile.untraced_ms
    theirs = baseline.by_name() if baseline is not None else {}
    if baseline is not None:
        theirs["untraced"] = baseline.untraced_ms
    names = list(dict.fromkeys([*mine, *theirs]))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
    ys = list(range(len(names)))
    height = 0.4 if baseline is not None else 0.7
    ax.barh(
        [y - (height / 2 if baseline is not None else 0) for y in ys],
        [mine.get(n, 0.0) for n in names],
        height=height,
        label=f"profiled ({profile.epoch_ms:,.0f} ms/epoch)",
    )
    if baseline is not None:
        ax.barh(
            [y + height / 2 for y in ys],
            [theirs.get(n, 0.0) for n in names],
            height=height,
            label=f"{compare} ({baseline.epoch_ms:,.0f} ms/epoch)",
        )
    ax.set_yticks(ys, names)
    ax.invert_yaxis()
    ax.set_xlabel("ms per epoch")
    ax.set_title(f"time by primitive, {profile.label}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
