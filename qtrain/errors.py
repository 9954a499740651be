"""Errors that the CLI turns into one line on stderr (exit status 2, or 1 for ``RunFailed``).

Anything raised as a ``QtrainError`` is the user's input being wrong (or the
environment missing something the user must provide). It must say what is
wrong and what is allowed; the CLI prints it without a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class QtrainError(Exception):
    """Bad input: a recipe key, a dataset path, a plugin name, a file."""


class RecipeError(QtrainError):
    """A recipe key has a wrong value, type or name."""


class DatasetError(QtrainError):
    """A dataset is missing, corrupt or not allowed to be read."""


class PluginError(QtrainError):
    """A plugin is unknown or cannot be activated as configured."""


class RunFailed(Exception):
    """The run started but could not finish (a worker died): one line, exit status 1."""


class RunDiverged(RunFailed):
    """The loss or the parameters stopped being finite: the run ends "diverged", exit 1."""


def one_of(allowed: Iterable[object]) -> str:
    """Render a list of allowed values for an error message."""
    items = [repr(a) if isinstance(a, str) else str(a) for a in allowed]
    if not items:
        return "(none registered)"
    return "one of " + ", ".join(items)
