"""The checks every config dataclass runs on its fields (model, training, experiments): each
field holds its annotated type, one of its choices, a positive integer or a probability, and
a wrong value is a ``ConfigError`` naming the class, the field, the value and what was
expected."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from aiayn.errors import ConfigError


def _fail(owner: object, name: str, value: object, expected: str) -> ConfigError:
    return ConfigError(f"{type(owner).__name__}.{name}={value!r} is invalid: expected {expected}")


def check_field_types(config: Any) -> None:
    """Each field of the dataclass ``config`` holds a value of its annotated type (bool, int,
    float, str, None and unions of them; other annotations are left to the class's own
    checks).  A TOML file or a ``--set`` override can give any type: ``bias = "False"`` (a
    string, which is truthy) or ``lr = "fast"``.  Raises ValueError naming the field, the
    value and what was expected."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        ok, expected = _type_matches(value, hints.get(f.name))
        if not ok:
            raise _fail(config, f.name, value, expected)


def _check_choices(config: Any, choices: Mapping[str, Iterable[str]]) -> None:
    """Each named field holds one of its choices (a Literal's values, or a registry's names)."""
    for name, allowed in choices.items():
        value, allowed = getattr(config, name), tuple(allowed)
        if value not in allowed:
            raise _fail(config, name, value, f"one of {', '.join(map(repr, allowed))}")


def _check_positive(config: Any, names: Iterable[str], *, optional: bool = False) -> None:
    """Each named integer field is >= 1 (or None, when ``optional``); check_field_types has
    seen to the type."""
    for name in names:
        value = getattr(config, name)
        if optional and value is None:
            continue
        if value < 1:
            raise _fail(config, name, value, "a positive integer" + " or None" * optional)


def _check_probability(config: Any, name: str) -> None:
    value = getattr(config, name)
    if not 0.0 <= value < 1.0:
        raise _fail(config, name, value, "a probability in [0, 1)")


def differing_fields(a: Any, b: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The fields (outside ``skip``) in which two dataclasses of one type differ; a field that
    holds a dataclass (a ModelConfig's sub-configs) is compared field by field, and named
    dotted (``attention.n_heads``).  ``skip`` names fields the same way."""
    found = []
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in skip or x == y:
            continue
        if dataclasses.is_dataclass(x) and type(x) is type(y):
            inner = tuple(s.removeprefix(f"{f.name}.") for s in skip if s.startswith(f"{f.name}."))
            found += [f"{f.name}.{name}" for name in differing_fields(x, y, inner)]
        else:
            found.append(f.name)
    return found


def _type_matches(value: object, hint: Any) -> tuple[bool, str]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        results = [_type_matches(value, part) for part in typing.get_args(hint)]
        return any(ok for ok, _ in results), " or ".join(e for _, e in results if e)
    if hint is type(None):
        return value is None, "None"
    if hint is bool:
        return isinstance(value, bool), "true or false"
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), "an integer"
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool), "a number"
    if hint is str:
        return isinstance(value, str), "a string"
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        return value in choices, f"one of {', '.join(map(repr, choices))}"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a ModelConfig sub-config
        return isinstance(value, hint), f"a sub-config ({hint.__name__})"
    return True, ""
