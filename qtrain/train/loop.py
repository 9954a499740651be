"""The training loops: full-graph steps and neighbour-sampled mini-batches.

Both share one epoch protocol: train, evaluate every ``eval_every`` epochs
(and at the last epoch), keep the model that is best on validation, stop
early after ``patience`` evaluations without improvement, write the epoch's
metrics line, then tell the reporter. Everything measured lives in a
``TrainState`` that the caller owns, so an interruption at any point leaves
what was measured so far for the summary.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from qtrain import route, signals
from qtrain._compat import import_dgl
from qtrain.data.base import FEAT, LABEL, TEST_MASK, TRAIN_MASK, VAL_MASK
from qtrain.errors import RunDiverged
from qtrain.models.base import GNNModel
from qtrain.train.activations import ActivationMeter
from qtrain.train.metrics import loss_function, metric_function
from qtrain.train.progress import Reporter
from qtrain.train.rundir import RunDir


@dataclass
class TrainState:
    """What a run has measured so far; complete after every epoch."""

    epochs_run: int = 0
    best_epoch: int | None = None
    best_val: float | None = None
    best_test: float | None = None
    best_train: float | None = None
    best_state: dict[str, torch.Tensor] | None = None
    epoch_times: list[float] = field(default_factory=list)
    eval_times: list[float] = field(default_factory=list)
    evals_without_improvement: int = 0
    stopped_early: bool = False
    last_loss: float | None = None
    diverged_at: int | None = None  # the epoch whose loss or parameters were not finite
    checkpointed_epoch: int | None = None  # the best epoch whose weights are on disk

    def summary(self) -> dict[str, Any]:
        """The summary fields this state determines."""
        return {
            "test_acc": self.best_test,
            "val_acc": self.best_val,
            "train_acc": self.best_train,
            "best_epoch": self.best_epoch,
            "epochs": self.epochs_run,
            "epoch_time_s": statistics.median(self.epoch_times) if self.epoch_times else None,
            "train_time_s": sum(self.epoch_times),
            "eval_time_s": sum(self.eval_times),
            "final_loss": self.last_loss,
            "stopped_early": self.stopped_early,
            "diverged_at": self.diverged_at,
        }


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of ``model``'s state dict (training goes on changing the model)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def graph_tensors(graph: Any) -> list[torch.Tensor]:
    """The feature tensors a DGL graph or block carries (node and edge data)."""
    frames = (
        ("srcdata", "dstdata", "edata") if getattr(graph, "is_block", False) else ("ndata", "edata")
    )
    found: list[torch.Tensor] = []
    for frame in frames:
        try:
            values = list(getattr(graph, frame).values())
        except Exception:  # heterographs keep per-type dicts; those are not model inputs here
            continue
        found.extend(v for v in values if isinstance(v, torch.Tensor))
    return found


@contextmanager
def _quiet_dgl_loader() -> Iterator[None]:
    """DGL's DataLoader warns about CPU affinity on every iteration; it is advice, not a fault."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*CPU affinity.*")
        yield


@contextmanager
def dgl_threads(count: int) -> Iterator[None]:
    """Run DGL's OpenMP code with ``count`` threads, then restore the previous count."""
    import_dgl()
    from dgl.utils import get_num_threads, set_num_threads

    previous = get_num_threads()
    set_num_threads(count)
    try:
        yield
    finally:
        set_num_threads(previous)


def repeatable_batches(loader: Any) -> Iterator[Any]:
    """The loader's batches, each sampled with one DGL thread.

    DGL's CPU neighbour sampler draws from one random engine per OpenMP
    thread, so with several threads the neighbours it picks change from run
    to run even after ``dgl.seed``. Sampled with one thread, a seed fixes the
    batches (and on a few cores one thread samples no slower). The model's
    own computation still uses every thread.
    """
    iterator = iter(loader)
    while True:
        with dgl_threads(1):
            try:
                batch = next(iterator)
            except StopIteration:
                return
        yield batch


