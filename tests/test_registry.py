"""The registry: lazy loading of the built-in entries."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from qtrain.registry import Registry


@dataclass(frozen=True)
class _NoOptions:
    pass


def test_a_failed_loader_is_retried_not_forgotten() -> None:
    attempts = []

    def loader() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise ImportError("a loader module failed to import")
        registry.add("b", object, options=_NoOptions, summary="loaded on the second try")

    registry: Registry[object] = Registry("thing", loader=loader)
    with pytest.raises(ImportError):
        registry.names()
    assert registry.names() == ["b"] and len(attempts) == 2
    assert registry.names() == ["b"] and len(attempts) == 2  # loaded once it succeeded
