"""Imported for its effect: qtrain from this checkout comes first on ``sys.path``.

A lent GPU machine has the op library built in place (``ext/cuda_build.py --in-place``),
not installed, so a benchmark run there as ``python3 bench/<name>.py`` finds ``qtrain`` only
through the checkout (and a pip install made by a running process would not be importable
until a new interpreter started)."""

from __future__ import annotations

import sys

from _record import ROOT

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
