"""The ``qtrain`` command: run, profile, calibrate, datasets, models, plugins, doctor.

Results go to standard output (a short report, or with ``--json`` one JSON
object on the last line); progress and logs go to standard error. Bad input
ends with one line on standard error and exit status 2; ``--debug`` shows
the traceback instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import MISSING
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from qtrain import __version__, signals
from qtrain._malloc import set_up_allocator
from qtrain.config import OptionInfo
from qtrain.errors import QtrainError, RunFailed

app = typer.Typer(
    help="Quantized GNN training for DGL, driven by a TOML recipe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
DEFAULT_RECIPE = Path("qtrain.toml")

T = TypeVar("T")

# the options every recipe command takes, declared once
RecipeArg = Annotated[
    Path | None,
    typer.Argument(help="Recipe file (default: ./qtrain.toml).", show_default=False),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a recipe key, e.g. --set train.epochs=5 (repeatable)."),
]
JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print the result as one JSON object on the last line.")
]
DebugFlag = Annotated[
    bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")
]


class _State:
    debug = os.environ.get("QTRAIN_DEBUG", "") not in ("", "0")


def _fail(message: str, code: int) -> NoReturn:
    err.print(f"qtrain: error: {message}", markup=False, highlight=False)
    raise typer.Exit(code)


def guarded(action: Callable[[], T], debug: bool = False) -> T:
    """Run ``action``, turning errors into one line and an exit status."""
    if debug or _State.debug:
        return action()
    try:
        return action()
    except QtrainError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except RunFailed as exc:
        _fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt as exc:
        where = getattr(exc, "run_dir", None)
        err.print(
            "qtrain: interrupted" + (f"; {where} keeps the metrics so far" if where else ""),
            markup=False,
            highlight=False,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:
        where = getattr(exc, "run_dir", None)
        suffix = f"; {where} keeps what was measured" if where else ""
        _fail(f"{type(exc).__name__}: {exc}{suffix} (--debug shows the traceback)", EXIT_FAILED)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"qtrain {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    debug: DebugFlag = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=_print_version,
            is_eager=True,  # before typer asks for a command
        ),
    ] = False,
) -> None:
    if debug:
        _State.debug = True


def _load_recipe(recipe: Path | None, overrides: list[str] | None, command: str) -> Any:
    """The recipe a command names (./qtrain.toml when it names none), with ``--set``."""
    from qtrain.recipe import load_recipe

    if recipe is None and not DEFAULT_RECIPE.exists():
        raise QtrainError(
            "no recipe given and ./qtrain.toml does not exist; "
            f"run `qtrain {command} path/to/recipe.toml` (see examples/)"
        )
    return load_recipe(recipe if recipe is not None else DEFAULT_RECIPE, overrides or [])


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


@app.command()
def run(
    recipe: RecipeArg = None,
    set_: SetOption = None,
    as_json: JsonFlag = False,
    debug: DebugFlag = False,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="Continue the run in this run directory from its resume.pt "
            "(extend a finished one with --set train.epochs=N).",
            file_okay=False,
        ),
    ] = None,
) -> None:
    """Train the model a recipe names, with the plugins it names."""

    def action() -> dict[str, Any]:
        from qtrain._io import stdout_to_stderr
        from qtrain.runner import execute

        if resume is not None:
            from qtrain.train.resume import recipe_of

            if recipe is not None:
                raise QtrainError(
                    f"--resume {resume} runs the recipe recorded there; give no recipe file"
                )
            loaded = recipe_of(resume, set_ or [])
        else:
            loaded = _load_recipe(recipe, set_, "run")
        try:
            with stdout_to_stderr():
                return execute(loaded, resume_from=resume)
        except BaseException as exc:
            if as_json:  # the last line is the summary, however the run ended
                _print_written_summary(getattr(exc, "run_dir", None))
            raise

    summary = guarded(action, debug)
    if summary.get("distributed") and os.environ.get("RANK", "0") != "0":
        return  # a worker under torchrun: rank 0 reports the run
    if as_json:
        _print_json(summary)
        return
    metric = summary.get("metric", "accuracy")

    def shown(value: float | None) -> str:  # a split without nodes has no number
        return "none" if value is None else f"{value:.4f}"

    out.print(
        f"test {metric} {shown(summary['test_acc'])}  val {shown(summary['val_acc'])}  "
        f"best epoch {summary['best_epoch']}/{summary['epochs']}  "
        f"{summary['epoch_time_s'] * 1000:.1f} ms/epoch (median)",
        highlight=False,
    )
    out.print(f"run directory: {summary['run_dir']}", highlight=False)


def _print_written_summary(run_dir: str | None) -> None:
    """Print the summary.json a run that did not complete left, if it left one."""
    if run_dir is None:
        return
    with contextlib.suppress(OSError, ValueError):
        _print_json(json.loads((Path(run_dir) / "summary.json").read_text()))


@app.command()
def profile(
    recipe: RecipeArg = None,
    epochs: Annotated[
        int, typer.Option("--epochs", help="Epochs profiled, after the warm-up.")
    ] = 3,
    warmup: Annotated[
        int, typer.Option("--warmup", help="Epochs trained before profiling (not profiled).")
    ] = 2,
    compare: Annotated[
        str | None,
        typer.Option(
            "--compare",
            help="Also profile the recipe without plugins, 'fp32' or 'bf16' (autocast), "
            "in this process, and add speedup columns.",
            show_default=False,
        ),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace", help="Write a Chrome trace (torch.profiler) of the profiled epochs here."
        ),
    ] = None,
    set_: SetOption = None,
    as_json: JsonFlag = False,
    debug: DebugFlag = False,
) -> None:
    """Show where an epoch's time goes, primitive by primitive (torch.profiler)."""

    def action() -> Any:
        from qtrain._io import stdout_to_stderr
        from qtrain.profiling import check_options, profile_run

        check_options(epochs, warmup, compare)
        loaded = _load_recipe(recipe, set_, "profile")
        with stdout_to_stderr():
            return profile_run(loaded, epochs=epochs, warmup=warmup, compare=compare, trace=trace)

    done = guarded(action, debug)
    if as_json:
        _print_json(done.result)
    else:
        from qtrain.profiling.report import footer, table

        out.print(table(done.profile, done.baseline, done.compare))
        for line in footer(done.profile, done.baseline, done.compare):
            out.print(line, highlight=False)
        out.print(f"run directory: {done.run_dir} (profile.json, profile.png)", highlight=False)
    if done.compare_error is not None:
        _fail(
            f"--compare {done.compare}: the baseline failed ({done.compare_error}); "
            f"the profile without it is in {done.run_dir}",
            EXIT_FAILED,
        )


