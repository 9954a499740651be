"""qtrain's CUDA kernels on a lent GPU: build, check and time in one call.

The device tool runs one command of at most ten minutes on a fresh machine, so
this script does everything in order and writes what it has after each stage:

1. build the op library with its CUDA kernels in place from scratch, every core compiling, and prove
   that an op that must raise does raise (``ext/cuda_build.py --in-place``, which
   rebuilds with the system compiler if the default one crashes on a raise);
2. check: ``pytest tests/ops`` (each op's CUDA kernel against its PyTorch reference,
   opcheck, its error paths on the device) and, where DGL imports, every ``dgl.nn``
   module of ``tests/route/test_modules.py`` on the CUDA route against DGL's CPU kernels.
   The GPU machine has no DGL: when ``import dgl`` fails there, DGL's CPU wheel and
   the packages it needs are installed first from ``.gpu/wheels`` (``pip install
   --no-index``; the log beside the report);
3. measure the device's memory bandwidth (a large device-to-device copy);
4. time every kernel against the baselines a GPU user would pick
   (``bench/gpu_tango.py``: quantize, INT8 GEMM, SpMM, SDDMM; ``bench/gpu_compress.py``:
   exact's and adaqp's per-row quantization, packing and projection; ``bench/packed.py``:
   tango's 4-bit packed kernels against their int8 forms on synthetic-arxiv GAT shapes);
5. train qtrain's built-in GCN, GAT and GraphSAGE end to end through the device
   route (``bench/gpu_e2e.py``: FP32, bf16 autocast, tango with stochastic and with
   nearest rounding, exact, tango + exact, beside PyG's GCNConv / GATConv / SAGEConv
   in FP32 and bf16; epoch time, peak GPU memory, test accuracy) on synthetic-arxiv
   (``--quick``), then synthetic-products;
   without DGL this stage fails with the reason;
6. time one relational layer per model (RGCN, RGAT, HGT; width 64, one head) on graphs
   shaped like Hector's datasets: DGL's layers and qtrain's RGAT with and without the
   ``hector`` plugin's options, and PyG's where installed (``bench/hector.py``'s ``run``;
   needs DGL too);

then prints the issue's bars with PASS / FAIL and writes
``bench/results/gpu-<device>-<date>.json`` (or ``--json``) with the exact
command, the device, torch and CUDA versions.

    python bench/gpu.py                 # everything, full sizes
    python bench/gpu.py --quick         # smaller sizes (a few minutes)
    python bench/gpu.py --skip-build    # the extension is already built

From a session with a lent GPU (the device tool; only ``$OUT`` comes back):

    make gpu-wheels                     # here, where pip can download: .gpu/wheels, ~11 MB
    run(carry=[".gpu"], command="timeout 540 python3 bench/gpu.py --quick --json $OUT/gpu.json")

``make gpu-check`` is ``python3 bench/gpu.py``, full sizes, which does not fit one
ten-minute call. Measured on an H200 (2026-11-26): ``--quick`` took 322 s in all
(build 61 s, tests 176 s, kernels 9 s, arxiv-scale end to end 60 s); at products
scale a 380 s call finished GCN's rows and none of GAT's (the graph takes 24 s to
generate, a GCN epoch 1.5 to 1.8 s; PyG runs out of memory). On an H100 the same day,
with the hector stage and the tests added since: build 77 s, tests 246 s (one xdist
process per file), and a 430 s limit ended the run inside the hector stage. A fresh
machine started in about 30 s. So, in a session with a lent GPU (15 minutes of device
time): ``timeout 540 python3 bench/gpu.py --quick --json $OUT/gpu.json`` in the first
call, then one call per model at products scale, each rebuilding if the machine went
back: ``python3 bench/gpu_e2e.py --size products --models gcn --json
$OUT/e2e-products-gcn.json`` (then ``gat``, ``sage``), as device time allows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.util
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401  (qtrain from this checkout)
from _gpu import copy_bandwidth_gbps
from _record import ROOT, git_commit, write_json

STAGES = ("gpu_tango", "gpu_compress", "packed", "gpu_e2e", "hector")
NEEDS_DGL = ("gpu_e2e", "hector")
# DGL for the end-to-end stage on a GPU machine without it: `make gpu-wheels` downloads the
# wheels (dgl's CPU build, what it declares, tomli-w); pip resolves the rest against what is
# installed. pandas and packaging are what dgl imports without declaring them; tomli-w is
# qtrain's own (the runner writes the resolved recipe with it), which the image lacks.
GPU_WHEELS = ROOT / ".gpu" / "wheels"
DGL_REQUIREMENTS = ("dgl==2.1.0", "pandas", "packaging", "tomli-w")
# the tests with CUDA cases: each op on the GPU against its reference, opcheck and its error
# paths, and the Python fronts' dispatch there (none needs DGL: "not dgl" leaves out the CPU
# comparisons with DGL's kernels) ...
TESTS = ("tests/ops", "-k", "not dgl")
# ... and, where DGL imports, every dgl.nn module on the CUDA route against DGL's CPU kernels
ROUTE_TESTS = ("tests/route/test_modules.py",)
# pytest-xdist, where installed (the GPU image has it): a lent machine's 16 cores run the
# tests in 8 processes of 2 threads each, test by test (one process per file took 246 s on
# an H100, 2026-11-26: the largest files set the pace), which leaves the device time to the
# benchmarks; each process holds its own CUDA context. The slowest tests are listed in the log.
XDIST = ("-n", "8", "--dist", "load", "--durations=25")
XDIST_THREADS = "2"


def build(log: Path) -> dict[str, Any]:
    """A clean in-place build whose error path is proven (ext/cuda_build.py --in-place)."""
    env = {**os.environ, "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 4))}
    cmd = [sys.executable, "ext/cuda_build.py", "--in-place"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    return {
        "command": shlex.join(cmd),
        "returncode": done.returncode,
        "seconds": round(time.perf_counter() - start, 1),
        "log": str(log),
        "summary": (done.stdout.strip().splitlines() or [""])[-1],
    }


def check(log: Path, with_dgl: bool) -> dict[str, Any]:
    """The CUDA tests, with pytest's summary line; the whole output goes to ``log``."""
    parallel = importlib.util.find_spec("xdist") is not None
    cmd = [
        *(sys.executable, "-m", "pytest", "-q", "-rs", *(XDIST if parallel else ())),
        *(ROUTE_TESTS if with_dgl else ()),
        *TESTS,
    ]
    env = {**os.environ, **({"OMP_NUM_THREADS": XDIST_THREADS} if parallel else {})}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    lines = done.stdout.strip().splitlines()
    return {
        "command": shlex.join(cmd),
        "log": str(log),
        "returncode": done.returncode,
        "seconds": round(time.perf_counter() - start, 1),
        "summary": lines[-1] if lines else "",
        "failures": [line for line in lines if line.startswith(("FAILED", "ERROR"))][:50],
    }


