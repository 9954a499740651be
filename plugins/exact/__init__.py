"""The ``exact`` plugin: store what autograd saves for backward compressed (exact-iclr22).

Every floating-point activation an unmodified DGL model saves is kept as
per-row ``bits``-bit integers with a bfloat16 zero point and range, stochastic
rounding and dense bit packing, optionally after a normalized Rademacher
projection to ``width / rp_ratio`` columns (``qtrain.plugins.exact.compressed``).
ReLU, LeakyReLU and dropout are routed to versions that save a boolean mask,
stored at exactly 1 bit per element (``qtrain.ops.masks``); losses and
softmaxes save FP32 (their backward exponentiates what they save). BatchNorm inputs
are quantized but never projected; parameters and the step's inputs are
never compressed (the activation meter passes them by reference; in a
user's own loop under ``qtrain.patch``, leaves that require grad and views of
them are passed). Dense products by a parameter (``nn.Linear``, ``matmul``,
``addmm``) take their weight gradient from the stored form without rebuilding
the input (``qtrain.plugins.exact.projected``): with a projection from the
projected rows, without one from the quantized rows a block at a time; unless
tango, which quantizes those products itself, is active. On the same condition
(and unless ``blocked_sage = false``), GraphSAGE's mean layer (DGL's ``SAGEConv``
and qtrain's ``LeanSAGEConv``) on a whole CPU graph is computed a block of rows
at a time, so its aggregation never exists whole
(``qtrain.plugins.exact.fused_sage``), and a full-graph run of qtrain's
GraphSAGE holds its graph as the CSC alone (``qtrain.train.prepare``).

Inside ``qtrain run`` it works through the trainer's saved-tensor hooks (the
activation meter), so it composes with mini-batch training and with
``tango``, whose quantized int8 operands are saved as they are, not
compressed a second time.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from qtrain.plugins.exact import fused_sage
from qtrain.plugins.exact.compressed import CompressingCodec
from qtrain.plugins.exact.projected import projected_product, row_blocked_product
from torch.nn.modules.batchnorm import _BatchNorm

from qtrain._compat import import_dgl
from qtrain.config import option
from qtrain.models.lean_sage import lean_sage_conv
from qtrain.ops import masks
from qtrain.plugin import (
    Patcher,
    Plugin,
    PluginContext,
    call_argument,
    dense_operands,
    register_plugin,
)
from qtrain.train.activations import installed_codec, storage_key


@dataclass(frozen=True)
class ExactConfig:
    bits: Literal[1, 2, 4, 8] = option(2, "bits per saved activation value: 1, 2, 4 or 8")
    rp_ratio: Literal[1, 2, 4, 8] = option(
        1, "random projection ratio D/R before quantizing (1 = no projection)"
    )
    rounding: Literal["auto", "stochastic", "nearest", "means"] = option(
        "auto",
        "stochastic (unbiased, the paper's), nearest (ablation), means (1 bit: each row split "
        "at its mean and stored as its two sides' means; deterministic, under a tenth of "
        "stochastic rounding's squared error) or auto (at 1 bit stochastic for a tensor whose "
        "zeros all sit at an end of their rows, such as ReLU's output, so they stay exactly "
        "zero; the means for any other; stochastic above)",
    )
    blocked_sage: bool = option(
        True,
        "compute GraphSAGE mean layers on a whole CPU graph a block of rows at a time, and "
        "hold a full-graph run's graph as its CSC alone (false: DGL's layer and graph)",
    )
    backend: Literal["auto", "reference", "ext-cpu"] = option(
        "auto", "kernels to run: the compiled extension when built (auto), or the reference"
    )

    def validate(self) -> None:
        """Options that only make sense together (checked where the recipe is read)."""
        if self.rounding == "means" and self.bits != 1:
            raise ValueError(
                f'rounding = "means" stores two levels a row, which is 1 bit, got bits = '
                f'{self.bits}: set bits = 1, or rounding = "auto", "stochastic" or "nearest"'
            )


# torch functions whose saved float tensor is replaced by a boolean mask
_MASKED: dict[Any, str] = {
    torch.relu: "relu",
    torch.Tensor.relu: "relu",
    F.relu: "relu",
    F.leaky_relu: "leaky_relu",
    F.dropout: "dropout",
}

# Losses and softmaxes keep what they save in FP32: their backward takes exp()
# of it (log-softmax), so a quantization level of a log-probability becomes a
# factor, and a projected one overflows. EXACT compresses the layers of its
# Table 8 (linear, SpMM, BatchNorm, ReLU, dropout), never the loss.
_FP32: dict[Any, str] = {
    f: "fp32"
    for f in (
        F.cross_entropy,
        F.nll_loss,
        F.binary_cross_entropy,
        F.binary_cross_entropy_with_logits,
        F.log_softmax,
        F.softmax,
        torch.log_softmax,
        torch.softmax,
        torch.Tensor.log_softmax,
        torch.Tensor.softmax,
    )
}


class _Stored:
    """A codec's stored form, as the plugin's own saved-tensor hooks hold it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _is_parameter(t: torch.Tensor) -> bool:
    """A parameter or a view of one (autograd saves ``weight.t()``): leaves that need grads."""
    base = t._base if t._base is not None else t
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


