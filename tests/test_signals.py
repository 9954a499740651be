"""A stop signal is never lost, even when Python drops the interrupt it raised."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from qtrain import signals


@pytest.fixture
def handlers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(signals, "_requested", [])
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGINT, saved[1])


def test_an_interrupt_dropped_in_a_finalizer_stops_at_the_next_check(handlers: None) -> None:
    class Finalized:
        def __del__(self) -> None:  # a signal handled here: Python would print and drop it
            signals._stop(signal.SIGTERM, None)

    signals.raise_if_stopped()  # nothing requested: nothing raised
    Finalized()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # later SIGTERMs ignored
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        signals.raise_if_stopped()


def test_a_signal_landing_in_a_finalizer_prints_no_traceback(
    handlers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    dropped: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)

    class Finalized:
        def __del__(self) -> None:  # the handler sees the interrupted frame: this one
            signals._stop(signal.SIGTERM, sys._getframe())

    Finalized()
    assert dropped == []  # nothing raised inside __del__, so nothing printed
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        signals.raise_if_stopped()


def test_a_signal_anywhere_else_interrupts_at_once(handlers: None) -> None:
    with pytest.raises(KeyboardInterrupt, match="SIGINT"):
        signals._stop(signal.SIGINT, sys._getframe())
