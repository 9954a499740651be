"""Named registries of models and datasets (plugins have their own in ``plugin.py``).

A registry maps a name used in recipes to a factory plus the dataclass of
options that factory takes, so that the CLI can list what is available and
the recipe can validate a table before anything is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from qtrain.config import OptionInfo, describe, parse_section
from qtrain.errors import RecipeError, one_of

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Entry(Generic[F]):
    """One registered name: its factory, options and a one-line summary."""

    name: str
    factory: F
    options: type
    summary: str
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def parse(self, table: Mapping[str, Any], where: str) -> Any:
        """Validate a recipe table (its ``name`` key aside) into this entry's options."""
        return parse_section(
            self.options, table, where, defaults=self.defaults, ignore=frozenset({"name"})
        )

    def describe(self) -> list[OptionInfo]:
        return describe(self.options, self.defaults)


class Registry(Generic[F]):
    """Names to entries; ``kind`` ("model", "dataset") words the errors."""

    def __init__(
        self,
        kind: str,
        loader: Callable[[], None] | None = None,
        resolve: Callable[[str], Entry[F] | None] | None = None,
    ) -> None:
        """``loader`` registers the entries on first use; ``resolve`` makes an entry for a
        name that is none of them (a model named ``module:Class``), or returns None."""
        self.kind = kind
        self._entries: dict[str, Entry[F]] = {}
        self._loader = loader
        self._loaded = loader is None
        self._resolve = resolve

    def register(
        self,
        name: str,
        *,
        options: type,
        summary: str,
        defaults: Mapping[str, Any] | None = None,
    ) -> Callable[[F], F]:
        """Decorator: register ``factory`` under ``name``."""

        def decorate(factory: F) -> F:
            self.add(name, factory, options=options, summary=summary, defaults=defaults)
            return factory

        return decorate

    def add(
        self,
        name: str,
        factory: F,
        *,
        options: type,
        summary: str,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = Entry(name, factory, options, summary, dict(defaults or {}))

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            assert self._loader is not None
            # marked only once every loader imported: a failed import is raised again on the
            # next lookup instead of leaving a registry that silently lacks its entries
            self._loader()
            self._loaded = True

    def get(self, name: str) -> Entry[F]:
        """The entry for ``name``, or a RecipeError listing the names allowed."""
        self._ensure_loaded()
        if name not in self._entries and self._resolve is not None:
            found = self._resolve(name)
            if found is not None:
                self._entries[name] = found  # resolved once per process
        try:
            return self._entries[name]
        except KeyError:
            raise RecipeError(
                f"unknown {self.kind} {name!r}; registered: {one_of(sorted(self._entries))}"
            ) from None

    def names(self) -> list[str]:
        self._ensure_loaded()
        return sorted(self._entries)

    def __iter__(self) -> Iterator[Entry[F]]:
        self._ensure_loaded()
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return name in self._entries
