"""Records read back from JSON with their types checked: :class:`Record` (a frozen dataclass whose
``from_json`` says which key is wrong, :class:`Malformed`), the type, bound and finiteness checks
behind it, and the schema-version check every state file makes."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from trainfit.errors import TrainfitError

R = TypeVar("R", bound="Record")


class Malformed(ValueError):
    """A value of a JSON record of the wrong type, out of its range, or missing: ``key`` (dotted, from
    the file's top) says where, so a user finds it in the file."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key, self.problem = key, problem

    def within(self, outer: str) -> Malformed:
        """This problem as seen from the record holding this one at ``outer``."""
        return Malformed(f"{outer}.{self.key}" if self.key else outer, self.problem)


class Record:
    """A frozen dataclass that is one JSON object: ``to_json`` in field order (a field whose
    metadata says ``omit_none`` is left out while None), ``from_json`` back, nested records included.

    ``from_json`` checks what it reads against the fields' types (a record or a dict where a JSON
    object belongs, a list, a number, a string, a bool) and the bounds a field's metadata gives
    (``at_least``, ``above``), and raises :class:`Malformed` naming the key: a file edited by hand
    or damaged ends in one line, not in a traceback wherever the value is first used. A null is
    taken where any value is (records written before a value was known hold it)."""

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            out[f.name] = _plain(value)
        return out

    @classmethod
    def from_json(cls: type[R], raw: Mapping[str, Any]) -> R:  # noqa: PYI019 (Python 3.10 has no Self)
        if not isinstance(raw, Mapping):
            raise Malformed("", f"{_shown(raw)} where a JSON object belongs")
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        missing = [f.name for f in fields if f.name not in raw and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise Malformed(missing[0], "missing")
        values = {f.name: typed(hints[f.name], raw[f.name], f.name) for f in fields if f.name in raw}
        for f in fields:
            check_bounds(f.name, values.get(f.name), f.metadata)
        return cls(**values)


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_SCALARS: dict[Any, tuple[str, Callable[[Any], bool]]] = {
    float: ("a number", _is_number),
    int: ("an integer", lambda v: _is_number(v) and (isinstance(v, int) or v.is_integer())),
    bool: ("true or false", lambda v: isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
}
"""What a JSON value of each scalar type must be, and its name in an error."""


def _shown(value: Any) -> str:
    """A JSON value as an error names it: its type and (the start of) its text."""
    if value is None:
        return "null"
    text = repr(value)
    return f"the {type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def typed(hint: Any, value: Any, key: str, *, nullable: bool = True) -> Any:
    """``value`` (at ``key``) read from JSON as the type ``hint`` says: records, and lists, dicts and
    optionals of them, each value checked to be of its type (:class:`Malformed` where it is not).
    ``nullable``: a null is taken where the hint does not allow one (see :class:`Record`)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    optional = bool(args) and type(None) in args and origin is not list and origin is not dict
    if value is None:
        if nullable or optional:
            return None
        raise Malformed(key, f"null where {_SCALARS.get(hint, ('a value',))[0]} belongs")
    if isinstance(hint, type) and issubclass(hint, Record):
        if not isinstance(value, Mapping):
            raise Malformed(key, f"{_shown(value)} where a JSON object belongs")
        try:
            return hint.from_json(value)
        except Malformed as err:
            raise err.within(key) from None
    if origin is list:
        if not isinstance(value, list):
            raise Malformed(key, f"{_shown(value)} where a JSON list belongs")
        return [typed(args[0], v, f"{key}[{i}]", nullable=nullable) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise Malformed(key, f"{_shown(value)} where a JSON object belongs")
        return {k: typed(args[1], v, f"{key}.{k}", nullable=nullable) for k, v in value.items()}
    if optional:  # X | None
        others = [a for a in args if a is not type(None)]
        return typed(others[0], value, key, nullable=nullable) if len(others) == 1 else value
    name, fits = _SCALARS.get(hint, ("", None))
    if fits is not None and not fits(value):
        raise Malformed(key, f"{_shown(value)} where {name} belongs")
    return value


def check_bounds(key: str, value: Any, bounds: Mapping[str, Any]) -> None:
    """Refuse (:class:`Malformed`) a number outside ``bounds`` (``at_least``, ``above``: a field's
    metadata); anything else passes (its type is :func:`typed`'s to check)."""
    if not _is_number(value):
        return
    low, above = bounds.get("at_least"), bounds.get("above")
    if low is not None and not value >= low:
        raise Malformed(key, f"{value:g} is below {low:g}")
    if above is not None and not value > above:
        raise Malformed(key, f"{value:g} is not above {above:g}")


def non_finite(value: Any, key: str = "") -> tuple[str, str] | None:
    """The first number in ``value`` (a JSON document, nested) that JSON cannot hold (NaN or an
    infinity), as ``(dotted key, the name Python's json writes it by)``; None when there is none."""
    if isinstance(value, float) and not math.isfinite(value):
        return key, "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        items: Iterable[tuple[str, Any]] = ((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{key}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((found for k, v in items if (found := non_finite(v, k)) is not None), None)


def check_finite(raw: Any) -> None:
    """Refuse (:class:`Malformed`) a JSON document read with a NaN or an infinity in it: Python's
    json reads them, no figure of the files that use this is one, and one read would spread
    through every sum it enters (a speed of ``nan``, a negative run)."""
    found = non_finite(raw)
    if found is not None:
        raise Malformed(found[0], f"{found[1]} is not a finite number")


def finite(doc: dict[str, Any], what: str) -> dict[str, Any]:
    """``doc`` (a record's JSON), refused (:class:`TrainfitError`) where a number in it is NaN or an
    infinity: written, it would make ``what`` a file no JSON reader but Python's accepts, and every
    figure read from it that number."""
    found = non_finite(doc)
    if found is not None:
        raise TrainfitError(f"{what} cannot hold {found[0]} = {found[1]}: a figure came out as no number, so the "
                            "file is left as it was", "report it with the command that made it: it is a bug")
    return doc


def check_schema(raw: Mapping[str, Any], version: int, what: str, hint: str) -> None:
    """Refuse ``raw`` (a versioned file's content) unless it is a JSON object whose ``schema_version``
    is ``version``."""
    if not isinstance(raw, Mapping):
        raise TrainfitError(f"{what} is not a JSON object (it holds a {type(raw).__name__})", hint)
    found = raw.get("schema_version")
    if found is None:
        raise TrainfitError(f"{what} has no schema_version; this trainfit reads {version}", hint)
    if not _is_number(found):  # "1", as a hand or another tool wrote it: not another version, the wrong type
        kind = {str: "a string", bool: "true or false", list: "a list"}.get(type(found), "an object")
        raise TrainfitError(f"{what} has schema version {found!r}, {kind} where a number belongs; this trainfit reads "
                            f"{version}", f'write it as a number ("schema_version": {version}), or {hint}')
    if found != version:
        raise TrainfitError(f"{what} has schema version {found!r}; this trainfit reads {version}", hint)