@register_plugin
class ExactPlugin(Plugin):
    """Compressed saved activations: INT1/2/4/8 per row, optional random projection."""

    name = "exact"
    summary = "compress the activations saved for backward (1-8 bits, random projection)"
    Config = ExactConfig

    def __init__(self, config: ExactConfig, context: PluginContext) -> None:
        super().__init__(config, context)
        self.codec = CompressingCodec(
            bits=config.bits,
            rp_ratio=config.rp_ratio,
            rounding=config.rounding,
            seed=context.seed,
            backend=config.backend,
        )
        self._stack = contextlib.ExitStack()
        self.masked_calls: dict[str, int] = {}
        self.fp32_calls: dict[str, int] = {}
        self.projected_products = 0
        self.row_blocked_products = 0
        self.blocked_sage_layers = 0
        # tango quantizes the dense products itself and saves int8 operands
        self.routes_products = "tango" not in context.plugins
        self.projects_products = config.rp_ratio > 1 and self.routes_products
        model = context.model
        self._parameter_keys = (
            {p.untyped_storage().data_ptr() for p in model.parameters()} if model else set()
        )

    @classmethod
    def reads_only_in_csr(
        cls, config: ExactConfig, model: torch.nn.Module, plugins: tuple[str, ...], device: Any
    ) -> bool:
        """With ``blocked_sage`` (and not tango) on the CPU, qtrain's GraphSAGE with the mean
        aggregator reads the graph only through its in-CSR: the blocked layer in training
        steps, DGL's forward (which aggregates over the CSC) in evaluation."""
        from qtrain.models.sage import SAGE

        return (
            config.blocked_sage
            and "tango" not in plugins
            and torch.device(device).type == "cpu"
            and isinstance(model, SAGE)
            and all(getattr(layer, "_aggre_type", None) == "mean" for layer in model.layers)
        )

    def activate(self, patcher: Patcher) -> None:
        self._stack.enter_context(installed_codec(self.codec))
        # Outside the trainer's steps (a user's own loop under ``qtrain.patch``)
        # these hooks compress; inside a step the trainer's activation meter
        # installs its own (innermost) pair, which applies the same codec and
        # also counts the bytes.
        self._stack.enter_context(
            torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        )
        handle = torch.nn.modules.module.register_module_forward_pre_hook(self._note_batchnorm)
        self._stack.callback(handle.remove)
        patcher.functions({**_MASKED, **_FP32}, self._on_function)
        if self.routes_products:
            patcher.dense(self._on_dense)
        if self.routes_products and self.config.blocked_sage:
            import_dgl()
            from dgl.nn import SAGEConv

            for owner in (SAGEConv, lean_sage_conv()):
                patcher.replace_attribute(owner, "forward", self._sage_forward(owner.forward))
        # qtrain's own models draw dropout keyed by node id (qtrain.models.dropout)
        self._stack.enter_context(masks.packed_dropout_masks(self._count_keyed_dropout))

    def deactivate(self) -> None:
        self._stack.close()

    def state_dict(self) -> dict[str, Any]:
        """The codec's random-stream position (stochastic rounding, projections)."""
        return {"offset": self.codec._offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.codec._offset = int(state["offset"])

    def report(self) -> dict[str, Any]:
        codec = self.codec
        ratio = codec.original_bytes / codec.stored_bytes if codec.stored_bytes else None
        return {
            "bits": self.config.bits,
            "rp_ratio": self.config.rp_ratio,
            "rounding": self.config.rounding,  # saved_tensors.side_means: how many took them
            "saved_tensors": dict(codec.stats),
            "masked_calls": dict(self.masked_calls),
            "fp32_calls": dict(self.fp32_calls),  # losses and softmaxes, saved uncompressed
            # weight gradients taken from the projected rows (qtrain.plugins.exact.projected)
            "projected_products": self.projected_products,
            "row_blocked_products": self.row_blocked_products,
            # GraphSAGE mean layers computed a block of rows at a time (fused_sage)
            "blocked_sage_layers": self.blocked_sage_layers,
            "compressed_bytes_in": codec.original_bytes,
            "compressed_bytes_out": codec.stored_bytes,
            "compression_ratio": ratio,
        }

    # ------------------------------------------------------------ hooks

    def _pack(self, t: torch.Tensor) -> Any:
        key = storage_key(t)
        if key is None or key in self._parameter_keys or _is_parameter(t):
            return t
        stored = self.codec.encode(t)
        return t if stored is None else _Stored(stored)

    def _unpack(self, held: Any) -> torch.Tensor:
        return self.codec.decode(held.value) if isinstance(held, _Stored) else held

    def _note_batchnorm(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0] if args else None
        usable = isinstance(x, torch.Tensor) and storage_key(x) is not None
        if isinstance(module, _BatchNorm) and module.training and usable:
            self.codec.skip_projection(x)

    def _on_function(
        self, kind: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if kind == "fp32":
            with self.codec.suspended():
                name = getattr(func, "__name__", "loss")
                self.fp32_calls[name] = self.fp32_calls.get(name, 0) + 1
                return func(*args, **kwargs)
        x = args[0] if args else kwargs.get("input")
        usable = (
            isinstance(x, torch.Tensor)
            and x.is_floating_point()
            and torch.is_grad_enabled()
            and x.requires_grad
        )
        if kind == "relu":
            inplace = call_argument(args, kwargs, 1, "inplace", False) if func is F.relu else False
            if usable and not inplace:
                return self._count(kind, masks.relu(x, self.config.backend))
        elif kind == "leaky_relu":
            slope = call_argument(args, kwargs, 1, "negative_slope", 0.01)
            inplace = call_argument(args, kwargs, 2, "inplace", False)
            if usable and not inplace:
                return self._count(kind, masks.leaky_relu(x, float(slope), self.config.backend))
        else:  # dropout
            p = float(call_argument(args, kwargs, 1, "p", 0.5))
            training = call_argument(args, kwargs, 2, "training", True)
            inplace = call_argument(args, kwargs, 3, "inplace", False)
            if usable and training and not inplace and p > 0.0:
                return self._count(kind, masks.dropout(x, p, self.config.backend))
        return func(*args, **kwargs)

    def _on_dense(self, kind: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        plan = dense_operands(kind, args, kwargs) if torch.is_grad_enabled() else None
        if plan is not None and plan.x.requires_grad and _is_parameter(plan.w):
            if self.projects_products:
                out = projected_product(self.codec, plan.x, plan.w, plan.bias, plan.linear)
                if out is not None:
                    self.projected_products += 1
                    return out
            out = row_blocked_product(self.codec, plan.x, plan.w, plan.bias, plan.linear)
            if out is not None:
                self.row_blocked_products += 1
                return out
        return func(*args, **kwargs)

    def _sage_forward(self, original: Any) -> Any:
        """``SAGEConv.forward`` that computes the calls ``fused_sage`` takes a block of rows
        at a time and hands every other call to ``original``."""

        def forward(module: Any, graph: Any, feat: Any, edge_weight: Any = None) -> Any:
            if fused_sage.fusable(module, graph, feat, edge_weight):
                self.blocked_sage_layers += 1
                return fused_sage.sage_mean(module, graph, feat, self.codec, self.projects_products)
            return original(module, graph, feat, edge_weight)

        return forward

    def _count_keyed_dropout(self) -> None:
        self.masked_calls["dropout"] = self.masked_calls.get("dropout", 0) + 1

    def _count(self, kind: str, out: torch.Tensor) -> torch.Tensor:
        self.masked_calls[kind] = self.masked_calls.get(kind, 0) + 1
        return out
