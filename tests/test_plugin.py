"""Patching DGL: every primitive call reaches the plugin, and deactivation restores DGL exactly."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

import qtrain
from qtrain._compat import import_dgl
from qtrain.config import option
from qtrain.errors import PluginError
from qtrain.plugin import PLUGINS, PRIMITIVES, Patcher, Plugin, PluginContext, _discover

dgl = import_dgl()
from dgl.nn import GATConv, GCN2Conv, GraphConv, SAGEConv  # noqa: E402


def _graph(n: int = 30, e: int = 120, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    g = dgl.rand_graph(n, e)
    return dgl.add_self_loop(dgl.remove_self_loop(g))


def _primitive_ids() -> set[int]:
    """Ids of the objects DGL currently calls for each primitive."""
    return {id(Patcher.current(p)) for p in PRIMITIVES}


def _references(targets: set[int] | None = None) -> dict[tuple[str, str], int]:
    """Every module-level name bound to one of ``targets`` (default: the primitives now)."""
    targets = _primitive_ids() if targets is None else targets
    refs = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            if id(value) in targets:
                refs[(name, key)] = id(value)
    return refs


def _run_models(g: Any, x: torch.Tensor) -> list[torch.Tensor]:
    torch.manual_seed(1)
    models = [GraphConv(8, 4), SAGEConv(8, 4, "mean"), GATConv(8, 4, num_heads=2)]
    outs = []
    for m in models:
        y = m(g, x)
        y.sum().backward()
        outs.append(y.detach())
    gcn2 = GCN2Conv(8, layer=1)
    y = gcn2(g, x, x)
    y.sum().backward()
    outs.append(y.detach())
    return outs


def test_trace_sees_every_primitive_of_unmodified_dgl_modules() -> None:
    g, x = _graph(), torch.randn(30, 8)
    with qtrain.patch("trace", log=True) as session:
        _run_models(g, x)
    calls = session.report()["trace"]["calls"]
    assert calls["gspmm"]["copy_lhs/sum"] >= 3  # GraphConv, SAGEConv (mean = sum/deg), GCN2Conv
    assert "u_mul_e" not in calls["gspmm"]  # DGL names it by op
    assert calls["gspmm"]["mul/sum"] >= 1  # GATConv's u_mul_e aggregation with attention
    assert calls["gsddmm"]["add(u,v)"] >= 1  # GATConv's el + er
    assert calls["edge_softmax"]["dst"] == 1
    assert calls["dense"]["matmul"] >= 1  # GraphConv's th.matmul(feat, weight)
    assert calls["dense"]["linear"] >= 2  # SAGEConv's and GATConv's nn.Linear
    plugin = session.plugins[0]
    assert any(p == "gspmm" and shapes for p, _, shapes in plugin.log)


def test_trace_changes_no_numbers() -> None:
    g, x = _graph(), torch.randn(30, 8)
    plain = _run_models(g, x)
    with qtrain.patch("trace"):
        traced = _run_models(g, x)
    for a, b in zip(plain, traced, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_deactivation_restores_dgl_exactly() -> None:
    originals = _primitive_ids()
    before = _references(originals)
    assert len(before) > len(PRIMITIVES), "expected DGL to bind its primitives in several modules"
    session = qtrain.patch("trace")
    session.activate()
    assert not _references(originals), "some references to DGL primitives were left unpatched"
    assert len(_references()) == len(before)  # the wrappers sit exactly where the originals were
    session.deactivate()
    assert _references(originals) == before
    assert _primitive_ids() == originals
    assert not session.active


def test_restore_after_an_exception_inside_the_block() -> None:
    before = _references()
    with pytest.raises(RuntimeError, match="boom"), qtrain.patch("trace"):
        raise RuntimeError("boom")
    assert _references() == before


def test_blocks_for_minibatch_training_are_patched_too() -> None:
    g = _graph(60, 300)
    sampler = dgl.dataloading.NeighborSampler([4, 4])
    loader = dgl.dataloading.DataLoader(g, torch.arange(10), sampler, batch_size=10)
    _, _, blocks = next(iter(loader))
    conv = GraphConv(8, 4)
    x = torch.randn(blocks[0].num_src_nodes(), 8)
    with qtrain.patch("trace") as session:
        conv(blocks[0], x).sum().backward()
    assert session.report()["trace"]["calls"]["gspmm"]["copy_lhs/sum"] >= 1


@dataclass(frozen=True)
class _ScaleConfig:
    factor: float = option(2.0, "multiply SpMM outputs by this")


class _ScaleSpmm(Plugin):
    """A plugin that changes numbers, to prove the patched function is the one that runs."""

    name = "test-scale-spmm"
    summary = "test only"
    Config = _ScaleConfig
    order: ClassVar[list[str]] = []

    def activate(self, patcher: Patcher) -> None:
        def make(inner: Any) -> Any:
            def scaled(*args: Any) -> Any:
                _ScaleSpmm.order.append(self.name)
                return inner(*args) * self.config.factor

            return scaled

        patcher.wrap("gspmm", make)


@pytest.fixture
def scale_plugin() -> Any:
    PLUGINS.names()  # load built-ins first
    PLUGINS.add(_ScaleSpmm.name, _ScaleSpmm, options=_ScaleConfig, summary="test")
    yield _ScaleSpmm
    del PLUGINS._entries[_ScaleSpmm.name]
    _ScaleSpmm.order.clear()


def test_patched_kernel_really_runs_and_composes(scale_plugin: Any) -> None:
    g, x = _graph(), torch.randn(30, 8)
    conv = GraphConv(8, 4, bias=False)
    plain = conv(g, x).detach()
    with qtrain.patch(scale_plugin.name, factor=3.0):
        scaled = conv(g, x).detach()
    torch.testing.assert_close(scaled, plain * 3.0)
    with qtrain.patch({"plugin": ["trace", scale_plugin.name]}) as session:
        conv(g, x)
    assert session.names == ["trace", scale_plugin.name]
    assert session.report()["trace"]["calls"]["gspmm"]["copy_lhs/sum"] == 1
    torch.testing.assert_close(conv(g, x).detach(), plain)


def test_unknown_plugin_and_bad_option_are_one_line_errors(scale_plugin: Any) -> None:
    with pytest.raises(PluginError, match=r"unknown plugin 'nope'; registered: .*'trace'"):
        qtrain.patch("nope")
    with pytest.raises(PluginError, match=r"quant\.test-scale-spmm\.factor .* must be a number"):
        qtrain.patch(scale_plugin.name, factor="big")
    with pytest.raises(
        PluginError, match=r"unknown key quant\.trace\.colour; allowed keys: dense, log"
    ):
        qtrain.patch("trace", colour=True)


def test_entry_point_plugins_are_discovered(monkeypatch: pytest.MonkeyPatch) -> None:
    class _EP:
        def __init__(self, name: str, obj: Any) -> None:
            self.name, self.value, self._obj = name, f"fake:{name}", obj

        def load(self) -> Any:
            if isinstance(self._obj, Exception):
                raise self._obj
            return self._obj

    class ThirdParty(Plugin):
        name = "third-party"
        summary = "from an installed package"

        def activate(self, patcher: Patcher) -> None:
            patcher.wrap("edge_softmax", lambda inner: inner)

    fake = [_EP("third-party", ThirdParty), _EP("broken", ImportError("no module named x"))]
    monkeypatch.setattr("qtrain.plugin.entry_points", lambda group: fake)
    monkeypatch.setattr("qtrain.plugin.discovery_errors", [])
    monkeypatch.setattr(PLUGINS, "_entries", {})
    monkeypatch.setattr(PLUGINS, "_loaded", True)
    import qtrain.plugins.trace as trace_module

    PLUGINS.add("trace", trace_module.TracePlugin, options=trace_module.TraceConfig, summary="")
    _discover()
    assert "third-party" in PLUGINS.names()
    import qtrain.plugin as plugin_module

    assert any("broken" in e and "no module named x" in e for e in plugin_module.discovery_errors)
    with qtrain.patch("third-party") as session:
        pass
    assert session.names == ["third-party"]


def test_plugin_that_patches_nothing_fails_clearly() -> None:
    patcher = Patcher("empty")
    with pytest.raises(PluginError, match="nothing to patch"):
        patcher.replace(object(), object())


def test_activation_failure_rolls_back(scale_plugin: Any) -> None:
    class Failing(Plugin):
        name = "failing"

        def activate(self, patcher: Patcher) -> None:
            patcher.wrap("gsddmm", lambda inner: inner)
            raise PluginError("cannot activate")

    PLUGINS.add("failing", Failing, options=Failing.Config, summary="test")
    try:
        before = _references()
        with (
            pytest.raises(PluginError, match="cannot activate"),
            qtrain.patch({"plugin": ["trace", "failing"]}),
        ):
            pass
        assert _references() == before
    finally:
        del PLUGINS._entries["failing"]


def test_context_defaults() -> None:
    ctx = PluginContext()
    assert ctx.seed == 0 and ctx.device == torch.device("cpu")


def test_calibrate_asks_the_recipes_calibrating_plugin() -> None:
    """``qtrain calibrate`` reaches tango through the plugin hook, with the recipe's config."""
    from qtrain.plugin import PLUGINS, calibrator
    from qtrain.recipe import parse_quant

    quant = parse_quant(
        {"plugin": ["trace", "tango"], "tango": {"bits": 4, "error_x_target": 0.125}}
    )
    plugin, config = calibrator(quant)
    assert plugin is PLUGINS.get("tango").factory and config.error_x_target == 0.125