@app.command(name="compare")
def compare_command(
    recipe: RecipeArg = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            help="Plugins to compare with FP32, joined by '+' (e.g. tango, exact, tango+exact); "
            "repeatable. Default: the recipe's plugins, or tango.",
        ),
    ] = None,
    seeds: Annotated[
        int, typer.Option("--seeds", help="Seeds per variant (train.seed, +1, ...).")
    ] = 3,
    repeats: Annotated[
        int, typer.Option("--repeats", help="Rounds over every seed and variant.")
    ] = 1,
    set_: SetOption = None,
    as_json: JsonFlag = False,
    debug: DebugFlag = False,
) -> None:
    """Train FP32 and quantization policies on one recipe, interleaved, and compare them."""

    def action() -> tuple[Path, dict[str, Any]]:
        from qtrain.compare import compare

        loaded = _load_recipe(recipe, set_, "compare")
        return compare(
            loaded,
            policy or [],
            seeds=seeds,
            repeats=repeats,
            progress=lambda line: err.print(f"qtrain compare: {line}", highlight=False),
        )

    out_dir, report = guarded(action, debug)
    if as_json:
        _print_json(report)
        return
    from rich.table import Table

    from qtrain.compare.report import table_rows

    rows = table_rows(report, compact=True)
    shown = Table(title=f"{report['recipe']}: {report['model']} on {report['dataset']}")
    for name in rows[0]:
        shown.add_column(name)
    for row in rows[1:]:
        shown.add_row(*row)
    out.print(shown)
    out.print(f"ratios: {report['ratios']}", highlight=False)
    out.print(f"written: {out_dir} (compare.json, compare.md, compare.png)", highlight=False)
    if any(row["completed"] < row["runs"] for row in report["rows"]):
        _fail(f"some runs did not complete; see {out_dir / 'compare.md'}", EXIT_FAILED)


