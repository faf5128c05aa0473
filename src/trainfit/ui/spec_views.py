"""The spec editor: a spec's knobs as controls (made from ``KNOBS``), its raw YAML, live validation by
the spec's own loader, saving as a new file, and the actions that start a command on it.

The controls are ``--set`` overrides over the YAML: a control left as the file has it adds nothing,
one changed wins over the text (as ``--set`` wins over the file). An action runs the spec file as
saved, with the changed controls as ``--set``: a YAML text with unsaved edits is saved first."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from flask import Blueprint, jsonify, redirect, render_template, request, url_for

from trainfit.spec import load_yaml, merge_overrides, parse_override
from trainfit.ui import commands, forms
from trainfit.ui.job_views import start
from trainfit.ui.paths import Refused, read_regular
from trainfit.ui.specs import check, params_of, save, spec_files, yaml_files
from trainfit.ui.state import ui

spec_views = Blueprint("specs", __name__)


def _spec(relative: str) -> tuple[Path, str]:
    """The spec file a request names (under the root), and its text."""
    path = ui().root.inside(relative)
    if not path.is_file():
        raise Refused(f"{relative} is not a file", "pick a spec YAML the list shows", status=404)
    try:
        return path, read_regular(path, errors="strict")
    except (OSError, UnicodeDecodeError) as err:
        raise Refused(f"cannot read {relative}: {err}", status=400) from None


def _checked(form: Mapping[str, str]) -> tuple[Path, str, list[str], list[dict[str, str | None]]]:
    """The spec a form names, the form's YAML text, its knob overrides, and the spec loader's problems."""
    path, saved = _spec(form.get("path", ""))
    text = form.get("yaml", saved).replace("\r\n", "\n")  # a browser sends a textarea's lines ending in CRLF
    overrides = forms.overrides(form, params_of(saved), params_of(saved, "search"))
    result = check(text, overrides, folder=path.parent, source=ui().root.relative(path))
    return path, text, overrides, result.problems


@spec_views.get("/spec")
def spec_page() -> str:
    state = ui()
    path, text = _spec(request.args.get("path", ""))
    relative = state.root.relative(path)
    specs = {listed.path for listed in spec_files(state.root)}
    configs = [f.path for f in yaml_files(state.root) if f.problem is None and f.path not in specs]
    return render_template("spec.html", path=relative, text=text, controls=forms.controls(params_of(text), params_of(text, "search")),
                           problems=check(text, [], folder=path.parent, source=relative).problems,
                           configs=configs[:200], commands=commands.SPEC_COMMANDS)


@spec_views.post("/api/validate")
def validate() -> Any:
    """The form's spec as the loader finds it: ``ok``, its ``problems``, and the ``overrides`` it adds."""
    _, _, overrides, problems = _checked(request.form)
    return jsonify(ok=not problems, problems=problems, overrides=overrides)


@spec_views.post("/spec/save")
def save_spec() -> Any:
    """Save the form's spec (its YAML, the changed controls written into ``params:``) as a new file."""
    path, text, overrides, problems = _checked(request.form)
    if problems:
        return render_template("problems.html", path=ui().root.relative(path), problems=problems), 400
    if overrides:  # the controls folded into the text (its comments are not kept then)
        # the loader's read (a date the text written), as the check just made: yaml.safe_load's date is no JSON
        merged = merge_overrides(load_yaml(text, "the spec") or {}, [parse_override(o) for o in overrides])
        text = yaml.safe_dump(merged, sort_keys=False)
    new = save(ui().root, path, text, request.form.get("name", ""))
    return redirect(url_for("specs.spec_page", path=ui().root.relative(new)), code=303)


@spec_views.post("/spec/run")
def run_on_spec() -> Any:
    """Start the action the form names on its spec: refused, with every problem, where the spec is
    not valid (nothing starts)."""
    path, text, overrides, problems = _checked(request.form)
    relative = ui().root.relative(path)
    if text.strip() != read_regular(path).strip():
        problems = [{"key": "spec", "message": "the YAML has unsaved edits", "hint": "save it as a new spec first: "
                     "an action runs the file as saved, with the changed controls as --set"}, *problems]
    if problems:
        return render_template("problems.html", path=relative, problems=problems), 400
    planned = commands.spec_command(request.form.get("command", ""), path, overrides, request.form, ui().root)
    return start(planned, spec=path)

