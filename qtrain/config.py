"""Typed option sections: one mechanism for every table of a recipe.

A section is a frozen dataclass whose fields are declared with ``option()``.
``parse_section`` turns a TOML table into an instance, checking every key's
type and range and naming the key, the value and what is allowed when it is
wrong. Models, datasets and plugins declare their options the same way, so
that ``qtrain models`` / ``datasets`` / ``plugins`` can list them and every
error reads alike.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from qtrain.errors import RecipeError, one_of

T = TypeVar("T")


def option(
    default: Any = MISSING,
    help: str = "",
    *,
    min: float | None = None,
    max: float | None = None,
    key: str | None = None,
) -> Any:
    """Declare a section field with its help text, numeric bounds and TOML key.

    ``key`` names the field in TOML when the natural name is a Python keyword
    (``lambda``).
    """
    meta = {"help": help, "min": min, "max": max, "key": key}
    if isinstance(default, list):
        frozen = tuple(default)
        return field(default_factory=lambda: list(frozen), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class OptionInfo:
    """One option of a section, for listings."""

    name: str
    type: str
    default: Any
    help: str


def _resolved_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def toml_key(f: dataclasses.Field) -> str:
    """The name a field has in TOML (its ``key`` alias, else its own name)."""
    return f.metadata.get("key") or f.name


def type_name(tp: Any) -> str:
    """A short human-readable name for a field type."""
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(tp) if a is not type(None)) + (
            " | none" if type(None) in get_args(tp) else ""
        )
    if origin is list:
        (item,) = get_args(tp)
        return f"list of {type_name(item)}"
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


def _describe_value(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return (
        f"{value!r} ({type(value).__name__})" if not isinstance(value, int | float) else repr(value)
    )


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` converted to ``tp`` or raise naming ``key``."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        allowed = get_args(tp)
        if value in allowed and type(value) in {type(a) for a in allowed}:
            return value
        raise RecipeError(f"{key} = {_describe_value(value)} is not allowed; use {one_of(allowed)}")
    if origin in (Union, types.UnionType):
        if value is None and type(None) in get_args(tp):
            return None
        for arm in get_args(tp):
            if arm is type(None):
                continue
            try:
                return _coerce(value, arm, key)
            except RecipeError:
                continue
        raise RecipeError(
            f"{key} = {_describe_value(value)} is not allowed; expected {type_name(tp)}"
        )
    if origin is list:
        (item,) = get_args(tp)
        if not isinstance(value, list | tuple):
            raise RecipeError(f"{key} = {_describe_value(value)} must be a {type_name(tp)}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise RecipeError(f"{key} = {_describe_value(value)} must be true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise RecipeError(f"{key} = {_describe_value(value)} must be an integer")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):  # nan and inf pass every bound check otherwise
                raise RecipeError(f"{key} = {value} must be a finite number")
            return float(value)
        raise RecipeError(f"{key} = {_describe_value(value)} must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise RecipeError(f"{key} = {_describe_value(value)} must be a string")
    if tp is type(None):
        if value is None:
            return None
        raise RecipeError(f"{key} must be empty")
    raise TypeError(f"unsupported option type {tp!r} for {key}")


def _check_bounds(value: Any, f: dataclasses.Field, key: str) -> None:
    low, high = f.metadata.get("min"), f.metadata.get("max")
    values = value if isinstance(value, list) else [value]
    for v in values:
        if not isinstance(v, int | float) or isinstance(v, bool):
            continue
        if low is not None and v < low:
            raise RecipeError(f"{key} = {v} is too small; allowed: {_range(low, high)}")
        if high is not None and v > high:
            raise RecipeError(f"{key} = {v} is too large; allowed: {_range(low, high)}")


def _range(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{low} to {high}"
    return f">= {low}" if low is not None else f"<= {high}"


def parse_section(
    cls: type[T],
    table: Mapping[str, Any],
    where: str,
    *,
    defaults: Mapping[str, Any] | None = None,
    ignore: frozenset[str] = frozenset(),
) -> T:
    """Build ``cls`` from a TOML table; ``where`` prefixes key names in errors.

    ``defaults`` overrides the dataclass defaults (dataset presets use it);
    keys in ``ignore`` belong to the caller (``name`` of a model, say).
    """
    hints = _resolved_hints(cls)
    fields = {toml_key(f): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(table) - set(fields) - ignore)
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise RecipeError(
            f"unknown key {key}; allowed keys: {', '.join(sorted(fields)) or '(none)'}"
        )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = f"{where}.{name}" if where else name
        if name in table:
            value = _coerce(table[name], hints[f.name], key)
        elif defaults and f.name in defaults:
            value = defaults[f.name]
        elif f.default is not MISSING or f.default_factory is not MISSING:
            continue
        else:
            raise RecipeError(f"missing key {key} ({type_name(hints[f.name])})")
        _check_bounds(value, f, key)
        kwargs[f.name] = value
    instance = cls(**kwargs)
    validate = getattr(instance, "validate", None)
    if callable(validate):
        try:
            validate()
        except ValueError as exc:
            raise RecipeError(f"{where}: {exc}" if where else str(exc)) from None
    return instance


def describe(cls: type, defaults: Mapping[str, Any] | None = None) -> list[OptionInfo]:
    """The options of a section, with defaults, for listings."""
    hints = _resolved_hints(cls)
    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if defaults and f.name in defaults:
            default = defaults[f.name]
        elif f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = MISSING
        out.append(
            OptionInfo(toml_key(f), type_name(hints[f.name]), default, f.metadata.get("help", ""))
        )
    return out


def to_table(instance: Any) -> dict[str, Any]:
    """The section as a plain TOML-ready dict under TOML keys (None values dropped)."""
    values = dataclasses.asdict(instance)
    return {
        toml_key(f): values[f.name]
        for f in dataclasses.fields(instance)
        if values[f.name] is not None
    }


def field_type(cls: type, name: str) -> Any:
    """The declared type of one field, or None if ``cls`` has no such field."""
    return _resolved_hints(cls).get(name)
