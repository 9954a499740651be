"""The ``tango`` plugin: quantized GEMM, SpMM and SDDMM for unmodified DGL models.

tango-sc23 sections 3.2-3.3. Activation patches DGL's ``gspmm`` and
``gsddmm`` (the names DGL's convolutions and its own backward passes call)
and routes the dense products of ``GraphConv``, ``SAGEConv``, ``GATConv`` and
``GCN2Conv`` (``torch.matmul``, ``nn.Linear``, ``addmm``) to quantized
autograd Functions. What stays float32, as in the paper: edge softmax, the
model's output layer when ``fp32_before_softmax`` is on (its forward and its
backward), the weight update, and any primitive variant the kernels do not
cover (max/min reducers, broadcasting shapes, heterogeneous graphs); and, with
``evaluation = "fp32"`` (the default), every forward that records no gradient
outside a backward (validation and test: the trained float32 weights are what is
evaluated). Those run
the float32 kernel underneath (DGL's own, or qtrain's device route where it is
enabled, as on a GPU) and are counted as ``fp32`` in the run's ``kernels``
table, so nothing falls back unseen.

``bits = "auto"`` runs ``qtrain.plugins.tango.calibrate`` on the model before the patches go
in and trains with the chosen count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from qtrain.plugins.tango import payoff
from qtrain.plugins.tango.cache import QuantCache
from qtrain.plugins.tango.calibrate import (
    DEFAULT_GRADIENT_TARGET,
    DEFAULT_TARGET,
    Criterion,
    calibrate_model,
)
from qtrain.plugins.tango.dropout import FusedDropout
from qtrain.plugins.tango.functions import (
    QuantEdgeToNode,
    QuantSDDMM,
    QuantSegmentMM,
    QuantSpMM,
    inside_kernel,
    quant_linear,
)
from qtrain.plugins.tango.lineage import TABLE as ROW_SCALE_FUNCTIONS
from qtrain.plugins.tango.lineage import RowScaled
from qtrain.plugins.tango.policy import (
    NonFiniteOperand,
    QuantPolicy,
    resolve_scales,
)

from qtrain.config import option
from qtrain.errors import PluginError
from qtrain.ops import dispatch, masks
from qtrain.ops.graph import graph_csr
from qtrain.ops.typed import RowsByType, offsets_from_lengths
from qtrain.plugin import (
    DENSE_FUNCTIONS,
    Calibration,
    Patcher,
    PatchSession,
    Plugin,
    PluginContext,
    dense_operands,
    float32_on,
    register_plugin,
)
from qtrain.recipe import QuantSection

FP32 = "fp32"
# NaN / Inf cannot be quantized: such a primitive runs in float32, so a diverged step shows
# the non-finite values it would show in float32 (and the run stops as diverged)
NON_FINITE = "operand not finite"
EVALUATION = 'evaluation (evaluation = "fp32")'
# devices whose float32 operands are quantized: the op library has kernels for both; a
# CUDA tensor reaches a graph primitive through qtrain's device route (DGL's CPU build
# cannot run one), whose CSR views of the graph are then read on the GPU
_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class TangoConfig:
    bits: int | Literal["auto"] = option(
        8,
        'bit count of the quantized primitives, 2..8, or "auto" (chosen before training by '
        "calibration's criterion)",
        min=2,
        max=8,
    )
    input_bits: int = option(
        8,
        "bit count of the step inputs: the node features and what the model computes from "
        "them alone before a weight (quantized once, reused every step, so a higher count "
        "costs nothing a step); every other tensor takes bits",
        min=2,
        max=8,
    )
    weight_bits: int = option(
        8,
        "bit count of the weights (parameters) a quantized product reads: small next to the "
        "node tensors and quantized once a step, so more bits there cost little; every "
        "other tensor takes bits",
        min=2,
        max=8,
    )
    rounding: Literal["stochastic", "nearest"] = option(
        "stochastic", "stochastic rounding (unbiased, the paper's) or round-to-nearest (ablation)"
    )
    scales: Literal["auto", "tensor", "row", "block"] = option(
        "auto",
        "one scale per tensor (the paper's), one per row (per node, or node and head, for the "
        "features a GEMM or SpMM reads, per output feature for a weight: finer levels), "
        "block: per row, and "
        "the weight gradient's operands (summed over every node) one scale per block of "
        "scale_block nodes of each column instead of one per column; or auto: what "
        "measures best",
    )
    scale_block: int = option(
        64,
        'nodes per scale of the weight gradient\'s operands with scales = "block" (or auto)',
        min=1,
        max=65536,
    )
    rotation: Literal[0, 2, 4, 8, 16, 32, 64, 128, 256] = option(
        0,
        "Hadamard block rotating both operands of each dense product (GEMM) along the "
        "dimension it sums over before they are quantized (spreads outliers; 0: none); "
        'needs one scale per row (scales = "row" or "auto")',
    )
    packed: bool = option(
        True,
        "at 4 bits or fewer, store quantized operands two values a byte (what the cache "
        "keeps, what a product saves for backward, the rows an SpMM gathers): half the "
        "bytes of int8, the same values",
    )
    unsigned: bool = option(
        True,
        "at 3 bits or fewer, a tensor without negative values (a ReLU's output) takes the "
        "unsigned levels 0..2^bits-1 instead of the symmetric ones, half of which it cannot "
        "use (at 2 bits: 4 levels instead of 2)",
    )
    affine: bool = option(
        True,
        "at 3 bits or fewer, a signed activation that a GEMM or SpMM reads by rows (a "
        "linear layer's output, an ELU's) takes levels from its row's minimum to its "
        "maximum (a zero point per row, corrected for in the product) instead of "
        "symmetric ones, which round most of a row to 0 at 2 bits",
    )
    cache: bool = option(
        True, "reuse quantized tensors between primitives and from forward to backward"
    )
    fp32_before_softmax: bool = option(
        True, "keep the model's output layer (it feeds the softmax) in float32"
    )
    evaluation: Literal["fp32", "quantized"] = option(
        "fp32",
        "how a forward that records no gradient (validation, test, a user's inference) "
        "runs: fp32, DGL's float32 primitives on the float32 weights training keeps (the "
        "accuracy of the model training made, what the checkpoint holds), or quantized, "
        "at the training bit count (quantized inference: cheaper, and at 2-3 bits less "
        "accurate than the model it runs)",
    )
    fp32_when_small: bool = option(
        True,
        "keep in float32 a primitive too small for int8 to pay on this device (thresholds "
        "measured by bench/crossover.py; the report's fp32_calls lists each and why)",
    )
    packed_dropout: bool = option(
        True,
        "dropout in one fused pass saving a 1-bit mask: qtrain's node-keyed dropout keeps "
        "its masks; torch's (nn.Dropout, DGL's feat_drop / attn_drop) draws them from "
        "qtrain's counter-based generator instead of torch's",
    )
    criterion: Criterion = option(
        "gradient",
        'what bits = "auto" picks by: the relative error of one training step\'s parameter '
        "gradients in the configuration that will run (gradient) or Error_X of the first "
        "layer's output (error_x, tango eq. 4); the smallest count at or under its target",
    )
    gradient_target: float = option(
        DEFAULT_GRADIENT_TARGET,
        'gradient-error target for bits = "auto" with criterion = "gradient"',
        min=1e-6,
        max=10.0,
    )
    error_x_target: float = option(
        DEFAULT_TARGET,
        'Error_X target for bits = "auto" with criterion = "error_x" (tango eq. 4)',
        min=1e-6,
        max=10.0,
    )
    backend: Literal["auto", "reference", "ext-cpu"] = option(
        "auto", "kernels to run: the compiled extension when built (auto), or the reference"
    )

    def validate(self) -> None:
        """Options that only make sense together (checked where the recipe is read)."""
        if self.rotation and self.scales in ("tensor", "block"):
            raise ValueError(
                f"rotation = {self.rotation} needs one scale per row (it rotates the weight "
                'gradient\'s columns instead of cutting them into blocks): set scales = "row" '
                'or "auto", or rotation = 0'
            )


class _Fp32Region:
    """Thread-local depth of float32 regions: the output layer's forward, and the backward of
    each DGL primitive it ran (autograd runs a node's hooks on the thread that runs it)."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def active(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    def enter(self, *_: Any) -> None:
        self._local.depth = getattr(self._local, "depth", 0) + 1

    def leave(self, *_: Any) -> None:
        self._local.depth = max(0, getattr(self._local, "depth", 0) - 1)

    def reset(self, *_: Any) -> None:
        self._local.depth = 0

    def extend_to_backward(self, result: Any) -> Any:
        """Inside the region, make the backward of the primitive that gave ``result`` run
        inside it too: DGL's backward calls the (patched) primitives again in Python.
        Hooks on that one autograd node cost less than a module's full backward hooks,
        which wrap every input and output of each call in an autograd Function."""
        if not self.active:
            return result
        nodes = {
            id(t.grad_fn): t.grad_fn
            for t in (result if isinstance(result, tuple) else (result,))
            if isinstance(t, torch.Tensor) and t.grad_fn is not None
        }
        for node in nodes.values():
            node.register_prehook(self.enter)
            node.register_hook(self.leave)
        return result


@register_plugin
class TangoPlugin(Plugin):
    """Quantized GEMM / SpMM / SDDMM with FP32 where the paper keeps it."""

    name = "tango"
    summary = "quantized GEMM, SpMM and SDDMM (2-8 bits, stochastic rounding, cached operands)"
    Config = TangoConfig

    def __init__(self, config: TangoConfig, context: PluginContext) -> None:
        super().__init__(config, context)
        self.calibration: Calibration | None = None
        self.policy: QuantPolicy | None = None
        self.fp32 = _Fp32Region()
        self.output_layer_kept = False  # fp32_before_softmax found a layer to keep in FP32
        self._hooks: list[Any] = []
        self._stack = contextlib.ExitStack()
        self.fallbacks: dict[str, int] = {}
        self.keyed_dropout_calls = 0
        self.dropout = FusedDropout(context.seed, config.backend)
        self.row_scaled = RowScaled()

    # ------------------------------------------------------------ activation

    def activate(self, patcher: Patcher) -> None:
        cfg = self.config
        if self.policy is None:  # a session entered again goes on where it stopped
            bits = cfg.bits
            if bits == "auto":
                self.calibration = self._calibrate()
                bits = self.calibration.bits
            self.policy = QuantPolicy(
                bits=int(bits),
                input_bits=cfg.input_bits,
                weight_bits=cfg.weight_bits,
                rounding=cfg.rounding,
                scales=resolve_scales(cfg.scales, cfg.rotation),
                scale_block=cfg.scale_block,
                rotation=cfg.rotation,
                packed=cfg.packed,
                unsigned=cfg.unsigned,
                affine=cfg.affine,
                seed=self.context.seed,
                cache=QuantCache() if cfg.cache else None,
                backend=cfg.backend,
                on_fp32=self._fallback,
            )
        if cfg.fp32_before_softmax:
            self._hook_output_layer()
        patcher.wrap("gspmm", self._patched_gspmm)
        patcher.wrap("gsddmm", self._patched_gsddmm)
        patcher.wrap("edge_softmax", self._fp32_counted("edge_softmax"))
        patcher.wrap("segment_mm", self._patched_segment_mm)
        patcher.wrap("gather_mm", self._patched_gather_mm)
        # the dense products and, with the cache (without it X would be quantized afresh
        # anyway), the row scalings: only those calls pass through Python
        functions = {**DENSE_FUNCTIONS, **(ROW_SCALE_FUNCTIONS if cfg.cache else {})}
        patcher.functions(functions, self._on_function)
        if cfg.packed_dropout:
            self._stack.enter_context(masks.packed_dropout_masks(self._count_keyed_dropout))
            # torch's dropout is replaced where it is looked up (nn.Dropout calls F.dropout)
            patcher.replace(F.dropout, self.dropout.function(F.dropout))

    def _count_keyed_dropout(self) -> None:
        self.keyed_dropout_calls += 1

    def deactivate(self) -> None:
        self._stack.close()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        # the policy stays, cache included (its entries die with their tensors): entered
        # again, the session continues its stream, its bit count and its int8 features

    def _calibrate(self) -> Calibration:
        model, dataset = self.context.model, self.context.dataset
        if model is None or dataset is None:
            raise PluginError(
                'tango: bits = "auto" needs the model and dataset (qtrain run provides them); '
                "pass an integer bit count to qtrain.patch"
            )
        return self.calibrate(
            self.config,
            model,
            dataset.graph,
            seed=self.context.seed,
            device=self.context.device,
            metric=dataset.metric,
        )

    @classmethod
    def calibrate(
        cls,
        config: TangoConfig,
        model: Any,
        graph: Any,
        *,
        seed: int,
        device: torch.device,
        target: float | None = None,
        metric: str = "accuracy",
    ) -> Calibration:
        """At 2..8 bits: Error_X of the first GNN layer's output (tango-sc23 eq. 4) and the
        gradient error of one step of this configuration; the smallest count at or under
        the target of ``config.criterion``'s measure."""
        if target is None:
            target = (
                config.gradient_target if config.criterion == "gradient" else config.error_x_target
            )

        @contextlib.contextmanager
        def quantized_at(bits: int) -> Iterator[None]:
            """This configuration at ``bits``, patched in for one step."""
            session = PatchSession(
                QuantSection(("tango",), {"tango": dataclasses.replace(config, bits=bits)}),
                PluginContext(seed=seed, device=device, model=model),
            )
            with session:
                yield

        return calibrate_model(
            model,
            graph,
            criterion=config.criterion,
            target=target,
            quantized_at=quantized_at,
            metric=metric,
            rounding=config.rounding,
            scales=config.scales,
            rotation=config.rotation,
            unsigned=config.unsigned,
            affine=config.affine,
            seed=seed,
            device=device,
        )

    def _hook_output_layer(self) -> None:
        model = self.context.model
        layer = self.context.output_layer
        if layer is None and model is not None:
            layer = getattr(model, "output_layer", None)
        if layer is None:
            return  # qtrain.patch without output_layer: the report says nothing was kept
        self.output_layer_kept = True
        if model is not None:  # a forward that raised inside the layer leaves no depth behind
            self._hooks.append(model.register_forward_pre_hook(self.fp32.reset))
        self._hooks += [
            layer.register_forward_pre_hook(self.fp32.enter),
            layer.register_forward_hook(self.fp32.leave),
        ]

    # ------------------------------------------------------------ helpers

    def _fallback(self, primitive: str, why: str) -> None:
        dispatch.COUNTER.record(primitive, FP32)
        key = f"{primitive}: {why}"
        self.fallbacks[key] = self.fallbacks.get(key, 0) + 1

    def _fp32_counted(self, primitive: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(inner: Callable[..., Any]) -> Callable[..., Any]:
            def fp32_primitive(*args: Any, **kwargs: Any) -> Any:
                dispatch.COUNTER.record(primitive, FP32)
                return self.fp32.extend_to_backward(inner(*args, **kwargs))

            fp32_primitive.__wrapped__ = inner  # type: ignore[attr-defined]
            return fp32_primitive

        return make

    def _evaluating(self) -> bool:
        """Whether this call is part of an evaluation that ``evaluation = "fp32"`` runs in
        float32: grad mode off outside any backward (DGL's backward passes call the
        primitives with grad mode off too)."""
        return (
            self.config.evaluation == "fp32"
            and not torch.is_grad_enabled()
            and torch._C._current_graph_task_id() == -1
        )

    def _why_not(self, gidx: Any, *tensors: Any) -> str | None:
        """Why a graph primitive must stay float32 here, or None if it can be quantized."""
        if self.fp32.active:
            return "output layer (fp32_before_softmax)"
        if self._evaluating():
            return EVALUATION
        if gidx.number_of_etypes() != 1:
            return "heterogeneous graph"
        if not float32_on(_DEVICES, *tensors):
            return "operand not a float32 tensor on a supported device"
        return None

    # ------------------------------------------------------------ SpMM

    def _patched_gspmm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def gspmm(gidx: Any, op: str, reduce_op: str, lhs: Any, rhs: Any) -> Any:
            operands = [t for t in (lhs, rhs) if t is not None]
            why = self._why_not(gidx, *operands)
            if why is None and reduce_op != "sum":
                why = f"reducer {reduce_op!r}"
            if why is None and self.config.fp32_when_small:
                why = _small_spmm(op, lhs, rhs, gidx.number_of_edges(0))
            if why is None:
                try:
                    result = self._spmm(gidx, op, lhs, rhs)
                except NonFiniteOperand:
                    result, why = None, NON_FINITE
                if result is not None:
                    return result
                why = why or f"op {op!r} with shapes {_shapes(lhs, rhs)}"
            self._fallback("spmm", why)
            return self.fp32.extend_to_backward(original(gidx, op, reduce_op, lhs, rhs))

        gspmm.__wrapped__ = original  # type: ignore[attr-defined]
        return gspmm

    def _spmm(self, gidx: Any, op: str, lhs: Any, rhs: Any) -> torch.Tensor | None:
        policy = self.policy
        assert policy is not None
        recording = torch.is_grad_enabled()  # a Function's forward runs with grad mode off
        if op == "copy_lhs" and lhs.dim() in (2, 3):
            if lhs.dim() == 2 and policy.cache is not None:
                # r * X aggregated first: the same values every step in a new tensor; its
                # int8 copy is made once and handed to the cache under this step's tensor
                # r * X is a step input when X is one (an evaluation remembers X, not r * X)
                source = self.row_scaled.source(lhs)
                bits = policy.bits_for(lhs, True, recording, source[0] if source else None)
                kept = self.row_scaled.quantized_once(
                    lhs, lambda y: policy.fresh(y, True, bits=bits, shifted=True), bits
                )
                if kept is not None:
                    policy.store(lhs, kept, bits=bits, shifted=True)
                    self.row_scaled.used += 1
            return QuantSpMM.apply(policy, graph_csr(gidx, 0, lhs.device), lhs, None, recording)
        if op == "mul" and lhs.dim() in (2, 3) and _per_head_weight(lhs, rhs):
            return QuantSpMM.apply(policy, graph_csr(gidx, 0, lhs.device), lhs, rhs, recording)
        if op == "copy_rhs" and rhs.dim() in (2, 3):
            return QuantEdgeToNode.apply(policy, graph_csr(gidx, 0, rhs.device), rhs, recording)
        return None

    # ------------------------------------------------------------ SDDMM

    def _patched_gsddmm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def gsddmm(
            gidx: Any,
            op: str,
            lhs: Any,
            rhs: Any,
            lhs_target: str = "u",
            rhs_target: str = "v",
        ) -> Any:
            operands = [t for t in (lhs, rhs) if t is not None]
            why = self._why_not(gidx, *operands)
            if why is None:
                targets = (lhs_target, rhs_target)
                if op not in ("add", "sub", "mul", "dot"):
                    why = f"op {op!r}"
                elif targets not in (("u", "v"), ("v", "u")):
                    why = f"targets {lhs_target},{rhs_target}"
                elif lhs.dim() not in (2, 3) or lhs.shape[1:] != rhs.shape[1:]:
                    why = f"op {op!r} with shapes {_shapes(lhs, rhs)}"
                elif self.config.fp32_when_small and (
                    small := payoff.sddmm(op, lhs, gidx.number_of_edges(0))
                ):
                    why = small
                else:
                    policy = self.policy
                    assert policy is not None
                    csr = graph_csr(gidx, 0, lhs.device)
                    try:
                        return QuantSDDMM.apply(
                            policy, csr, op, lhs, rhs, lhs_target == "u", torch.is_grad_enabled()
                        )
                    except NonFiniteOperand:
                        why = NON_FINITE
            self._fallback("sddmm", why)
            return self.fp32.extend_to_backward(
                original(gidx, op, lhs, rhs, lhs_target, rhs_target)
            )

        gsddmm.__wrapped__ = original  # type: ignore[attr-defined]
        return gsddmm

    # ------------------------------------------------------------ typed GEMM

    def _typed_why_not(self, a: Any, b: Any) -> str | None:
        """Why a typed product (``segment_mm`` / ``gather_mm``) must stay float32, or None."""
        if self.fp32.active:
            return "output layer (fp32_before_softmax)"
        if self._evaluating():
            return EVALUATION
        if not float32_on(_DEVICES, a, b) or a.dim() != 2 or b.dim() != 3:
            return "operand not a float32 [N, K] x [R, K, M] pair on a supported device"
        return None

    def _typed(self, a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> Any:
        policy = self.policy
        assert policy is not None
        return QuantSegmentMM.apply(policy, a, b, offsets, torch.is_grad_enabled())

    def _patched_segment_mm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def segment_mm(a: Any, b: Any, seglen_a: Any) -> Any:
            why = self._typed_why_not(a, b)
            if why is None:
                try:
                    return self._typed(a, b, offsets_from_lengths(torch.as_tensor(seglen_a)))
                except NonFiniteOperand:
                    why = NON_FINITE
            self._fallback("segment_gemm", why)
            return self.fp32.extend_to_backward(original(a, b, seglen_a))

        segment_mm.__wrapped__ = original  # type: ignore[attr-defined]
        return segment_mm

    def _patched_gather_mm(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def gather_mm(a: Any, b: Any, *, idx_b: Any) -> Any:
            why = self._typed_why_not(a, b)
            if why is None:
                rows = RowsByType(idx_b, b.shape[0])
                try:
                    return rows.restore(self._typed(rows.group(a), b, rows.offsets))
                except NonFiniteOperand:
                    why = NON_FINITE
            self._fallback("segment_gemm", why)
            return self.fp32.extend_to_backward(original(a, b, idx_b=idx_b))

        gather_mm.__wrapped__ = original  # type: ignore[attr-defined]
        return gather_mm

    # ------------------------------------------------------------ dense

    def _on_function(
        self, kind: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if kind == "mul":
            return self.row_scaled.on_mul(kind, func, args, kwargs)
        return self._on_dense(kind, func, args, kwargs)

    def _on_dense(
        self, kind: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if inside_kernel():
            return func(*args, **kwargs)
        plan = dense_operands(kind, args, kwargs, _DEVICES)
        if plan is None:
            if any(isinstance(a, torch.Tensor) and a.layout != torch.strided for a in args):
                self._fallback("gemm", "sparse operand")  # torch.sparse A @ X stays float32
            return func(*args, **kwargs)
        x, w, bias, linear = plan
        if self.fp32.active:
            self._fallback("gemm", "output layer (fp32_before_softmax)")
            return func(*args, **kwargs)
        if self._evaluating():
            self._fallback("gemm", EVALUATION)
            return func(*args, **kwargs)
        if self.config.fp32_when_small and (small := payoff.gemm(x, w, linear)):
            self._fallback("gemm", small)
            return func(*args, **kwargs)
        policy = self.policy
        assert policy is not None
        try:
            scaled = self.row_scaled.source(x) if x.dim() == 2 else None
            if scaled is None:
                return quant_linear(policy, x, w, bias, linear=linear)
            # (r * X) @ W = r * (X @ W): X's int8 copy is cached for the run
            unscaled, rows = scaled
            self.row_scaled.used += 1
            out = quant_linear(policy, unscaled, w, None, linear=linear) * rows
            return out if bias is None else out + bias
        except NonFiniteOperand:
            self._fallback("gemm", NON_FINITE)
            return func(*args, **kwargs)

    # ------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        """The stochastic-rounding stream's position and the dropout calls drawn (the cache
        is not kept: operands it held across epochs are quantized again after a resume)."""
        return {
            "offset": self.policy._offset if self.policy is not None else 0,
            "dropout_calls": self.dropout.calls,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.policy is not None:
            self.policy._offset = int(state["offset"])
        self.dropout.calls = int(state.get("dropout_calls", 0))  # absent before it existed

    # ------------------------------------------------------------ report

    def report(self) -> dict[str, Any]:
        policy = self.policy
        out: dict[str, Any] = {
            "bits": policy.bits if policy else self.config.bits,
            "input_bits": self.config.input_bits,
            # quantizations made at input_bits (step inputs; 0 when it equals bits)
            "step_inputs_quantized": policy.step_inputs_quantized if policy else 0,
            "weight_bits": self.config.weight_bits,
            # quantizations made at weight_bits (0 when it equals bits)
            "weights_quantized": policy.weights_quantized if policy else 0,
            "rounding": self.config.rounding,
            "scales": policy.scales if policy else self.config.scales,
            # nodes per scale of the weight gradient's operands (used with scales = "block")
            "scale_block": self.config.scale_block,
            "rotation": self.config.rotation,
            "packed": self.config.packed,
            "unsigned": self.config.unsigned,
            # quantizations of nonnegative tensors that took the unsigned levels
            "unsigned_quantized": policy.unsigned_quantized if policy else 0,
            "affine": self.config.affine,
            # quantizations of signed activations that took affine levels (a zero point a row)
            "affine_quantized": policy.affine_quantized if policy else 0,
            # how evaluations ran: float32 primitives ("fp32") or at the training bit count
            "evaluation": self.config.evaluation,
            # quantized operands stored two values a byte (at 4 bits or fewer)
            "operands_packed": policy.operands_packed if policy else 0,
            "cache": policy.cache.stats() if policy and policy.cache is not None else None,
            # what was done, not what was asked: a user's loop may name no output layer
            "fp32_before_softmax": self.output_layer_kept,
            "fp32_calls": dict(sorted(self.fallbacks.items())),
            # dropout calls run fused with a 1-bit mask: qtrain's node-keyed ones, torch's
            # dense products that took a row-scaled input unscaled (its int8 copy cached)
            "row_scaled_inputs": self.row_scaled.used,
            "packed_dropout_calls": {
                "keyed": self.keyed_dropout_calls,
                "torch": self.dropout.calls,
            },
        }
        if self.config.fp32_before_softmax and not self.output_layer_kept:
            out["fp32_before_softmax_skipped"] = (
                "no output layer to keep in float32: pass qtrain.patch(..., output_layer=...)"
            )
        if self.calibration is not None:
            out["calibration"] = self.calibration.to_json()
        return out


def _shapes(*tensors: Any) -> str:
    return ", ".join(str(tuple(t.shape)) if t is not None else "None" for t in tensors)


def _small_spmm(op: str, lhs: Any, rhs: Any, edges: int) -> str | None:
    """Why an SpMM tango covers is too small to quantize here (None: it pays, or tango
    does not cover it and says so itself)."""
    if op == "copy_rhs" and isinstance(rhs, torch.Tensor):
        return payoff.spmm("copy", rhs, edges)
    if op in ("copy_lhs", "mul") and isinstance(lhs, torch.Tensor):
        return payoff.spmm("copy" if op == "copy_lhs" else "mul", lhs, edges)
    return None


def _per_head_weight(x: torch.Tensor, w: Any) -> bool:
    """w is one scalar per edge, or one per edge and head ([E, H, 1] for x [N, H, D])."""
    if not isinstance(w, torch.Tensor) or w.dim() != x.dim() or w.shape[-1] != 1:
        return False
    return x.dim() == 2 or w.shape[1] in (1, x.shape[1])
