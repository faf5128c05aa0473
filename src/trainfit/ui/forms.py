"""The spec editor's knob controls, made from :data:`trainfit.params.KNOBS` alone (a new knob gets
its control with no UI code), and the form read back into ``--set NAME=VALUE`` overrides: only the
knobs whose value differs from the spec file's, so the command that runs is the one a user would
type. Each knob has its mode: fixed at its value, or searched over choices (the ``search:``
section); a changed search is one ``--set search={...}`` override, which replaces the section."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import yaml

from trainfit.params import KNOBS, Knob, Params

KNOB_PREFIX = "knob."
"""A knob's form field is named ``knob.NAME``; ``knob.NAME.present`` marks a checkbox as shown, so
an unchecked one (which a browser does not send) reads as false."""
SEARCH_PREFIX = "search."
"""A knob's search fields: ``search.NAME.on`` (the mode: searched) and ``search.NAME`` (its choices,
as YAML: ``1, 2, 4`` or ``[1, 2, 4]``, or a range ``{low: 1.0e-5, high: 1.0e-3, log: true}``);
``search.present`` marks the form as having them."""


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
    searched: str | None = None
    """The spec's ``search:`` choices for it, as YAML (``[1, 2, 4]``); None: fixed at :attr:`value`."""
    suggested: str = ""
    """The choices a search starts from when its mode is switched on: every choice of a bool or a choice knob."""

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


def controls(params: Mapping[str, Any], search: Mapping[str, Any] | None = None) -> list[Control]:
    """A control per built-in knob, in ``Params``'s order, showing ``params`` (a spec file's
    ``params:`` section; a knob it does not set shows its default) and ``search`` (its ``search:``)."""
    defaults, search = Params(), search or {}
    return [_control(knob, params[name] if name in params else getattr(defaults, name), name in params,
                     flow(search[name]) if name in search else None)
            for name, knob in KNOBS.items()]


def _control(knob: Knob, value: Any, in_file: bool, searched: str | None) -> Control:
    widget = _WIDGETS.get(knob.kind, "text")  # a kind added later is typed as text and checked by the spec's loader
    return Control(name=knob.name, widget=widget, value=value, doc=knob.doc, in_file=in_file,
                   choices=tuple(word(c) for c in knob.choices), step="any" if knob.kind == "float" else "1",
                   minimum=knob.minimum, maximum=knob.maximum, nullable=knob.nullable, searched=searched,
                   suggested=flow([False, True] if knob.kind == "bool" else list(knob.choices)) if knob.kind == "bool"
                   or knob.choices else "")


def flow(value: Any) -> str:
    """``value`` as one line of YAML (``[1, 2, 4]``), as a search's choices are shown and passed."""
    return str(yaml.safe_dump(value, default_flow_style=True, sort_keys=False)).strip().removesuffix("...").strip()


def overrides(form: Mapping[str, str], params: Mapping[str, Any], search: Mapping[str, Any] | None = None) -> list[str]:
    """The form's knob fields as ``NAME=VALUE`` overrides, those that differ from what the spec file
    (``params``) gives, and its search modes as one ``search={...}`` where they differ from the
    file's ``search`` (a knob searched is no fixed value: its value field says nothing). A field not
    in the form is left as the file has it."""
    out = []
    for control in controls(params, search):
        given = None if _searched(form, control.name) else _given(form, control)
        if given is not None and given != control.shown:
            out.append(f"{control.name}={given if given != '' else 'null'}")
    return out + _search_override(form, search or {})


def _searched(form: Mapping[str, str], name: str) -> bool:
    return form.get(f"{SEARCH_PREFIX}{name}.on") in ("on", "true", "1")


def _search_override(form: Mapping[str, str], search: Mapping[str, Any]) -> list[str]:
    """The form's search as ``search={...}`` (the choices as written, for the loader to check and
    say what is wrong), where it differs from the file's; a factory's own searched keys stay."""
    if f"{SEARCH_PREFIX}present" not in form:
        return []
    texts = {k: flow(v) for k, v in search.items() if k not in KNOBS}
    for name in dict.fromkeys([*(k for k in search if k in KNOBS), *KNOBS]):  # the file's order, then the rest
        if _searched(form, name):
            text = form.get(f"{SEARCH_PREFIX}{name}", "").strip()
            texts[name] = text if text.startswith(("[", "{")) else f"[{text}]"
    given = "{" + ", ".join(f"{k}: {v}" for k, v in texts.items()) + "}"
    try:
        same = yaml.safe_load(given) == dict(search)
    except yaml.YAMLError:
        same = False
    return [] if same else [f"search={given if texts else 'null'}"]


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

