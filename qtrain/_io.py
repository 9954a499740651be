"""Keeping standard output machine-readable while libraries print to it.

DGL prints METIS and partition timings to file descriptor 1 from C++, so a
``redirect_stdout`` alone is not enough: the descriptor itself is pointed at
standard error while training runs, and restored afterwards.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout (Python and C level) to stderr."""
    sys.stdout.flush()
    try:
        fd_out = sys.__stdout__.fileno() if sys.__stdout__ else 1
        saved = os.dup(fd_out)
    except (OSError, ValueError, AttributeError):
        saved = None  # no real descriptor (embedded interpreters): Python-level only
    try:
        if saved is not None:
            os.dup2(sys.__stderr__.fileno() if sys.__stderr__ else 2, fd_out)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, fd_out)
            os.close(saved)
