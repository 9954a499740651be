"""Starting the workers of a distributed run, and being one.

``qtrain run`` with ``[distributed] world_size > 1`` starts ``world_size``
copies of itself on this machine (``python -m qtrain run <resolved recipe>``
with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, as
torchrun sets them), waits, and returns rank 0's summary. A process started
with those variables (by this launcher or by ``torchrun`` across machines) is
a worker: it joins the process group, partitions the graph like every other
worker, and trains its part; rank 0 writes the run directory.

If a worker exits with an error or is killed, the launcher stops the others
(SIGTERM, then SIGKILL after a grace period) and fails with one line naming
the rank and quoting that worker's own error; workers die with the launcher
(Linux parent-death signal), so none is left behind; a worker whose peer
vanished fails on its own after ``timeout_s``. Rank 0's progress goes to
standard error (its error line, if any, only into the launcher's message);
every worker's output also goes to ``worker-<rank>.log`` in the run directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from qtrain import signals
from qtrain._malloc import keep_freed_memory
from qtrain.errors import QtrainError, RecipeError, RunFailed
from qtrain.recipe import Recipe, resolve_toml
from qtrain.train.progress import Reporter
from qtrain.train.rundir import RunDir, create_run_dir

ENV_RUN_DIR = "QTRAIN_RUN_DIR"  # the launcher's run directory, for rank 0
GRACE_S = 10.0  # between SIGTERM and SIGKILL when stopping workers
ERROR_PREFIX = "qtrain: error: "
EXIT_BAD_INPUT = 2  # a worker refused its input (the CLI's status for QtrainError)


def in_worker() -> bool:
    """Whether this process was started as a worker (torchrun's variables are set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


class DiscardRunDir(RunDir):
    """A worker other than rank 0: the run directory is rank 0's to write."""

    def write_recipe(self, text: str) -> None:
        pass

    def append_metrics(self, record: dict[str, Any]) -> None:
        pass

    def write_summary(self, summary: dict[str, Any]) -> None:
        pass

    def write_checkpoint(self, state: dict[str, Any]) -> None:
        pass

    def write_curves(self, title: str) -> dict[str, str]:
        return {}

    def write_resume(self, state: dict[str, Any]) -> None:
        pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every worker still running, then SIGKILL what outlives the grace period."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the launcher dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _forward(stream: Any, log: Any) -> None:
    """Rank 0's stderr: progress to ours, everything to its log, its error line only there."""
    for raw in iter(stream.readline, b""):
        log.write(raw)
        log.flush()
        if not raw.startswith(ERROR_PREFIX.encode()):
            sys.stderr.buffer.write(raw)
            sys.stderr.flush()


def _error_line(log: Path) -> str | None:
    """The last ``qtrain: error:`` line a worker wrote, without the prefix."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [line[len(ERROR_PREFIX) :] for line in lines if line.startswith(ERROR_PREFIX)]
    return found[-1] if found else None


def check_launchable(recipe: Recipe) -> None:
    """Refuse, before any worker starts, what every worker would refuse."""
    from qtrain.models import MODELS

    if recipe.train.mode != "full":
        raise RecipeError(
            f"train.mode = {recipe.train.mode!r}: distributed training is full-graph; use 'full'"
        )
    entry = MODELS.get(recipe.model.name)
    if not getattr(entry.factory, "supports_minibatch", True):
        raise RecipeError(
            f"model {recipe.model.name!r} does not run on blocks, so it cannot train "
            "distributed; use gcn, sage or gat"
        )
    backend, device = recipe.distributed.backend, recipe.train.device
    if backend == "gloo" and device not in ("cpu", "auto"):
        raise RecipeError(
            f"train.device = {device!r} with distributed.backend = 'gloo': gloo workers "
            "train on the CPU; use backend = 'nccl' for GPUs (one per worker) or device 'cpu'"
        )
    if backend == "nccl" and device not in ("cuda", "auto"):
        raise RecipeError(
            f"train.device = {device!r} with distributed.backend = 'nccl': each nccl worker "
            "trains on the GPU of its local rank (cuda:LOCAL_RANK); use device 'cuda' or 'auto'"
        )


def worker_device(recipe: Recipe) -> torch.device:
    """The device this worker trains on: the CPU under gloo; under nccl the GPU of its
    local rank (``LOCAL_RANK``, which this launcher and torchrun set), made current so
    that nccl's object collectives and streams use it."""
    if recipe.distributed.backend != "nccl":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    count = torch.cuda.device_count()
    if local >= count:
        raise RecipeError(
            f"distributed.backend = 'nccl': worker with LOCAL_RANK {local} needs GPU "
            f"cuda:{local}, but torch sees {count} CUDA device(s) on this machine; start at "
            "most one worker per GPU (torchrun --nproc-per-node)"
        )
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    return device


WORKERS_PER_CORE = 4  # workers on one machine share its cores; beyond this they only wait
WORKER_MEMORY = 512 * 2**20  # what a worker costs before its share of the graph (measured)


def check_local_capacity(world: int) -> None:
    """Refuse to start more workers on this machine than its cores and memory can hold
    (64 workers on 2 cores once ran the machine out of memory); torchrun across machines
    starts its own workers and is not limited here."""
    cores = os.cpu_count() or 1
    limit = WORKERS_PER_CORE * cores
    available = _available_memory()
    if available is not None:
        limit = min(limit, max(1, available // WORKER_MEMORY))
    if world > limit:
        raise RecipeError(
            f"distributed.world_size = {world}: this machine ({cores} cores, "
            f"{'unknown' if available is None else f'{available / 2**30:.1f} GiB'} available "
            f"memory) can hold at most {limit} workers; use fewer, or torchrun across machines"
        )


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, or None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def close_summary(path: Path, status: str, why: str) -> None:
    """Give a summary rank 0 left "running" its real ending. Rank 0 writes it itself when
    it can; it cannot when it was killed, or stopped inside a collective whose peer had
    already gone (a signal waits until the C call returns). metrics.jsonl and the last
    periodic checkpoint hold what it had finished."""
    import json

    file = path / "summary.json"
    try:
        summary = json.loads(file.read_text())
    except (OSError, ValueError):
        summary = {"run_dir": str(path)}
    if summary.get("status") not in (None, "running"):
        return
    summary["status"] = status
    summary["error"] = f"{why}; rank 0 was stopped before it wrote its summary"
    with contextlib.suppress(OSError):
        RunDir(path).write_summary(summary)


def launch(recipe: Recipe) -> dict[str, Any]:
    """Start ``world_size`` workers here, wait for them, and return rank 0's summary."""
    import json

    check_launchable(recipe)
    world = recipe.distributed.world_size
    check_local_capacity(world)
    if recipe.distributed.backend == "nccl" and world > torch.cuda.device_count():
        raise RecipeError(
            f"distributed.world_size = {world} with backend = 'nccl' needs {world} GPUs on "
            f"this machine (one per worker), but torch sees {torch.cuda.device_count()}; "
            "use fewer workers, or torchrun across machines"
        )
    path = create_run_dir(recipe.output.dir, recipe.name)
    run = RunDir(path)
    run.write_recipe(resolve_toml(recipe))
    threads = recipe.train.threads or max(1, (os.cpu_count() or 1) // world)
    base = {
        **os.environ,
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": str(threads),
        ENV_RUN_DIR: str(path),
    }
    logs = [open(path / f"worker-{rank}.log", "wb") for rank in range(world)]  # noqa: SIM115
    procs: list[subprocess.Popen[bytes]] = []
    forwarder: threading.Thread | None = None
    try:
        for rank in range(world):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "qtrain", "run", str(path / "recipe.toml")],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE if rank == 0 else logs[rank],
                    preexec_fn=_die_with_parent,  # runs before exec; sets no locks
                )
            )
            if rank == 0:
                forwarder = threading.Thread(
                    target=_forward, args=(procs[0].stderr, logs[0]), daemon=True
                )
                forwarder.start()
        while True:
            signals.raise_if_stopped()  # an interrupt Python dropped in a finalizer
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                _stop(procs)
                if forwarder is not None:
                    forwarder.join(timeout=GRACE_S)
                for log in logs:
                    log.flush()
                said = _error_line(path / f"worker-{rank}.log")
                message = (
                    f"worker rank {rank} {_how(code)}"
                    + (f": {said}" if said else f" (see {path / f'worker-{rank}.log'})")
                    + f"; the other workers were stopped and {path} keeps what rank 0 wrote"
                )
                close_summary(path, "failed", message)
                raise (QtrainError if code == EXIT_BAD_INPUT else RunFailed)(message)
            if all(c == 0 for c in codes):
                break
            time.sleep(0.2)
    except BaseException as exc:
        _stop(procs)
        if isinstance(exc, KeyboardInterrupt):
            close_summary(path, "interrupted", "stopped by a signal")
        raise
    finally:
        if forwarder is not None:
            forwarder.join(timeout=GRACE_S)
        for log in logs:
            log.close()
    summary_file = path / "summary.json"
    if not summary_file.exists():
        raise RunFailed(f"the workers finished but rank 0 wrote no summary in {path}")
    return json.loads(summary_file.read_text())


@contextlib.contextmanager
def process_group(backend: str, rank: int, world: int, timeout_s: float) -> Iterator[None]:
    """Join the workers' process group for the ``with`` body, and leave it so that its
    threads are gone before the interpreter exits.

    ``torch.distributed.nn.functional`` binds the live default group into ten default
    arguments when first imported, and ``torch._dynamo`` (which the first optimizer
    imports) imports it. Imported after ``init_process_group``, it keeps the group alive
    past ``destroy_process_group``: gloo's threads then outlive ``main`` and, if one drops
    the last reference to a tensor while the interpreter finalizes, the worker dies of
    SIGABRT after a finished run. Imported first, it binds ``None``.
    """
    import torch.distributed.nn.functional  # noqa: F401  (see above)

    dist.init_process_group(
        backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
    )
    try:
        yield
        # nobody tears its connections down while a peer still uses them
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_worker(recipe: Recipe, reporter: Reporter) -> dict[str, Any]:
    """Train ``recipe`` as the worker that ``RANK`` / ``WORLD_SIZE`` name."""
    from qtrain.distributed.adaptive import AdaptiveBits, aggregation, message_coefficients
    from qtrain.distributed.exchange import BitPlan, Messenger
    from qtrain.distributed.partition import assign_parts, build_partition
    from qtrain.distributed.trainer import DistTrainer
    from qtrain.train.prepare import prepared
    from qtrain.train.training import train_prepared

    cfg = recipe.distributed
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise RecipeError(
            f"distributed.world_size = {cfg.world_size}, but WORLD_SIZE = {world} workers started"
        )
    check_launchable(recipe)
    device = worker_device(recipe)
    keep_freed_memory()  # workers on one machine share its cores; page faults are not free
    if not recipe.train.threads and "LOCAL_WORLD_SIZE" in os.environ:
        local = max(1, int(os.environ["LOCAL_WORLD_SIZE"]))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    with (
        process_group(cfg.backend, rank, world, cfg.timeout_s),
        prepared(recipe, device) as (dataset, graph, model, device),
    ):
        # collectives move tensors of the worker's device (nccl: its GPU)
        parts = torch.empty(graph.num_nodes(), dtype=torch.int64, device=device)
        if rank == 0:
            parts = assign_parts(graph, world, cfg.partition, recipe.train.seed).to(device)
        dist.broadcast(parts, 0)
        parts = parts.cpu()  # partitioning runs on the CPU copy of the structure
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, 0)
        path = [os.environ.get(ENV_RUN_DIR) or None]
        if rank == 0 and path[0] is None:
            path[0] = str(create_run_dir(recipe.output.dir, recipe.name))
        dist.broadcast_object_list(path, 0)
        run = RunDir(Path(path[0])) if rank == 0 else DiscardRunDir(Path(path[0]))
        part = build_partition(graph, parts, rank, world)
        adaptive = None
        if cfg.message_bits == "adaptive":
            adaptive = AdaptiveBits(
                part,
                message_coefficients(graph, parts, part, aggregation(recipe.model.name)),
                lam=cfg.lambda_,
                group_size=cfg.group_size,
                period=cfg.reassign_period,
                device=device,
            )
            messenger = Messenger(part, adaptive.plan, recipe.train.seed)
        else:
            bits = int(cfg.message_bits)
            uniform = (
                BitPlan.uniform(part.send_counts, bits),
                BitPlan.uniform(part.recv_counts, bits),
            )
            messenger = Messenger(part, lambda _layer, _direction: uniform, recipe.train.seed)

        def make_trainer(model: Any, graph: Any, **kwargs: Any) -> DistTrainer:
            return DistTrainer(
                model, graph, part, messenger, adaptive=adaptive, overlap=cfg.overlap, **kwargs
            )

        summary = train_prepared(
            recipe,
            dataset,
            graph,
            model,
            device,
            reporter if rank == 0 else Reporter(),
            run=run,
            make_trainer=make_trainer,
        )
    return summary
