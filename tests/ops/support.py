"""What every op test shares: the devices present, bitwise comparison, opcheck, and a
harness that runs an op's error cases in a child process, so that a crash fails the
test that caused it (naming the case) instead of killing the suite.

An op test is parametrized over :data:`DEVICES`: the CPU always, CUDA wherever a
GPU is present. The library must be built: a missing build fails (CI builds it),
it never skips.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from qtrain.ops import backends

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
WIDTHS = (1, 3, 5, 17, 33, 127, 129)
# segment lengths (rows per relation) every segment op is tested on
SEGMENT_EDGES = (
    [0, 0, 0],  # N = 0 with relations
    [],  # no relations, no rows
    [0, 5, 0, 7, 0],  # empty segments at the start, in the middle, at the end
    [0, 0, 12],
    [12, 0, 0],
    [40],  # one relation
    [1, 1, 1, 1],
)


def library(device: str = "cpu") -> Any:
    """``torch.ops.qtrain`` with ``device``'s kernels loaded; a missing build fails."""
    backend = "ext-cuda" if torch.device(device).type == "cuda" else "ext-cpu"
    assert backends.available(backend), backends.error(backend)
    return torch.ops.qtrain


def variants(device: str) -> Iterator[str]:
    """Loop once per kernel variant: on the CPU every ISA variant this CPU runs, with 1 and
    2 threads (the ISA and thread count in use are restored afterwards); on CUDA once."""
    if torch.device(device).type != "cpu":
        yield device
        return
    ext = backends.ext_cpu()
    isa, threads = ext.info()["isa"], torch.get_num_threads()
    try:
        for name in ext.info()["isa_supported"]:
            ext.set_isa(name)
            for n in (1, 2):
                torch.set_num_threads(n)
                yield f"{name}, {n} threads"
    finally:
        ext.set_isa(isa)
        torch.set_num_threads(threads)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of a float tensor (so -0.0 != 0.0), every NaN as one pattern.

    A NaN's sign and payload are the hardware's choice, not the kernel's: x86 keeps the
    input's quiet NaN through a product, an NVIDIA GPU returns its canonical 0x7fffffff
    (seen on an H100). Where the NaNs are is compared; which NaN is not."""
    views = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}
    if t.dtype not in views:
        return t
    return torch.where(t.isnan(), torch.full((), -1, dtype=views[t.dtype]), t.view(views[t.dtype]))


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """``got`` (any device) equals ``want`` bit for bit, dtype and shape included, where
    the NaNs are included (not their payloads, see :func:`bits_of`)."""
    got = got.cpu()
    want = want.cpu()
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    same = bits_of(got) == bits_of(want)
    assert bool(same.all()), f"{what}: {int((~same).sum())} of {got.numel()} elements differ"


def opcheck(op: Any, args: tuple[Any, ...]) -> None:
    """torch.library.opcheck of one call: schema, fake kernel, dispatch under AOT autograd."""
    result = torch.library.opcheck(op, args)
    assert all(v == "SUCCESS" for v in result.values()), result


@dataclass(frozen=True)
class ErrorCase:
    """``code`` must raise ``error`` (an exception class name) with a message matching ``match``.

    ``code`` runs in the child with ``torch``, ``ops`` (= torch.ops.qtrain), ``dev``
    (the device under test), ``other`` (a device that is not ``dev``: meta beside the
    CPU, the CPU beside CUDA) and what :func:`expect_errors`' ``setup`` defines.
    """

    name: str
    code: str
    error: str
    match: str


_CHILD = """
import json, re, sys
import torch
from qtrain.ops import backends
backend = "ext-cuda" if torch.device(sys.argv[1]).type == "cuda" else "ext-cpu"
assert backends.available(backend), backends.error(backend)
dev = torch.device(sys.argv[1])
other = torch.device("meta") if dev.type == "cpu" else torch.device("cpu")
setup = sys.argv[3]
results = {}
for name, code in json.loads(sys.argv[2]).items():
    print(f"case {name}", file=sys.stderr, flush=True)
    names = {"torch": torch, "ops": torch.ops.qtrain, "dev": dev, "other": other}
    exec(setup, names)  # outside the try: a setup that fails is the test's bug, not a case
    try:
        exec(code, names)
        results[name] = ["returned", ""]
    except Exception as exc:
        results[name] = [type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""]
print(json.dumps(results))
"""


def expect_errors(cases: list[ErrorCase], device: str, setup: str = "") -> None:
    """Run every case in one child process; each must raise its error, none may crash.

    ``setup`` (Python) runs before each case, in the case's own namespace: the tensors
    the cases share.
    """
    library(device)
    by_name = {case.name: textwrap.dedent(case.code) for case in cases}
    assert len(by_name) == len(cases), "case names must be unique"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, device, json.dumps(by_name), textwrap.dedent(setup)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        started = [line for line in done.stderr.splitlines() if line.startswith("case ")]
        last = started[-1][5:] if started else "(before the first case)"
        pytest.fail(
            f"the child died with status {done.returncode} in case {last!r}: "
            f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'no output'}"
        )
    results = json.loads(done.stdout.strip().splitlines()[-1])
    wrong = []
    for case in cases:
        kind, message = results[case.name]
        if kind != case.error or not re.search(case.match, message):
            wrong.append(f"{case.name}: want {case.error} /{case.match}/, got {kind}: {message}")
    assert not wrong, "\n".join(wrong)
