"""Dropout keyed by global node id: the mask kernel against its reference, and the module."""

from __future__ import annotations

import contextlib

import pytest
import torch

from qtrain._compat import import_dgl
from qtrain.models.dropout import NodeDropout, row_ids
from qtrain.ops import dispatch, masks
from qtrain.quant import rowwise


def test_keep_mask_front_uses_the_kernel_and_the_reference_agrees() -> None:
    ids = torch.randperm(5000)[:333]
    dispatch.reset()
    got = masks.keep_mask(ids, 13, 0.4, seed=11)
    assert dispatch.snapshot() == {"dropout-mask": {"ext-cpu": 1}}
    assert torch.equal(got, masks.keep_mask(ids, 13, 0.4, seed=11, backend="reference"))
    assert masks.keep_mask(torch.empty(0, dtype=torch.int64), 7, 0.5, 1).numel() == 0


def test_a_rows_mask_depends_only_on_its_id() -> None:
    ids = torch.tensor([7, 3, 9, 3])
    mask = rowwise.unpack_bits(masks.keep_mask(ids, 40, 0.5, 2), 1, 160).reshape(4, 40)
    assert torch.equal(mask[1], mask[3])
    alone = rowwise.unpack_bits(masks.keep_mask(ids[2:3], 40, 0.5, 2), 1, 40)
    assert torch.equal(alone, mask[2])
    for backend in ("auto", "reference"):  # the kernel's front and the reference refuse alike
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            masks.keep_mask(ids, 4, 1.5, 0, backend)
        with pytest.raises(TypeError, match="int64"):
            masks.keep_mask(ids.int(), 4, 0.5, 0, backend)
        with pytest.raises(ValueError, match=r"\[0, 2\^62 / width\)"):
            masks.keep_mask(torch.tensor([-1]), 4, 0.5, 0, backend)


def _saved_bytes(fn: object) -> int:
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()  # type: ignore[operator]
    return total


def test_keyed_dropout_scales_kept_elements_saving_a_float_or_a_1_bit_mask() -> None:
    ids = torch.arange(50) * 3
    kept = rowwise.unpack_bits(masks.keep_mask(ids, 6, 0.25, 4), 1, 300).reshape(50, 6).bool()
    scale = torch.tensor(1 / 0.75, dtype=torch.float32)
    calls = []
    for packed in (False, True):
        x = torch.randn(50, 6, requires_grad=True)
        with contextlib.ExitStack() as stack:
            if packed:  # what the exact plugin asks for
                stack.enter_context(masks.packed_dropout_masks(lambda: calls.append(1)))
            y = masks.keyed_dropout(x, ids, 0.25, seed=4)
            saved = _saved_bytes(lambda x=x: masks.keyed_dropout(x, ids, 0.25, seed=4))
        assert torch.equal(y, torch.where(kept, x * scale, torch.zeros(()))), packed
        y.backward(torch.ones_like(y))
        assert torch.equal(x.grad, torch.where(kept, scale, torch.zeros(())).expand(50, 6))
        # torch's dropout keeps a float32 mask; exact's rule is one bit per element
        assert saved == (38 if packed else 4 * 300)
    assert len(calls) == 2
    x = torch.randn(50, 6)
    assert torch.equal(masks.keyed_dropout(x, ids, 0.0, 1), x)
    assert not masks.keyed_dropout(x, ids, 1.0, 1).any()
    with pytest.raises(ValueError, match="shape"):
        masks.keyed_dropout(x, ids[:3], 0.5, 1)


def test_node_dropout_draws_per_node_and_step() -> None:
    dgl = import_dgl()
    torch.manual_seed(0)
    drop = NodeDropout(0.5)
    g = dgl.graph(([0, 1, 2, 3], [1, 2, 3, 4]), num_nodes=6)
    h = torch.ones(6, 8)
    torch.manual_seed(0)
    same = NodeDropout(0.5)
    whole = drop(h, g)
    # a subgraph holding nodes 4, 1, 5 draws their rows of the whole graph's mask
    sub = dgl.node_subgraph(g, torch.tensor([4, 1, 5]))
    part = same(h[[4, 1, 5]], sub)
    assert torch.equal(part, whole[[4, 1, 5]])
    assert not torch.equal(drop(h, g), whole)  # the next step draws a new mask
    drop.eval()
    assert drop(h, g) is h
    block = dgl.to_block(g, torch.tensor([1, 2]))
    assert torch.equal(row_ids(block, block.num_dst_nodes(), h.device), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="rows"):
        row_ids(g, 5, h.device)
