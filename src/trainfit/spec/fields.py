"""A section's fields checked against their types and bounds, every problem collected (never
raised one by one), with the names it might have meant for an unknown key."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainfit.errors import Problem
from trainfit.space import did_you_mean
from trainfit.spec.sections import MAX_SEED, SECTIONS


def _kinds(annotation: str) -> list[str]:
    """``tuple[str, ...] | None`` (a field annotation, a string under ``from __future__``) ->
    ``["tuple", "None"]``."""
    return [k.strip() for k in re.sub(r"\[.*?\]+", "", annotation).split("|")]


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "Mapping": lambda v: isinstance(v, Mapping),
    "tuple": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v),
}


_TYPE_WORDS = {"str": "a string", "float": "a number", "int": "an integer", "bool": "true or false",
               "Mapping": "a mapping", "tuple": "a list of strings"}


def _typed(value: Any, annotation: str) -> bool:
    """Does ``value`` match a field annotation?"""
    kinds = _kinds(annotation)
    if value is None:
        return "None" in kinds
    return any(_CHECKS[k](value) for k in kinds if k in _CHECKS)


def _expected(annotation: str) -> str:
    """``float | None`` -> ``a number (or null)``: the words a spec author reads in an error."""
    kinds = _kinds(annotation)
    words = [_TYPE_WORDS.get(k, k) for k in kinds if k != "None"]
    return " or ".join(words) + (" (or null)" if "None" in kinds else "")


def unknown(key: str, what: str, name: str, known: Sequence[str], listing: str) -> Problem:
    """A key that is not one of ``known``: the closest known one as the hint, else all of them."""
    return Problem(key, what, did_you_mean(name, known) or f"{listing}: {', '.join(known)}")


_INVALID = object()
"""What :func:`_field_value` returns for a value it reported as a problem."""


def _field_value(f: dataclasses.Field[Any], key: str, value: Any, problems: list[Problem]) -> Any:
    """``value`` checked against field ``f``'s type and made its Python form (a list a tuple, an int a
    float where the field is a float), or ``_INVALID`` with the problem added."""
    kinds = _kinds(str(f.type))
    if isinstance(value, str) and kinds[0] == "tuple":
        value = (value,)  # one item of a list field may be written without the list
    if not _typed(value, str(f.type)):
        problems.append(Problem(key, f"expected {_expected(str(f.type))}, got {value!r}"))
        return _INVALID
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(Problem(key, f"must be a finite number, got {value}",
                                "leave the key out for its default" if "None" in kinds else None))
        return _INVALID
    if isinstance(value, list):
        value = tuple(value)
    if "float" in str(f.type) and isinstance(value, int) and "int" not in str(f.type):
        value = float(value)
    return value


ELSEWHERE = {
    "plan.epochs": "tune.epochs: set it there (the tune's estimate, its command and the plan count one run)",
    "train.epochs": "tune.epochs: set it there (the tune's estimate, its command, the plan and the run count one run)",
}
"""Keys a user may look for in one section that another holds, and where."""


def _section(cls: type, raw: Any, key: str, problems: list[Problem]) -> dict[str, Any] | None:
    """Type-check one section against its dataclass; unknown keys get a did-you-mean."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problems.append(Problem(key, f"expected a mapping, got {type(raw).__name__}"))
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for name, value in raw.items():
        f = fields.get(name)
        if f is None and f"{key}.{name}" in ELSEWHERE:
            problems.append(Problem(f"{key}.{name}", f"is {ELSEWHERE[f'{key}.{name}']}"))
        elif f is None:
            problems.append(unknown(f"{key}.{name}", "unknown key", str(name), list(fields), "known keys"))
        elif (checked := _field_value(f, f"{key}.{name}", value, problems)) is not _INVALID:
            values[name] = checked
    for name, f in fields.items():
        if name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if not any(p.key == f"{key}.{name}" for p in problems):
                problems.append(Problem(f"{key}.{name}", "is required"))
            return None
    return values


def check_one_of(section: Any, key: str, name: str, choices: Sequence[str], problems: list[Problem]) -> None:
    """Field ``name`` of ``section`` (written under ``key:``) must be one of ``choices``."""
    value = getattr(section, name)
    if value not in choices:
        problems.append(Problem(f"{key}.{name}", f"{value!r} is not one of {', '.join(choices)}"))


SEED_RANGE = f"between 0 and {MAX_SEED:,}"


_BOUNDS: dict[str, Callable[[float], bool]] = {
    "> 0": lambda v: v > 0,
    ">= 0": lambda v: v >= 0,
    ">= 1": lambda v: v >= 1,
    SEED_RANGE: lambda v: 0 <= v <= MAX_SEED,
}


def check_field_bounds(section: Any, key: str, names: Sequence[str], bound: str, problems: list[Problem]) -> None:
    """Each field of ``names`` that is set (not None) must satisfy ``bound`` (a key of ``_BOUNDS``).
    Every default satisfies its bound, so a key left out is never reported."""
    for name in names:
        value = getattr(section, name)
        if value is not None and not _BOUNDS[bound](value):
            problems.append(Problem(f"{key}.{name}", f"must be {bound}"))


def typed_sections(raw: Mapping[str, Any], problems: list[Problem]) -> dict[str, dict[str, Any] | None]:
    """Every section type-checked against its dataclass (``data`` only when given); None for one
    that is not a mapping or lacks a required key."""
    return {name: _section(cls, raw.get(name), name, problems)
            for name, cls in SECTIONS.items() if name != "data" or raw.get("data") is not None}