@app.command()
def calibrate(
    recipe: RecipeArg = None,
    target: Annotated[
        float | None,
        typer.Option(
            "--target",
            help="target of the measure the plugin picks by (default: the plugin's own, e.g. "
            "tango's gradient_target or error_x_target, by its criterion).",
            show_default=False,
        ),
    ] = None,
    set_: SetOption = None,
    as_json: JsonFlag = False,
    debug: DebugFlag = False,
) -> None:
    """Pick a bit count before training: the recipe's calibrating plugin measures each
    candidate (tango, at 2..8 bits: Error_X of the first GNN layer's output and the
    error of one training step's gradients)."""

    def action() -> Any:
        from qtrain._io import stdout_to_stderr
        from qtrain.runner import calibrate_recipe

        if target is not None and not target > 0:
            raise QtrainError(f"--target must be a number > 0, got {target}")
        loaded = _load_recipe(recipe, set_, "calibrate")
        with stdout_to_stderr():
            return calibrate_recipe(loaded, target)

    result = guarded(action, debug)
    if as_json:
        _print_json(result.to_json())
        return
    by_gradient = result.criterion == "gradient"
    measure = "gradient error" if by_gradient else "Error_X"
    title = f"Error_X of the first GNN layer's output {tuple(result.shape)}"
    if result.gradient_error:
        title += ", gradient error of one step"
    table = Table(title=title)
    table.add_column("bits", justify="right")
    table.add_column("Error_X", justify="right")
    if result.gradient_error:
        table.add_column("gradient error", justify="right")
    table.add_column("")
    chosen_on = result.gradient_error if by_gradient else result.error_x
    for bits, value in sorted(result.error_x.items()):
        row = [str(bits), f"{value:.4f}"]
        if result.gradient_error:
            row.append(f"{result.gradient_error[bits]:.4f}")
        mark = (
            "chosen"
            if bits == result.bits
            else ("<= target" if chosen_on[bits] <= result.target else "")
        )
        table.add_row(*row, mark)
    out.print(table)
    if result.met:
        out.print(
            f"bits = {result.bits}: the smallest count with {measure} <= {result.target}",
            highlight=False,
        )
    else:
        out.print(
            f"bits = 8: no count reaches {measure} <= {result.target} "
            f"(8 bits gives {chosen_on[8]:.4f})",
            highlight=False,
        )


def _format_default(value: Any) -> str:
    if value is MISSING:
        return "(required)"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _options_text(options: list[OptionInfo]) -> str:
    if not options:
        return "(none)"
    return "\n".join(f"{o.name}: {o.type} = {_format_default(o.default)}" for o in options)


def _listing(kind: str, entries: list[Any], as_json: bool) -> None:
    if as_json:
        _print_json(
            [
                {
                    "name": e.name,
                    "summary": e.summary,
                    "options": [
                        {
                            "name": o.name,
                            "type": o.type,
                            "default": _format_default(o.default),
                            "help": o.help,
                        }
                        for o in e.describe()
                    ],
                }
                for e in entries
            ]
        )
        return
    table = Table(title=f"registered {kind}", show_lines=True)
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("what it is")
    table.add_column("options (key: type = default)")
    for e in entries:
        table.add_row(e.name, e.summary, _options_text(e.describe()))
    out.print(table)


@app.command()
def datasets(as_json: JsonFlag = False) -> None:
    """List the registered datasets and their options."""
    from qtrain.data import DATASETS

    guarded(lambda: _listing("datasets", list(DATASETS), as_json))


@app.command()
def models(as_json: JsonFlag = False) -> None:
    """List the registered models and their options."""
    from qtrain.models import MODELS

    guarded(lambda: _listing("models", list(MODELS), as_json))


@app.command()
def plugins(as_json: JsonFlag = False) -> None:
    """List the registered plugins and their options."""
    from qtrain.plugin import PLUGINS, discovery_errors

    guarded(lambda: _listing("plugins", list(PLUGINS), as_json))
    for problem in discovery_errors:
        err.print(f"qtrain: warning: plugin not loaded: {problem}", markup=False, highlight=False)