def test_calibrate_without_a_calibrating_plugin_uses_the_registered_one() -> None:
    from qtrain.plugin import PLUGINS, calibrator
    from qtrain.recipe import parse_quant

    plugin, config = calibrator(parse_quant({"plugin": ["trace"]}))
    assert plugin is PLUGINS.get("tango").factory
    assert config == PLUGINS.get("tango").parse({}, "quant.tango")


def test_a_plugin_that_does_not_calibrate_says_so() -> None:
    from qtrain.plugin import PLUGINS

    trace = PLUGINS.get("trace").factory
    assert not trace.calibrates() and PLUGINS.get("tango").factory.calibrates()
    with pytest.raises(NotImplementedError, match="'trace' does not calibrate"):
        trace.calibrate(None, None, None, seed=0, device=torch.device("cpu"))


def test_the_builtin_plugins_load_from_a_checkout_that_is_not_installed() -> None:
    """A GPU machine runs the checkout as it is: without the install's mapping of
    qtrain.plugins to plugins/, discovery makes the same mapping itself."""
    import subprocess
    from pathlib import Path

    code = (
        "import sys, importlib.util\n"
        "sys.meta_path[:] = [f for f in sys.meta_path\n"
        "                    if '__editable__' not in getattr(f, '__module__', '')]\n"
        "assert importlib.util.find_spec('qtrain.plugins') is None, 'still installed'\n"
        "from qtrain.plugin import PLUGINS\n"
        "names = sorted(PLUGINS.names())\n"
        "import qtrain.plugins.tango.functions as f\n"
        "print(names, f.__file__)\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'exact', 'hector', 'tango', 'trace'" in done.stdout
    assert done.stdout.strip().endswith(str(root / "plugins" / "tango" / "functions.py"))


# ------------------------------------------------------------ intercepted torch functions

_DENSE_SPOTS = ("matmul", "mm", "__matmul__", "__rmatmul__", "bmm")


def _dense_state() -> tuple[Any, ...]:
    """What torch.Tensor and torch's namespaces hold for the dense products now."""
    import torch.nn.functional as F

    own = tuple(vars(torch.Tensor).get(name) for name in _DENSE_SPOTS)
    return own, torch.matmul, torch.mm, torch.addmm, F.linear, torch._C._nn.linear


def test_every_spelling_of_a_dense_product_reaches_the_handler_and_restores_exactly() -> None:
    import torch.nn.functional as F

    before = _dense_state()
    seen: list[str] = []

    def handler(kind: str, func: Any, args: tuple, kwargs: dict) -> Any:
        seen.append(kind)
        return func(*args, **kwargs)

    patcher = Patcher("test")
    patcher.dense(handler)
    x, w, b = torch.randn(5, 3), torch.randn(3, 4), torch.randn(4)
    try:
        ys = [x @ w, x.matmul(w), torch.matmul(x, w), torch.mm(x, w), x.mm(w)]
        ys += [torch.addmm(b, x, w) - b, F.linear(x, w.t()), torch.nn.Linear(3, 4)(x) * 0 + x @ w]
    finally:
        patcher.restore()
    assert seen == ["matmul"] * 3 + ["mm"] * 2 + ["addmm", "linear", "linear", "matmul"]
    for y in ys:
        torch.testing.assert_close(y, x @ w)
    assert _dense_state() == before
    assert "matmul" not in vars(torch.Tensor) and "__matmul__" not in vars(torch.Tensor)
    x @ w  # nothing is seen once restored
    assert len(seen) == 9


def test_two_interceptions_compose_later_outside_and_calls_inside_a_handler_go_through() -> None:
    order: list[str] = []

    def named(tag: str) -> Any:
        def handler(kind: str, func: Any, args: tuple, kwargs: dict) -> Any:
            order.append(tag)
            # a product inside the handler does not come back to it (nor loop forever)
            inner = torch.matmul(args[0], args[1])
            return func(*args, **kwargs) + 0 * inner

        return handler

    first, second = Patcher("first"), Patcher("second")
    first.dense(named("first"))
    second.dense(named("second"))
    x = torch.randn(2, 2)
    try:
        torch.matmul(x, x)
        x @ x
    finally:
        second.restore()
        first.restore()
    # the inner torch.matmul of "second" passes through "first" (another plugin's handler)
    assert order == ["second", "first", "first"] * 2
    assert "__matmul__" not in vars(torch.Tensor)
    assert torch.matmul is torch._C._VariableFunctions.matmul


def test_a_function_that_cannot_be_found_is_a_plugin_error() -> None:
    def loose(x: Any) -> Any:
        return x

    patcher = Patcher("test")
    with pytest.raises(PluginError, match=r"plugin 'test': .*loose.* cannot intercept it"):
        patcher.functions({loose: "loose"}, lambda kind, func, args, kwargs: None)
    patcher.restore()
