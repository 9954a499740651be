"""Starting the workers of a distributed run, and being one.

``qtrain run`` with ``[distributed] world_size > 1`` starts ``world_size``
copies of itself on this machine (``python -m qtrain run <resolved recipe>``)
through torch's elastic launcher, the one behind torchrun (``elastic_launch``:
one node, no restarts, a static rendezvous on 127.0.0.1), waits, and returns
rank 0's summary. A process started with ``RANK`` and ``WORLD_SIZE`` set (by
this launcher or by ``torchrun`` across machines) is a worker: it joins the
process group, partitions the graph like every other worker, and trains its
part; rank 0 writes the run directory.

If a worker exits with an error or is killed, the elastic agent stops the
others (SIGTERM, then SIGKILL after its 30 s grace period) and the launcher
fails with one line naming the rank and quoting that worker's own error. A
stop signal to the launcher (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT) is passed on to
the workers, as torchrun does, with SIGKILL after ``GRACE_S``; the run ends
"interrupted". Workers die with the launcher even when it is killed outright
(Linux parent-death signal), so none is left behind; a worker whose peer
vanished fails on its own after ``timeout_s``. Rank 0's progress goes to
standard error (its error line, if any, only into the launcher's message);
every worker's standard error also goes to ``worker-<rank>.log`` in the run
directory, and nothing else of the elastic agent's is written there. The
agent's own log lines stay off the terminal unless they are errors the
launcher's message does not already tell (``LOGLEVEL=INFO`` shows them all).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs

from qtrain._malloc import set_up_allocator
from qtrain.errors import QtrainError, RecipeError, RunFailed
from qtrain.recipe import Recipe, resolve_toml
from qtrain.train.progress import Reporter
from qtrain.train.rundir import RunDir, create_run_dir

ENV_RUN_DIR = "QTRAIN_RUN_DIR"  # the launcher's run directory, for rank 0
ENV_LAUNCHER_PID = "QTRAIN_LAUNCHER_PID"  # a worker of ``launch`` dies with this process
GRACE_S = 10  # between passing a stop signal on to the workers and SIGKILL
MONITOR_S = 0.1  # how often the elastic agent looks at its workers
# the signals the elastic agent passes on to the workers (torchrun's set)
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
ERROR_PREFIX = "qtrain: error: "
EXIT_BAD_INPUT = 2  # a worker refused its input (the CLI's status for QtrainError)
ELASTIC_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher")


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


def worker_log(path: Path, rank: int) -> Path:
    """Where the launcher keeps worker ``rank``'s standard error."""
    return path / f"worker-{rank}.log"


