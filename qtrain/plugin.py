"""Plugins: the registry, the patcher that swaps DGL's primitives, and sessions.

A plugin is a ``Plugin`` subclass with a typed ``Config`` and an
``activate(patcher)`` that asks its ``Patcher`` to wrap DGL primitives. The
patcher replaces the primitive's function object in *every* module namespace
that holds a reference to it (DGL binds its kernels by name in several
modules, and user code may have done ``from dgl.ops import edge_softmax``),
and puts exactly the original objects back on deactivation. Torch functions a
plugin intercepts (dense products: ``torch.matmul``, ``nn.Linear``'s
``F.linear``, ``@``) are replaced the same way, and tensor methods and operators
(``Tensor.matmul``, ``__matmul__``) on ``torch.Tensor`` itself: an unmodified
model reaches them by name or operator. Not a ``TorchFunctionMode``, which
would also reach a function a model stored before the session began, but puts
every torch call of a step through Python (about 320 a step on a 3,000-node
GCN: 0.7 ms of a 5.7 ms step).

Built-in plugins live in ``plugins/`` (installed as ``qtrain.plugins``);
third-party ones register in the ``qtrain.plugins`` entry-point group.
Plugins compose in the order a recipe lists them: a later plugin wraps what
the earlier ones installed, and deactivation runs in reverse.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import math
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch

from qtrain._compat import import_dgl
from qtrain.errors import PluginError, RecipeError, one_of
from qtrain.registry import Registry

# Where DGL binds each primitive at import; the patcher starts from the object
# found here and replaces every reference to it.
PRIMITIVES: dict[str, tuple[str, str]] = {
    "gspmm": ("dgl.ops.spmm", "gspmm_internal"),
    "gspmm_hetero": ("dgl.ops.spmm", "gspmm_internal_hetero"),
    "gsddmm": ("dgl.ops.sddmm", "gsddmm_internal"),
    "gsddmm_hetero": ("dgl.ops.sddmm", "gsddmm_internal_hetero"),
    "edge_softmax": ("dgl.ops.edge_softmax", "edge_softmax_internal"),
    "edge_softmax_hetero": ("dgl.ops.edge_softmax", "edge_softmax_hetero_internal"),
    "gather_mm": ("dgl.ops.gather_mm", "gather_mm"),
    "segment_mm": ("dgl.ops.segment", "segment_mm"),
}

# The dense products of DGL's convolutions (matmul, nn.Linear, addmm).
DENSE_FUNCTIONS: dict[Callable[..., Any], str] = {
    torch.matmul: "matmul",
    torch.Tensor.matmul: "matmul",
    torch.Tensor.__matmul__: "matmul",
    torch.Tensor.__rmatmul__: "matmul",
    torch.mm: "mm",
    torch.Tensor.mm: "mm",
    torch.bmm: "bmm",
    torch.Tensor.bmm: "bmm",
    torch.addmm: "addmm",
    torch.nn.functional.linear: "linear",
}

DenseHandler = Callable[[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


class DenseOperands(NamedTuple):
    """A dense product ``x @ w (+ bias)``, or ``x @ w^T (+ bias)`` when ``linear``."""

    x: torch.Tensor
    w: torch.Tensor
    bias: torch.Tensor | None
    linear: bool


def call_argument(
    args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any
) -> Any:
    """Argument ``index`` / ``name`` of a torch call a plugin intercepted, else ``default``."""
    return args[index] if len(args) > index else kwargs.get(name, default)


def float32_on(devices: Iterable[str], *tensors: Any) -> bool:
    """Every one of ``tensors`` is a dense float32 tensor on one of ``devices`` (types like
    "cpu"). A sparse operand (``torch.sparse`` A @ X in a hand-written GCN) is not: plugins
    leave such a product in float32."""
    return all(
        isinstance(t, torch.Tensor)
        and t.layout == torch.strided
        and t.dtype == torch.float32
        and t.device.type in devices
        for t in tensors
    )


def dense_operands(
    kind: str, args: tuple[Any, ...], kwargs: dict[str, Any], devices: Iterable[str] = ("cpu",)
) -> DenseOperands | None:
    """The operands of a dense call a plugin may reroute, or None to leave the call as it is.

    Only the plain forms: float32 on ``devices``, a 2-d ``w``, a 1-d bias,
    ``addmm`` without ``beta`` / ``alpha`` scaling.
    """
    if kind == "linear":
        x = args[0] if args else kwargs.get("input")
        w = args[1] if len(args) > 1 else kwargs.get("weight")
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        linear = True
    elif kind in ("matmul", "mm"):
        if kwargs or len(args) != 2:
            return None
        x, w = args
        bias, linear = None, False
    elif kind == "addmm":
        if len(args) != 3 or any(k not in ("beta", "alpha") for k in kwargs):
            return None
        if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
            return None
        bias, x, w = args
        linear = False
    else:
        return None
    if not float32_on(devices, x, w) or w.dim() != 2 or x.dim() < 2:
        return None
    if bias is not None and not (float32_on(devices, bias) and bias.dim() == 1):
        return None
    return DenseOperands(x, w, bias, linear)


@dataclass
class PluginContext:
    """What a plugin may need to know about the run it is part of."""

    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    model: torch.nn.Module | None = None
    dataset: Any = None  # qtrain.data.base.NodeDataset
    plugins: tuple[str, ...] = ()  # every plugin of the session, in the recipe's order
    # the layer whose output feeds the softmax (a user's loop names it: qtrain.patch);
    # None: the model's ``output_layer``, where it has one
    output_layer: torch.nn.Module | None = None


@dataclass(frozen=True)
class NoOptions:
    """A plugin that takes no options."""


class _Busy(threading.local):
    """Whether this thread is inside one ``Patcher.functions`` handler: the torch calls
    the handler makes go straight through, as they would under a function mode."""

    active = False


def _intercepting(
    current: Callable[..., Any], kind: str, handler: DenseHandler, busy: _Busy
) -> Callable[..., Any]:
    def intercepted(*args: Any, **kwargs: Any) -> Any:
        if busy.active:
            return current(*args, **kwargs)
        busy.active = True
        try:
            return handler(kind, current, args, kwargs)
        finally:
            busy.active = False

    functools.update_wrapper(intercepted, current)  # keeps __name__, sets __wrapped__
    return intercepted


# tensor methods by the id of their original object (Tensor.matmul -> "matmul"), found
# once, before anything is patched; torch's own name wins over an alias (__abs__ = abs)
_TENSOR_METHODS: dict[int, tuple[Any, str]] = {
    id(value): (value, name)
    for owner in (torch.Tensor, torch._C.TensorBase)
    for name, value in vars(owner).items()
    if callable(value)
}


def _tensor_method(func: Any) -> str | None:
    entry = _TENSOR_METHODS.get(id(func))
    return entry[1] if entry is not None and entry[0] is func else None


def _module_slot(func: Any) -> tuple[dict[str, Any], str] | None:
    """The namespace and name a torch function is defined under (``torch.matmul``,
    ``torch._C._nn.linear``): where the object now standing for it is found."""
    module = sys.modules.get(getattr(func, "__module__", None) or "")
    name = getattr(func, "__name__", None)
    namespace = getattr(module, "__dict__", None)
    if not isinstance(namespace, dict) or not name or name not in namespace:
        return None
    return namespace, name


@dataclass
class _Replacement:
    namespace: dict[str, Any]
    key: str
    original: Any
    replacement: Any


@dataclass
class _AttributeReplacement:
    owner: type
    name: str
    original: Any  # _INHERITED: the owner had no attribute of its own
    replacement: Any


_INHERITED = object()


class Patcher:
    """Installs one plugin's patches and undoes exactly those."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._replacements: list[_Replacement] = []
        self._attributes: list[_AttributeReplacement] = []

    @staticmethod
    def current(primitive: str) -> Callable[..., Any]:
        """The object DGL currently calls for ``primitive``."""
        import_dgl()
        try:
            module_name, attr = PRIMITIVES[primitive]
        except KeyError:
            raise PluginError(
                f"unknown primitive {primitive!r}; known: {', '.join(PRIMITIVES)}"
            ) from None
        importlib.import_module(module_name)
        return getattr(sys.modules[module_name], attr)

    def wrap(self, primitive: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> int:
        """Replace ``primitive`` by ``make(current)`` everywhere; return the references changed."""
        original = self.current(primitive)
        replacement = make(original)
        return self.replace(original, replacement)

    def replace(self, original: Any, replacement: Any) -> int:
        """Point every module-level reference to ``original`` at ``replacement``."""
        return self._replace_all({id(original): (original, replacement)})[id(original)]

    def _replace_all(self, pairs: dict[int, tuple[Any, Any]]) -> dict[int, int]:
        """Every module-level reference to each original (keyed by its id) pointed at its
        replacement, in one pass over the loaded modules; references changed per original."""
        changed = dict.fromkeys(pairs, 0)
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for key, value in list(namespace.items()):
                pair = pairs.get(id(value))
                if pair is not None and pair[0] is value:
                    namespace[key] = pair[1]
                    self._replacements.append(_Replacement(namespace, key, value, pair[1]))
                    changed[id(value)] += 1
        for ident, n in changed.items():
            if n == 0:
                raise PluginError(
                    f"plugin {self.owner!r}: no module holds {pairs[ident][0]!r}; nothing to patch"
                )
        return changed

    def replace_attribute(self, owner: type, name: str, replacement: Any) -> None:
        """Set ``owner.name`` (a class's method, say DGL's ``HGTConv.forward``) to
        ``replacement`` until :meth:`restore`; the attribute must be the owner's own."""
        if name not in vars(owner):
            raise PluginError(f"plugin {self.owner!r}: {owner.__qualname__} has no own {name!r}")
        self._set_attribute(owner, name, replacement)

    def dense(self, handler: DenseHandler) -> None:
        """Send dense products to ``handler(kind, func, args, kwargs)`` while active."""
        self.functions(DENSE_FUNCTIONS, handler)

    def functions(self, table: dict[Callable[..., Any], str], handler: DenseHandler) -> None:
        """Send calls of the torch functions and tensor methods in ``table`` (original
        object -> kind) to ``handler(kind, func, args, kwargs)``, ``func`` being what the
        call would have reached (another plugin's interception, or torch's). Inside the
        handler, the table's functions go straight through. A call through a reference
        kept outside any module's namespace (``self.act = F.relu`` stored before the
        session) is not seen."""
        busy = _Busy()
        in_modules: dict[int, tuple[Any, Any]] = {}
        for func, kind in table.items():
            method = _tensor_method(func)
            if method is not None:
                current = getattr(torch.Tensor, method)
                self._set_attribute(
                    torch.Tensor, method, _intercepting(current, kind, handler, busy)
                )
                continue
            slot = _module_slot(func)
            if slot is None:
                raise PluginError(
                    f"plugin {self.owner!r}: {func!r} is neither a tensor method nor found "
                    "in its module; cannot intercept it"
                )
            current = slot[0][slot[1]]
            in_modules[id(current)] = (current, _intercepting(current, kind, handler, busy))
        if in_modules:
            self._replace_all(in_modules)

    def _set_attribute(self, owner: type, name: str, replacement: Any) -> None:
        original = vars(owner).get(name, _INHERITED)
        setattr(owner, name, replacement)
        self._attributes.append(_AttributeReplacement(owner, name, original, replacement))

    def restore(self) -> None:
        """Undo this patcher's changes, newest first."""
        while self._attributes:
            a = self._attributes.pop()
            if vars(a.owner).get(a.name) is a.replacement:
                if a.original is _INHERITED:
                    delattr(a.owner, a.name)
                else:
                    setattr(a.owner, a.name, a.original)
            else:
                warnings.warn(
                    f"plugin {self.owner!r}: {a.owner.__qualname__}.{a.name} was changed by "
                    "someone else while patched; left as it is",
                    RuntimeWarning,
                    stacklevel=2,
                )
        while self._replacements:
            r = self._replacements.pop()
            if r.namespace.get(r.key) is r.replacement:
                r.namespace[r.key] = r.original
            else:
                warnings.warn(
                    f"plugin {self.owner!r}: {r.key} was changed by someone else while patched; "
                    "left as it is",
                    RuntimeWarning,
                    stacklevel=2,
                )


@dataclass(frozen=True)
class Calibration:
    """What a plugin's calibration measured (``qtrain calibrate``, ``bits = "auto"``): per
    candidate bit count, Error_X of the first layer's output (tango-sc23 eq. 4) and, where
    measured, the relative error of one step's parameter gradients; which of the two
    ``criterion`` chose by, and the count chosen."""

    bits: int
    error_x: dict[int, float]
    target: float  # of the criterion's measure
    met: bool  # False when even 8 bits is above the target (8 is then used)
    layer: str = "layers.0"
    shape: tuple[int, ...] = field(default=())
    gradient_error: dict[int, float] = field(default_factory=dict)
    criterion: str = "error_x"  # "error_x" or "gradient"

    def to_json(self) -> dict[str, Any]:
        return {
            "bits": self.bits,
            "criterion": self.criterion,
            "error_x": _by_bits(self.error_x),
            "gradient_error": _by_bits(self.gradient_error),
            "target": self.target,
            "target_met": self.met,
            "layer": self.layer,
            "shape": list(self.shape),
        }


def _by_bits(errors: dict[int, float]) -> dict[str, float | None]:
    """A table keyed by bit count as JSON holds it; a non-finite error (a step whose
    gradient overflowed) is null, never the invalid JSON ``Infinity``."""
    return {str(b): e if math.isfinite(e) else None for b, e in sorted(errors.items())}


class Plugin:
    """Base class of every plugin: typed config, activate, deactivate, report, and
    optionally calibrate (the bit count ``qtrain calibrate`` picks)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Config: ClassVar[type] = NoOptions
    # plugins that must come after this one in quant.plugin when both are listed (a later
    # plugin wraps what the earlier ones installed); the recipe refuses the other order
    listed_before: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Any, context: PluginContext) -> None:
        self.config = config
        self.context = context

    def activate(self, patcher: Patcher) -> None:
        """Install this plugin's patches through ``patcher``."""
        raise NotImplementedError

    def deactivate(self) -> None:
        """Release anything beyond the patches (the patcher undoes those)."""

    def report(self) -> dict[str, Any]:
        """What this plugin measured, for the run summary."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to draw what this run would have drawn next (its
        random-stream position, say): ints, floats, strings and tensors. Default: none."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave, after :meth:`activate`."""

    @classmethod
    def calibrate(
        cls,
        config: Any,
        model: Any,
        graph: Any,
        *,
        seed: int,
        device: torch.device,
        target: float | None = None,
        metric: str = "accuracy",
    ) -> Calibration:
        """Choose this plugin's bit count on ``model`` over ``graph`` before training
        (``qtrain calibrate``); ``target`` overrides the config's; ``metric`` is the
        dataset's (it names the loss a run trains with). Optional."""
        raise NotImplementedError(f"plugin {cls.name!r} does not calibrate")

    @classmethod
    def reads_only_in_csr(
        cls, config: Any, model: torch.nn.Module, plugins: tuple[str, ...], device: torch.device
    ) -> bool:
        """Whether, with this plugin active among ``plugins``, every full-graph training
        step of ``model`` on ``device`` reads the graph only through its in-CSR (DGL's CSC),
        so the run may hold the graph as nothing else (``qtrain.train.prepare``). Default:
        no; DGL's own backward reads the CSR, qtrain's kernels the COO."""
        return False

    @classmethod
    def calibrates(cls) -> bool:
        """Whether this plugin implements :meth:`calibrate`."""
        return cls.calibrate.__func__ is not Plugin.calibrate.__func__  # type: ignore[attr-defined]


discovery_errors: list[str] = []


def import_builtin_plugins() -> None:
    """Import ``qtrain.plugins``, the top-level ``plugins/`` folder, which installing the
    package maps there (pyproject's package-dir); in a checkout that is not installed (a
    GPU machine runs one as it is) the same mapping is made here."""
    if importlib.util.find_spec("qtrain.plugins") is None:
        folder = Path(__file__).resolve().parents[1] / "plugins"
        if not (folder / "__init__.py").exists():
            raise PluginError(f"the built-in plugins are missing: no qtrain.plugins, no {folder}")
        spec = importlib.util.spec_from_file_location(
            "qtrain.plugins", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["qtrain.plugins"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules["qtrain.plugins"]
            raise
    importlib.import_module("qtrain.plugins")


def _discover() -> None:
    """Register the built-in plugins and those of installed packages."""
    import_builtin_plugins()
    for ep in entry_points(group="qtrain.plugins"):
        if ep.name in PLUGINS._entries:
            continue
        try:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Plugin)):
                raise TypeError(f"{ep.value} is not a qtrain.plugin.Plugin subclass")
            PLUGINS.add(ep.name, cls, options=cls.Config, summary=cls.summary)
        except Exception as exc:  # a broken third-party plugin must not break qtrain
            discovery_errors.append(f"entry point {ep.name!r} ({ep.value}): {exc}")


PLUGINS: Registry[type[Plugin]] = Registry("plugin", loader=_discover)


def register_plugin(cls: type[Plugin]) -> type[Plugin]:
    """Class decorator for built-in and programmatic plugins."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a class attribute `name`")
    PLUGINS.add(cls.name, cls, options=cls.Config, summary=cls.summary)
    return cls


class PatchSession:
    """Plugins activated together; a context manager, or activate()/deactivate()."""

    def __init__(self, quant: Any, context: PluginContext | None = None) -> None:
        self.names: list[str] = list(quant.plugins)
        self.context = dataclasses.replace(context or PluginContext(), plugins=tuple(self.names))
        self.plugins: list[Plugin] = [
            PLUGINS.get(name).factory(quant.configs[name], self.context) for name in self.names
        ]
        self._patchers: list[Patcher] = []

    @property
    def active(self) -> bool:
        return bool(self._patchers)

    def activate(self) -> PatchSession:
        if self.active:
            raise PluginError("this patch session is already active")
        try:
            for plugin in self.plugins:
                patcher = Patcher(plugin.name)
                self._patchers.append(patcher)
                plugin.activate(patcher)
        except BaseException:
            self.deactivate()
            raise
        return self

    def deactivate(self) -> None:
        for plugin, patcher in reversed(list(zip(self.plugins, self._patchers, strict=False))):
            try:
                plugin.deactivate()
            finally:
                patcher.restore()
        self._patchers.clear()

    def report(self) -> dict[str, Any]:
        return {p.name: p.report() for p in self.plugins}

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Each plugin's resume state, by name (``qtrain.train.resume``)."""
        return {p.name: p.state_dict() for p in self.plugins}

    def load_state_dict(self, state: dict[str, dict[str, Any]]) -> None:
        if sorted(state) != sorted(self.names):
            raise PluginError(
                f"the resume state has plugins {sorted(state)}, this run {sorted(self.names)}"
            )
        for plugin in self.plugins:
            plugin.load_state_dict(state[plugin.name])

    def __enter__(self) -> PatchSession:
        return self.activate()

    def __exit__(self, *exc: object) -> None:
        self.deactivate()


def calibrator(quant: Any) -> tuple[type[Plugin], Any]:
    """The plugin ``qtrain calibrate`` asks, with its config: the one plugin of the
    recipe's ``[quant]`` that calibrates, else the one registered plugin that does,
    with its defaults."""
    listed = [name for name in quant.plugins if PLUGINS.get(name).factory.calibrates()]
    if len(listed) > 1:
        raise RecipeError(
            f"quant.plugin lists several plugins that calibrate ({', '.join(listed)}); "
            "qtrain calibrate picks one bit count: keep one of them"
        )
    if listed:
        return PLUGINS.get(listed[0]).factory, quant.configs[listed[0]]
    able = [name for name in PLUGINS.names() if PLUGINS.get(name).factory.calibrates()]
    if len(able) != 1:
        raise RecipeError(
            "qtrain calibrate needs one plugin that calibrates in quant.plugin; "
            f"registered ones that do: {one_of(able)}"
        )
    entry = PLUGINS.get(able[0])
    return entry.factory, entry.parse({}, f"quant.{able[0]}")


def reads_only_in_csr(quant: Any, model: torch.nn.Module, device: torch.device) -> bool:
    """Whether a full-graph run with ``quant``'s plugins reads ``model``'s graph only
    through its in-CSR: every plugin of the recipe says so (and there is one at least)."""
    names = tuple(quant.plugins)
    return bool(names) and all(
        PLUGINS.get(name).factory.reads_only_in_csr(quant.configs[name], model, names, device)
        for name in names
    )


def activated(quant: Any, context: PluginContext | None = None) -> PatchSession:
    """The plugins of a recipe's ``[quant]`` section, ready to enter."""
    return PatchSession(quant, context)
