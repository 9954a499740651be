"""A stop signal is never lost, even when Python drops the interrupt it raised."""

from __future__ import annotations

import signal
import sys
from typing import Any

import pytest

from qtrain import signals


def test_an_interrupt_dropped_in_a_finalizer_stops_at_the_next_check(stop_handlers: None) -> None:
    class Finalized:
        def __del__(self) -> None:  # a signal handled here: Python would print and drop it
            signals._stop(signal.SIGTERM, None)

    signals.raise_if_stopped()  # nothing requested: nothing raised
    Finalized()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # later SIGTERMs ignored
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        signals.raise_if_stopped()


def test_a_signal_landing_in_a_finalizer_prints_no_traceback(
    stop_handlers: None, monkeypatch: pytest.MonkeyPatch
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


def test_a_signal_anywhere_else_interrupts_at_once(stop_handlers: None) -> None:
    with pytest.raises(KeyboardInterrupt, match="SIGINT"):
        signals._stop(signal.SIGINT, sys._getframe())