def _doctor_report() -> dict[str, Any]:
    """Versions, adaptations, extension builds and devices, as one dict."""
    import torch

    from qtrain import _compat
    from qtrain.data.base import data_dir
    from qtrain.ops.backends import check_error_path, library_problems, op_kernels
    from qtrain.ops.backends import status as backend_status

    report: dict[str, Any] = {
        "qtrain": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    try:
        dgl = _compat.import_dgl()
        report["dgl"] = dgl.__version__
    except Exception as exc:  # doctor reports, it does not crash
        report["dgl"] = None
        report["dgl_error"] = f"{type(exc).__name__}: {exc}"
    report["compat"] = _compat.applied()
    report["dgl_import_hook"] = _import_hook_state()
    report["graph_primitives"] = (
        "DGL's kernels on the CPU; qtrain's device route on any other device "
        "(train.graph_kernels = 'auto'; DGL's CPU build cannot run them on a GPU)"
    )
    report["extensions"] = backend_status()
    for name, info in report["extensions"].items():
        if info.get("built"):  # an op that must raise does raise (in a child: it may crash)
            info["error_path"] = check_error_path(name) or "ok"
    report["ops"] = op_kernels()
    report["op_problems"] = library_problems()
    devices = [f"cpu ({torch.get_num_threads()} threads)"]
    if torch.cuda.is_available():
        devices += [
            f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())
        ]
    report["devices"] = devices
    report["data_dir"] = str(data_dir())
    from qtrain.plugin import PLUGINS, discovery_errors

    report["plugins"] = PLUGINS.names()
    report["plugin_errors"] = list(discovery_errors)
    return report


def _import_hook_state() -> str:
    """Whether a plain ``import dgl`` gets qtrain's adaptations (qtrain_dgl_hook.pth)."""
    import importlib.util

    if os.environ.get("QTRAIN_NO_DGL_HOOK", "") not in ("", "0"):
        return "off (QTRAIN_NO_DGL_HOOK is set)"
    if "qtrain_dgl_hook" in sys.modules:
        return "installed: a plain `import dgl` is adapted"
    if importlib.util.find_spec("qtrain_dgl_hook") is None:
        return "missing: reinstall qtrain (pip install -e .)"
    return "not run at start-up: qtrain_dgl_hook.pth is not in site-packages; reinstall qtrain"


@app.command()
def doctor(
    as_json: JsonFlag = False,
) -> None:
    """Report versions, DGL adaptations, the compiled extension and devices."""
    report = guarded(_doctor_report)
    extensions = report["extensions"]
    healthy = (
        report["dgl"] is not None
        and extensions.get("ext-cpu", {}).get("built", False)
        and all(info.get("error_path", "ok") == "ok" for info in extensions.values())
        and not report["op_problems"]
    )
    if as_json:
        _print_json({**report, "healthy": healthy})
        raise typer.Exit(0 if healthy else EXIT_FAILED)
    table = Table(title="qtrain doctor", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("found")
    for key in ("qtrain", "python", "platform", "torch", "torch_cuda"):
        table.add_row(key, str(report[key]))
    table.add_row("dgl", report["dgl"] or f"[red]not importable[/red]: {report.get('dgl_error')}")
    table.add_row("compat", "\n".join(report["compat"]) or "(none needed)")
    table.add_row("import dgl", report["dgl_import_hook"])
    table.add_row("graph primitives", report["graph_primitives"])
    for name, info in report["extensions"].items():
        if info.get("built") and info.get("error_path") != "ok":
            table.add_row(name, f"[red]unsafe build[/red]: {info['error_path']}")
        elif info.get("built"):
            detail = ", ".join(
                f"{k}={v}" for k, v in info.items() if k not in ("built", "error") and v is not None
            )
            table.add_row(name, f"[green]built[/green] {detail}")
        else:
            table.add_row(name, f"[yellow]{info.get('error')}[/yellow]")
    if report["ops"]:
        kernels = ", ".join(f"{name} ({'/'.join(parts)})" for name, parts in report["ops"].items())
        table.add_row("ops", f"torch.ops.qtrain: {kernels}")
    for problem in report["op_problems"]:
        table.add_row("[red]op library[/red]", problem)
    table.add_row("devices", "\n".join(report["devices"]))
    table.add_row("data dir", report["data_dir"])
    table.add_row("plugins", ", ".join(report["plugins"]) or "(none)")
    for problem in report["plugin_errors"]:
        table.add_row("[red]plugin error[/red]", problem)
    out.print(table)
    if not healthy:
        raise typer.Exit(EXIT_FAILED)


def main() -> None:
    """Console-script entry point."""
    # huge pages for torch's allocator and freed memory kept, set here, where qtrain owns
    # the process, not on `import qtrain`: a library import must not change a user's
    # allocator (qtrain._malloc). Before anything imports torch: it reads them in time.
    set_up_allocator()
    signals.install()  # SIGTERM stops a run as Ctrl-C does (qtrain.signals)
    app()


if __name__ == "__main__":
    main()
