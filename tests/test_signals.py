"""A stop signal is never lost, even when Python drops the interrupt it raised."""

from __future__ import annotations

import signal

import pytest

from qtrain import signals


def test_an_interrupt_dropped_in_a_finalizer_stops_at_the_next_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(signals, "_requested", [])
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    class Finalized:
        def __del__(self) -> None:  # a signal handled here: Python prints and drops it
            signals._stop(signal.SIGTERM, None)

    try:
        signals.raise_if_stopped()  # nothing requested: nothing raised
        Finalized()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # later SIGTERMs ignored
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            signals.raise_if_stopped()
    finally:
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGINT, saved[1])