def _shown(path: Path) -> str:
    """``path`` as the report shows it: from the checkout's root when it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _dgl_imports() -> subprocess.CompletedProcess[str]:
    """``import dgl`` as qtrain makes it (``qtrain._compat``), and tomli-w, in a fresh
    interpreter: this process must not import DGL before it is there (qtrain's
    adaptations run once)."""
    code = "import tomli_w; from qtrain._compat import import_dgl; print(import_dgl().__version__)"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)


def ensure_dgl(log: Path) -> dict[str, Any]:
    """DGL for the end-to-end stage: there already, or installed from ``.gpu/wheels``.

    Returns what was done; an ``error`` key says why DGL is not importable.
    """
    found = _dgl_imports()
    if found.returncode == 0:
        return {"installed": False, "dgl": found.stdout.strip()}
    why = (found.stderr.strip().splitlines() or ["?"])[-1]
    if not GPU_WHEELS.is_dir():
        return {
            "error": f"import dgl fails ({why}) and {_shown(GPU_WHEELS)} does not "
            "exist: run `make gpu-wheels` where pip can download, and carry .gpu along"
        }
    cmd = [
        sys.executable,
        *("-m", "pip", "install", "--isolated", "--no-index", "--no-cache-dir"),
        *("--find-links", str(GPU_WHEELS), *DGL_REQUIREMENTS),
    ]
    print(f"dgl: not importable ({why}); {shlex.join(cmd)}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    log.write_text(f"$ {shlex.join(cmd)}\n{done.stdout}{done.stderr}")
    result: dict[str, Any] = {
        "installed": done.returncode == 0,
        "command": shlex.join(cmd),
        "returncode": done.returncode,
        "seconds": round(time.perf_counter() - start, 1),
        "log": str(log),
    }
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        result["error"] = f"pip install from {_shown(GPU_WHEELS)} failed: {last}"
        return result
    found = _dgl_imports()
    if found.returncode != 0:
        last = (found.stderr.strip().splitlines() or ["?"])[-1]
        result["error"] = f"import dgl still fails after the install: {last}"
        return result
    importlib.invalidate_caches()  # this process imports the new packages next
    result["dgl"] = found.stdout.strip()
    print(f"dgl: {result['dgl']} installed in {result['seconds']} s", flush=True)
    return result


def _print_row(row: dict[str, Any]) -> None:
    if row.get("ms") is None:
        print(f"{row['case']:48} {'-':>9}     {row.get('status', '')}", flush=True)
        return
    ratio = "" if row.get("ratio") is None else f"{row['ratio']:.2f}x vs {row['baseline']}"
    if row.get("ratio_vs_pyg_fp32") is not None:
        ratio += f", {row['ratio_vs_pyg_fp32']:.2f}x vs PyG FP32"
    frac = (
        "" if row.get("bw_fraction") is None else f"  {100 * row['bw_fraction']:.0f}% of bandwidth"
    )
    extra = ""
    if row.get("peak_memory_bytes") is not None:
        extra += f"  peak {row['peak_memory_bytes'] / 2**20:.0f} MiB"
    if row.get("test_acc") is not None:
        extra += f"  test acc {row['test_acc']:.3f}"
    spread = "" if row.get("iqr_ms") is None else f" ± {row['iqr_ms']:.3f}"
    print(f"{row['case']:48} {row['ms']:9.3f}{spread} ms  {ratio}{frac}{extra}", flush=True)


# (bar, kernel cases (name prefixes), baseline names (None: any), metric, at least)
BARS: tuple[tuple[str, tuple[str, ...], tuple[str, ...] | None, str, float], ...] = (
    (
        "INT8 GEMM, quantization included, vs bf16 torch.matmul (M >= 1M, K = N = 256)",
        ("quantized_gemm",),
        ("bf16 matmul",),
        "ratio",
        1.5,
    ),
    (
        "quantized SpMM vs FP32 torch.sparse / PyG",
        ("qspmm",),
        ("torch.sparse.mm csr fp32", "torch_sparse.matmul", "torch_geometric.utils.spmm"),
        "ratio",
        1.5,
    ),
    ("quantized SpMM, share of memory bandwidth", ("qspmm",), None, "bw_fraction", 0.5),
    ("quantized SDDMM vs FP32 gather expression", ("qsddmm",), None, "ratio", 1.5),
    ("quantized SDDMM, share of memory bandwidth", ("qsddmm",), None, "bw_fraction", 0.5),
    (
        "exact / adaqp compression kernels, share of memory bandwidth",
        ("quantize_rows", "dequantize_rows", "pack_bits", "unpack_bits", "masked_scale"),
        None,
        "bw_fraction",
        0.5,
    ),
)


def _big_gemm(row: dict[str, Any]) -> bool:
    match = re.search(r"M=(\d+)", str(row.get("shape", "")))
    return match is not None and int(match.group(1)) >= 2**20


def bars(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's speed bars, one verdict per (bar, measured case)."""
    out = []
    for bar, cases, baselines, metric, limit in BARS:
        seen = set()
        for row in rows:
            if not str(row.get("case", "")).startswith(cases):
                continue
            if baselines is not None and row.get("baseline") not in baselines:
                continue
            if cases == ("quantized_gemm",) and not _big_gemm(row):
                continue
            key = (
                row["case"],
                str(row.get("shape")),
                row.get("baseline") if metric == "ratio" else None,
            )
            value = row.get(metric)
            if key in seen or value is None:
                continue
            seen.add(key)
            out.append(
                {
                    "bar": bar,
                    "case": f"{row['case']} {row.get('shape')}"
                    + (f" vs {row.get('baseline')}" if metric == "ratio" else ""),
                    "value": value,
                    "limit": limit,
                    "pass": value >= limit,
                }
            )
    return out