class Trainer:
    """Trains ``model`` on ``graph`` (already through ``model.prepare_graph``) as ``config`` says."""

    # set by the run (qtrain.train.training): every N epochs, write the best model and
    # the state a resumed run continues from (qtrain.train.resume)
    checkpoint_every: int = 0
    save_checkpoint: Callable[[], None] | None = None
    save_resume: Callable[[], None] | None = None

    def __init__(
        self,
        model: GNNModel,
        graph: Any,
        *,
        metric: str,
        config: Any,  # qtrain.recipe.TrainConfig
        device: torch.device,
        run: RunDir | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.device = device
        self.run_dir = run
        self.reporter = reporter or Reporter()
        self.metric_name = metric
        self.loss_fn = loss_function(metric)
        self.metric_fn = metric_function(metric)
        self.minibatch = config.mode == "minibatch"
        self.optimizer = self.make_optimizer()

        # The features, labels and masks stay in one place: on the device for
        # full-graph steps; on the CPU (next to the sampler) for mini-batches.
        self.graph = graph if self.minibatch else graph.to(device)
        data = self.graph.ndata
        self.feat = data[FEAT].to(device)
        self.labels = data[LABEL].to(device)
        self.eval_labels = data[LABEL].cpu() if self.minibatch else self.labels
        self.idx = {
            name: torch.nonzero(data[mask], as_tuple=False).squeeze(1)
            for name, mask in (("train", TRAIN_MASK), ("val", VAL_MASK), ("test", TEST_MASK))
        }
        if self.minibatch:
            self.sampler = import_dgl().dataloading.NeighborSampler(list(config.fanouts))
            self.loader = self._loader(0)

        self.meter = ActivationMeter(model.parameters(), device)
        self._step_inputs = [self.feat, self.labels, *graph_tensors(self.graph)]

    def make_optimizer(self) -> Any:
        """Adam over the model's parameters (a trainer with its own update overrides this)."""
        return torch.optim.Adam(
            self.model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # --- one epoch ---------------------------------------------------------

    def _loader(self, epoch: int) -> Any:
        """Epoch ``epoch``'s batches: the training nodes in an order drawn for that epoch
        alone. DGL's own shuffle permutes its previous order in place, so the batches
        would depend on every earlier epoch, which a resumed run (qtrain.train.resume)
        has not run in this process."""
        train = self.idx["train"]
        order = torch.randperm(
            train.numel(), generator=torch.Generator().manual_seed(self._epoch_seed(epoch))
        )
        return import_dgl().dataloading.DataLoader(
            self.graph,
            train[order].to(self.graph.device),
            self.sampler,
            device=route.sampler_device(self.device),
            batch_size=self.config.batch_size,
            shuffle=False,
            drop_last=False,
            num_workers=0,
        )

    def _epoch_seed(self, epoch: int) -> int:
        return (self.config.seed * 1_000_003 + epoch) % 2**63

    def begin_epoch(self, epoch: int) -> None:
        """Epoch ``epoch``'s batches, and DGL's sampler seeded for it: its generator's state
        cannot be saved, so a resumed run samples the neighbours the uninterrupted run did."""
        if self.minibatch:
            self.loader = self._loader(epoch)
            import_dgl().seed(self._epoch_seed(epoch))

    def train_epoch(self) -> tuple[float, float]:
        """One pass over the training nodes: (mean loss, metric on the training predictions)."""
        self.model.train()
        if not self.minibatch:
            idx = self.idx["train"].to(self.device)
            self.optimizer.zero_grad(set_to_none=True)
            with self.meter.step(self._step_inputs):
                logits = self.model(self.graph, self.feat)[idx]
                labels = self.labels[idx]
                loss = self.loss_fn(logits, labels)
                loss.backward()
                self.optimizer.step()
            return float(loss.item()), self.metric_fn(logits.detach(), labels)

        total_loss, seen = 0.0, 0
        outputs: list[torch.Tensor] = []
        targets: list[torch.Tensor] = []
        num_batches = len(self.loader)
        with _quiet_dgl_loader():
            batches = repeatable_batches(self.loader)
            for step, (input_nodes, output_nodes, blocks) in enumerate(batches, start=1):
                signals.raise_if_stopped()
                x = self.batch_features(input_nodes)
                y = self.labels[output_nodes.to(self.labels.device)]
                inputs = [x, y, *(t for block in blocks for t in graph_tensors(block))]
                loss, logits = self.train_batch(blocks, x, y, inputs)
                total_loss += loss * len(output_nodes)
                seen += len(output_nodes)
                outputs.append(logits)
                targets.append(y)
                self.reporter.batch(step, num_batches)
        train_metric = self.metric_fn(torch.cat(outputs), torch.cat(targets)) if outputs else 0.0
        return total_loss / max(seen, 1), train_metric

    def batch_features(self, input_nodes: torch.Tensor) -> torch.Tensor:
        """The input rows of a mini-batch (a trainer with its own feature encoding overrides
        this)."""
        return self.feat[input_nodes.to(self.feat.device)]

    def train_batch(
        self, blocks: list[Any], x: torch.Tensor, y: torch.Tensor, inputs: list[torch.Tensor]
    ) -> tuple[float, torch.Tensor]:
        """One update on a mini-batch: its mean loss and its logits, detached (a trainer with
        its own update overrides this). ``inputs`` are what the step's meter excludes."""
        self.optimizer.zero_grad(set_to_none=True)
        with self.meter.step(inputs):
            logits = self.model(blocks, x)
            loss = self.loss_fn(logits, y)
            loss.backward()
            self.optimizer.step()
        return float(loss.item()), logits.detach()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        """Validation and test metrics of the model in eval mode (all neighbours)."""
        self.model.eval()
        if self.minibatch:
            with _quiet_dgl_loader():
                logits = self.model.inference(
                    self.graph, self.feat, self.config.eval_batch_size, self.device
                )
        else:
            logits = self.model(self.graph, self.feat)
        out = {}
        for split in ("val", "test"):
            idx = self.idx[split].to(logits.device)
            out[split] = self.metric_fn(logits[idx], self.eval_labels.to(logits.device)[idx])
        return out

    # --- the run -------------------------------------------------------------

    def _checkpoint_now(self, epoch: int, state: TrainState) -> None:
        """Every ``checkpoint_every`` epochs, put a newer best model on disk: a run killed
        outright (SIGKILL, a lost machine) keeps it."""
        every, save = self.checkpoint_every, self.save_checkpoint
        if save is None or not every or epoch % every:
            return
        if state.best_epoch is not None and state.best_epoch != state.checkpointed_epoch:
            save()
            state.checkpointed_epoch = state.best_epoch
        if self.save_resume is not None:
            self.save_resume()

    def _check_finite(self, epoch: int, loss: float, state: TrainState) -> None:
        """Stop a run whose loss or parameters are no longer finite: it would go on
        reporting accuracies it did not earn. The epoch is recorded without numbers."""
        bad = None
        if not math.isfinite(loss):
            bad = f"the training loss is {loss}"
        else:
            for name, param in self.model.named_parameters():
                if not bool(torch.isfinite(param).all()):
                    bad = f"parameter {name} holds non-finite values"
                    break
        if bad is None:
            return
        state.epochs_run = epoch
        state.diverged_at = epoch
        if self.run_dir is not None:
            self.run_dir.append_metrics({"epoch": epoch, "loss": None, "diverged": True})
        raise RunDiverged(
            f"the run diverged at epoch {epoch}: {bad}; lower train.lr (now {self.config.lr}) "
            "or check the features for NaN / Inf"
        )

    def run(self, state: TrainState) -> TrainState:
        """Train for ``config.epochs`` epochs (or until early stopping), updating ``state``."""
        cfg = self.config
        if state.stopped_early:  # a resumed run that had stopped early stays stopped
            return state
        for epoch in range(state.epochs_run + 1, cfg.epochs + 1):
            signals.raise_if_stopped()  # an interrupt Python dropped in a finalizer
            self._sync()
            start = time.perf_counter()
            self.begin_epoch(epoch)
            loss, train_metric = self.train_epoch()
            self._sync()
            elapsed = time.perf_counter() - start
            self._check_finite(epoch, loss, state)
            record: dict[str, Any] = {"epoch": epoch, "loss": loss, "train_acc": train_metric}

            improved = False
            if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                start = time.perf_counter()
                scores = self.evaluate()
                self._sync()
                eval_time = time.perf_counter() - start
                record.update(val_acc=scores["val"], test_acc=scores["test"], eval_time_s=eval_time)
                state.eval_times.append(eval_time)
                val = scores["val"]
                # no validation node: nothing to select on, the latest evaluation stands
                if val is None or state.best_val is None or val > state.best_val:
                    improved = True
                    state.best_epoch, state.best_val, state.best_test = (
                        epoch,
                        scores["val"],
                        scores["test"],
                    )
                    state.best_train = train_metric
                    state.best_state = cpu_state(self.model)
                    state.evals_without_improvement = 0
                else:
                    state.evals_without_improvement += 1
            record["epoch_time_s"] = elapsed
            if improved:
                record["best"] = True

            state.epoch_times.append(elapsed)
            state.epochs_run = epoch
            state.last_loss = loss
            if self.run_dir is not None:
                self.run_dir.append_metrics(record)
            if cfg.patience and state.evals_without_improvement >= cfg.patience:
                state.stopped_early = True  # before the resume state is taken
            self._checkpoint_now(epoch, state)
            self.reporter.epoch(record)
            if state.stopped_early:
                break
        return state
