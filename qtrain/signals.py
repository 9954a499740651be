"""Stop signals: SIGTERM (schedulers, ``timeout``, the distributed launcher) stops a run as
Ctrl-C does.

The handler raises KeyboardInterrupt, which the run turns into an "interrupted" summary
that keeps the metrics and the best checkpoint. An exception raised inside a finalizer or
a weakref callback is printed and dropped by Python ("Exception ignored in ..."), so the
request is also remembered: the trainer calls ``raise_if_stopped`` at every epoch and
batch, and a dropped interrupt stops the run there. A signal that lands in a ``__del__``
is only remembered (raising there would print a traceback and be dropped anyway). After the first stop signal, further
SIGTERMs are ignored (a launcher stopping workers that are already winding down cannot
cut their summary short); a second Ctrl-C still interrupts the wind-down.
"""

from __future__ import annotations

import signal
from typing import Any

_requested: list[str] = []  # the name of the first stop signal received, if any


def _in_finalizer(frame: Any) -> bool:
    """Whether ``frame`` runs inside a ``__del__`` (where Python drops what is raised)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _stop(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    if not _requested:
        _requested.append(name)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if _in_finalizer(frame):
        return  # remembered: raise_if_stopped raises it at the next epoch or batch
    raise KeyboardInterrupt(name)


def install() -> None:
    """Route SIGTERM and SIGINT to ``_stop`` (call from the main thread of a process that
    qtrain owns: the ``qtrain`` command and its workers)."""
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)


def raise_if_stopped() -> None:
    """Raise KeyboardInterrupt if a stop signal came and its interrupt was lost."""
    if _requested:
        raise KeyboardInterrupt(_requested[0])
