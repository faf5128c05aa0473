"""The spec editor's knob controls, made from :data:`trainfit.params.KNOBS` alone (a new knob gets
its control with no UI code), and the form read back into ``--set NAME=VALUE`` overrides: only the
knobs whose value differs from the spec file's, so the command that runs is the one a user would
type."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trainfit.params import KNOBS, Knob, Params

KNOB_PREFIX = "knob."
"""A knob's form field is named ``knob.NAME``; ``knob.NAME.present`` marks a checkbox as shown, so
an unchecked one (which a browser does not send) reads as false."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Control:
    """One knob's form control."""

    name: str
    """The knob's name, as in ``params:`` and ``--set``."""
    widget: str
    """``checkbox`` (a bool knob), ``select`` (a choice), ``number`` (int or float) or ``text`` (module names)."""
    value: Any
    """The value the spec file gives it (its default where the file does not)."""
    doc: str
    """The knob's documentation, shown beside the control."""
    choices: tuple[str, ...] = ()
    """A select's options, as the YAML words for them."""
    step: str = "1"
    """A number input's step: ``1`` for an int knob, ``any`` for a float one."""
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    """An empty number or text field means null (the knob's documented meaning of null)."""
    in_file: bool = False
    """The spec file's ``params:`` sets it."""

    @property
    def shown(self) -> str:
        """The value as the control shows it: the YAML word for a choice, '' for null."""
        return "" if self.value is None else word(self.value)


def word(value: Any) -> str:
    """A value as ``--set`` and the controls write it (YAML: ``true``, ``null``, ``q_proj,v_proj``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


_WIDGETS = {"bool": "checkbox", "choice": "select", "int": "number", "float": "number", "modules": "text"}


def controls(params: Mapping[str, Any]) -> list[Control]:
    """A control per built-in knob, in ``Params``'s order, showing ``params`` (a spec file's
    ``params:`` section; a knob it does not set shows its default)."""
    defaults = Params()
    return [_control(knob, params[name] if name in params else getattr(defaults, name), name in params)
            for name, knob in KNOBS.items()]


def _control(knob: Knob, value: Any, in_file: bool) -> Control:
    widget = _WIDGETS.get(knob.kind, "text")  # a kind added later is typed as text and checked by the spec's loader
    return Control(name=knob.name, widget=widget, value=value, doc=knob.doc, in_file=in_file,
                   choices=tuple(word(c) for c in knob.choices), step="any" if knob.kind == "float" else "1",
                   minimum=knob.minimum, maximum=knob.maximum, nullable=knob.nullable)


def overrides(form: Mapping[str, str], params: Mapping[str, Any]) -> list[str]:
    """The form's knob fields as ``NAME=VALUE`` overrides, those that differ from what the spec file
    (``params``) gives. A field not in the form is left as the file has it."""
    shown = {c.name: c for c in controls(params)}
    out = []
    for name, control in shown.items():
        given = _given(form, control)
        if given is not None and given != control.shown:
            out.append(f"{name}={given if given != '' else 'null'}")
    return out


def _given(form: Mapping[str, str], control: Control) -> str | None:
    """What the form says for ``control`` (its shown text), None where it says nothing."""
    field = KNOB_PREFIX + control.name
    if control.widget == "checkbox":
        if field + ".present" not in form:
            return None
        return "true" if form.get(field) in ("on", "true", "1") else "false"
    if field not in form:
        return None
    return form[field].strip()