def _device() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "capability": f"sm_{props.major}{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def main(argv: list[str] | None = None) -> int:
    # huge pages for torch's CPU allocator, as the qtrain command sets (qtrain.cli.main);
    # `import qtrain` no longer does. In time: torch reads it at its first allocation.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--skip-build", action="store_true", help="use the built extension")
    parser.add_argument("--json", type=Path, default=None, help="where to write the results")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            f"bench/gpu.py: no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda}); "
            "run it on a GPU machine",
            file=sys.stderr,
        )
        return 1
    device = _device()
    slug = re.sub(r"[^a-z0-9]+", "-", device["name"].lower()).strip("-")
    path = args.json or ROOT / "bench" / "results" / f"gpu-{slug}-{dt.date.today()}.json"
    record: dict[str, Any] = {
        "command": shlex.join(["python", "bench/gpu.py", *(argv or sys.argv[1:])]),
        "git_commit": git_commit(),
        "host": platform.node(),
        "device": device,
        "quick": args.quick,
        "stages": {},
        "rows": [],
    }
    if not args.skip_build:
        record["stages"]["build"] = build(path.with_suffix(".build.log"))
        write_json(path, record)
        if record["stages"]["build"]["returncode"] != 0:
            print(
                f"bench/gpu.py: build failed, see {path.with_suffix('.build.log')}", file=sys.stderr
            )
            return 1
    from qtrain.ops import backends
    from qtrain.plugin import import_builtin_plugins

    backends.refresh()
    if not backends.available("ext-cuda"):
        print(
            f"bench/gpu.py: the CUDA kernels are unavailable: {backends.error('ext-cuda')}",
            file=sys.stderr,
        )
        return 1
    record["ext_cuda"] = backends.status()["ext-cuda"]
    import_builtin_plugins()  # the benchmarks time the built-in plugins' autograd functions
    # DGL before the check: the route's CUDA tests and the end-to-end stage need it
    record["stages"]["dgl"] = ensure_dgl(path.with_suffix(".dgl.log"))
    with_dgl = "error" not in record["stages"]["dgl"]
    if not with_dgl:
        print(f"dgl: {record['stages']['dgl']['error']}", file=sys.stderr, flush=True)
    record["stages"]["check"] = check(path.with_suffix(".check.log"), with_dgl)
    print(f"check: {record['stages']['check']['summary']}", flush=True)
    record["bandwidth_gbps"] = copy_bandwidth_gbps()
    print(
        f"device {device['name']}: {record['bandwidth_gbps']:.0f} GB/s copy bandwidth", flush=True
    )
    write_json(path, record)
    failed = False
    for stage in STAGES:
        if stage in NEEDS_DGL and not with_dgl:
            failed = True
            record["stages"][stage] = {"error": record["stages"]["dgl"]["error"]}
            print(f"{stage}: FAILED {record['stages'][stage]['error']}", file=sys.stderr)
            write_json(path, record)
            continue
        start = time.perf_counter()
        try:
            rows = importlib.import_module(stage).run(args.quick)
        except Exception as exc:  # one stage failing must not lose the others' figures
            failed = True
            record["stages"][stage] = {
                "error": f"{type(exc).__name__}: {exc}",
                "trace": traceback.format_exc(),
            }
            print(f"{stage}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            rows = getattr(exc, "rows", None) or []  # what a stage measured before it failed
        else:
            record["stages"][stage] = {
                "seconds": round(time.perf_counter() - start, 1),
                "rows": len(rows),
            }
        for row in rows:
            row = {"stage": stage, **row}
            record["rows"].append(row)
            _print_row(row)
        write_json(path, record)
    record["bars"] = bars(record["rows"])
    write_json(path, record)
    print()
    for b in record["bars"]:
        print(
            f"{'PASS' if b['pass'] else 'FAIL'}  {b['bar']} ({b['case']}): {b['value']} (want >= {b['limit']})"
        )
    print(f"results: {path}")
    check_failed = record["stages"]["check"]["returncode"] != 0
    return 1 if failed or check_failed else 0


if __name__ == "__main__":
    sys.exit(main())