class RunDirLogs(LogsSpecs):
    """The elastic agent's log destinations: each worker's standard error in
    ``worker-<rank>.log`` of the run directory, its standard output dropped (rank 0's
    result is its summary), and no error files (qtrain's workers report through their
    exit status and their last ``qtrain: error:`` line). The default would put
    ``<tmp>/torchelastic_*/<run id>/attempt_0/<rank>/{stdout,stderr}.log`` elsewhere."""

    def __init__(self, path: Path) -> None:
        super().__init__(log_dir=str(path))
        self.path = path

    @property
    def root_log_dir(self) -> str:
        return str(self.path)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        ranks = {local: int(env.get("RANK", local)) for local, env in envs.items()}
        return LogsDest(
            stdouts=dict.fromkeys(envs, os.devnull),
            stderrs={local: str(worker_log(self.path, r)) for local, r in ranks.items()},
            error_files=dict.fromkeys(envs, os.devnull),
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _die_with_launcher() -> None:
    """In a worker of ``launch``: get SIGTERM when the launcher dies (Linux), so that a
    launcher killed outright (SIGKILL, which it cannot pass on) leaves no worker behind.
    The elastic agent starts workers without a hook before exec, so the worker asks."""
    launcher = os.environ.get(ENV_LAUNCHER_PID)
    if not launcher:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(launcher):  # it died before this worker asked
        signal.raise_signal(signal.SIGTERM)


def _rearm_sigterm() -> None:
    """Install SIGTERM's handler again after METIS: GKlib saves and restores it with SysV
    ``signal()``, which leaves Python's handler one-shot (SA_RESETHAND). A second SIGTERM
    before the handler ran would then kill the worker outright, and one comes when the
    launcher is killed (Linux sends the parent-death signal once per launcher thread the
    worker is handed over from)."""
    handler = signal.getsignal(signal.SIGTERM)
    if handler is not None:  # None: not installed from Python, not ours to touch
        with contextlib.suppress(ValueError):  # only the main thread may
            signal.signal(signal.SIGTERM, handler)


def _error_line(log: Path) -> str | None:
    """The last ``qtrain: error:`` line a worker wrote, without the prefix."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [line[len(ERROR_PREFIX) :] for line in lines if line.startswith(ERROR_PREFIX)]
    return found[-1] if found else None


class _NotTheFailure(logging.Filter):
    """Drop the agent's "failed (exitcode: ...)" record: the launcher's one line says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed (exitcode")


@contextlib.contextmanager
def _quiet_elastic() -> Iterator[None]:
    """Keep the elastic agent's informational lines and warnings (closing signals sent,
    rendezvous details) off the terminal; errors it alone knows (a worker that outlived
    SIGKILL) still show. ``LOGLEVEL`` (the agent's own variable) lowers the bar."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(os.environ.get("LOGLEVEL", "ERROR").upper())
    handler.addFilter(_NotTheFailure())
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    saved = []
    for name in ELASTIC_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate))
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, propagate in saved:
            logger.removeHandler(handler)
            logger.propagate = propagate


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the ``with`` body (the elastic agent gives workers
    this process's environment), and put back what was there; the agent's
    ``TORCHELASTIC_SIGNALS_TO_HANDLE`` goes too."""
    names = [*values, "TORCHELASTIC_SIGNALS_TO_HANDLE"]
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """Give back the stop-signal handlers the elastic agent replaces with its own (which
    raise ``SignalException``) once it is done: ``qtrain.signals``' again."""
    signums = [signal.Signals[name] for name in STOP_SIGNALS]
    saved = {signum: signal.getsignal(signum) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            current = signal.getsignal(signum)
            if getattr(current, "__module__", "").startswith("torch.distributed.elastic"):
                signal.signal(signum, handler)


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
    if getattr(entry.factory, "needs_relations", False):
        raise RecipeError(
            f"model {recipe.model.name!r} is relational, and distributed training runs "
            "homogeneous models only (its workers' blocks carry no edge types); use gcn, "
            "sage or gat, or train it in one process"
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

    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.multiprocessing.tail_log import TailLog
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

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
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world,
        logs_specs=RunDirLogs(path),
        run_id=path.name,
        role="qtrain",
        rdzv_backend="static",  # one node: the agent's own TCPStore, which workers join
        rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        rdzv_configs={"rank": 0},
        max_restarts=0,
        monitor_interval=MONITOR_S,
        signals_to_handle=",".join(STOP_SIGNALS),
        shutdown_timeout=GRACE_S,
    )
    # rank 0's progress on our standard error, its error line only in our message
    progress = TailLog(
        "qtrain",
        {0: str(worker_log(path, 0))},
        sys.stderr,
        log_line_prefixes={0: ""},
        log_line_filter=lambda line: not line.startswith(ERROR_PREFIX),
    )
    command = ("-m", "qtrain", "run", str(path / "recipe.toml"))
    env = {
        ENV_RUN_DIR: str(path),
        ENV_LAUNCHER_PID: str(os.getpid()),
        "OMP_NUM_THREADS": str(threads),
    }
    try:
        with _quiet_elastic(), _environ(**env):
            try:
                with _own_signal_handlers():
                    progress.start()
                    elastic_launch(config, sys.executable)(*command)
            finally:  # the workers are gone: rank 0's log is complete
                progress.stop()
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()  # the others were stopped after it
        said = _error_line(worker_log(path, rank))
        message = (
            f"worker rank {rank} {_how(failure.exitcode)}"
            + (f": {said}" if said else f" (see {worker_log(path, rank)})")
            + f"; the other workers were stopped and {path} keeps what rank 0 wrote"
        )
        close_summary(path, "failed", message)
        raise (QtrainError if failure.exitcode == EXIT_BAD_INPUT else RunFailed)(message) from None
    except (SignalException, KeyboardInterrupt) as exc:
        # the agent passed the signal on and waited for the workers (SignalException);
        # one that came before it started them interrupts it as Ctrl-C does
        close_summary(path, "interrupted", "stopped by a signal")
        if isinstance(exc, SignalException):
            raise KeyboardInterrupt(exc.sigval.name) from None
        raise
    except Exception as exc:  # the agent itself failed (its rendezvous, a port in use)
        message = f"the elastic launcher failed: {type(exc).__name__}: {exc}"
        close_summary(path, "failed", message)  # the agent stopped what it had started
        raise RunFailed(f"{message}; no worker is left running (run directory {path})") from exc
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

    _die_with_launcher()
    cfg = recipe.distributed
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise RecipeError(
            f"distributed.world_size = {cfg.world_size}, but WORLD_SIZE = {world} workers started"
        )
    check_launchable(recipe)
    device = worker_device(recipe)
    set_up_allocator()  # workers on one machine share its cores; page faults are not free
    if not recipe.train.threads and "LOCAL_WORLD_SIZE" in os.environ:
        local = max(1, int(os.environ["LOCAL_WORLD_SIZE"]))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    with (
        process_group(cfg.backend, rank, world, cfg.timeout_s),
        # partitioning takes the loaded graph: DGL's METIS needs int64 ids
        prepared(recipe, device, compact=False) as (dataset, graph, model, device),
    ):
        # collectives move tensors of the worker's device (nccl: its GPU)
        parts = torch.empty(graph.num_nodes(), dtype=torch.int64, device=device)
        if rank == 0:
            parts = assign_parts(graph, world, cfg.partition, recipe.train.seed).to(device)
            _rearm_sigterm()
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
