"""The named configs a comparison trains: a YAML mapping of names to knob values (docs/spec.md's
knobs, and a factory's own keys) and training values (:data:`TRAINING_KEYS`), each applied on top
of the spec's ``params``.

    conservative: {learning_rate: 1.0e-4, lora_r: 16}
    aggressive:   {learning_rate: 5.0e-4, lora_r: 64, warmup_steps: 10}
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainfit.errors import Problem, SpecError, TrainfitError
from trainfit.params import Params, parse_params
from trainfit.spec import Spec, load_yaml, parse_override
from trainfit.spec.rules import params_problems
from trainfit.spec.training import TRAINING_KEYS, TrainValues, check_training

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
"""A config's name: it names the config's folder (``OUTPUT/configs/NAME``), so one plain folder
name: no ``/``, not hidden, not ``.`` or ``..``."""
NAME_MAX = 100
"""The longest config name, in characters: a folder name has 255 bytes at most, and a report's
table wants less."""


@dataclass(frozen=True)
class NamedConfig:
    """One config to compare: its name, every knob, its training values, and what it set."""

    name: str
    params: Params
    training: dict[str, Any]
    """The training values it sets (:data:`TRAINING_KEYS`); the rest are the defaults."""
    given: dict[str, Any] = field(default_factory=dict)
    """The config as written (knobs and training values), for the report and a later round."""

    def values(self, base: TrainValues) -> TrainValues:
        """Its training values over ``base`` (the spec's ``train:`` section)."""
        return base.over(self.training)


def split_training(overrides: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``--set`` overrides split into training values (:data:`TRAINING_KEYS`, by name: ``--set
    learning_rate=1e-4``) and the rest, the spec's."""
    training: dict[str, Any] = {}
    rest = []
    for text in overrides:
        key = text.partition("=")[0].strip()
        if key in TRAINING_KEYS:
            training[key] = _yaml_number(parse_override(text)[1])
        else:
            rest.append(text)
    return training, rest


def read_configs(path: str | Path, spec: Spec, defaults: Mapping[str, Any] | None = None) -> list[NamedConfig]:
    """The configs of the YAML file ``path`` over ``spec``'s params; every problem of the file at
    once (a :class:`SpecError` naming each config and key), or a :class:`TrainfitError` for a file
    that cannot be read. ``defaults``: training values for every config that does not set its own
    (``--set learning_rate=...``)."""
    path = Path(path)
    if not path.is_file():
        raise TrainfitError(f"configs file {path} not found",
                            "write a YAML mapping of names to settings, e.g. fast: {learning_rate: 3.0e-4}")
    raw = load_yaml(path.read_text(), str(path))
    if not isinstance(raw, dict) or not raw:
        raise TrainfitError(f"{path} must hold a mapping of config names to their settings",
                            "e.g. low_lr: {learning_rate: 1.0e-5}\\nhigh_lr: {learning_rate: 1.0e-4}")
    given = [Problem(f"--set {k}", bad) for k, v in (defaults or {}).items()
             if (bad := check_training(k, _yaml_number(v)))]
    if given:  # named as given, once: not as a problem of each config in the file
        raise SpecError(given, source="the command line")
    problems: list[Problem] = _same_folder([str(name) for name in raw])
    configs = [c for name, values in raw.items()
               if (c := _config(str(name), _with_defaults(values, defaults), spec, problems)) is not None]
    if problems:
        raise SpecError(problems, source=str(path))
    return configs


def _same_folder(names: list[str]) -> list[Problem]:
    """Names only their case tells apart: on a file system that ignores case (macOS's, Windows')
    their configs would train into one folder, each deleting the other's run."""
    first: dict[str, str] = {}
    problems = []
    for name in names:
        if name.lower() in first:
            problems.append(Problem(name, f"names the same folder as {first[name.lower()]} where case is ignored",
                                    "give it another name"))
        first.setdefault(name.lower(), name)
    return problems


def _with_defaults(values: Any, defaults: Mapping[str, Any] | None) -> Any:
    """A config as written with ``defaults`` under it (a config that is not a mapping stays, to be refused)."""
    if not defaults or not (values is None or isinstance(values, dict)):
        return values
    return {**defaults, **(values or {})}


def read_one(name: str, values: Any, spec: Spec) -> NamedConfig:
    """The config ``name`` as written (``values``), over ``spec``'s params."""
    problems: list[Problem] = []
    config = _config(name, values, spec, problems)
    if problems or config is None:
        raise SpecError(problems, source=f"config {name}")
    return config


def _config(name: str, values: Any, spec: Spec, problems: list[Problem]) -> NamedConfig | None:
    if not NAME.match(name):
        problems.append(Problem(name, "a config name is letters, digits, '_', '.' and '-' (it names a folder)"))
        return None
    if len(name) > NAME_MAX:
        problems.append(Problem(name, f"a config name has at most {NAME_MAX} characters (it names a folder)"))
        return None
    if values is None:
        values = {}
    if not isinstance(values, dict):
        problems.append(Problem(name, f"expected a mapping of settings, got {type(values).__name__}"))
        return None
    factory = spec.model.factory is not None and not spec.uses_trl_sft
    training = {k: _yaml_number(v) for k, v in values.items() if k in TRAINING_KEYS}
    for key, value in training.items():
        problem = check_training(key, value)
        if problem:
            problems.append(Problem(f"{name}.{key}", problem))
    knobs = {k: v for k, v in values.items() if k not in TRAINING_KEYS}
    for key in list(knobs):
        close = difflib.get_close_matches(key, list(TRAINING_KEYS), n=1, cutoff=0.8)
        if close:
            problems.append(Problem(f"{name}.{key}", "unknown setting", f"did you mean {close[0]!r}?"))
            del knobs[key]  # a misspelt training value: said once, not again as an unknown knob
    params, found = parse_params({**spec.params.to_dict(), **knobs}, allow_custom=factory, prefix=name)
    problems.extend(found)
    if not found:  # the spec's rules across sections, as loading it checks them: named by this config's keys
        problems.extend(Problem(f"{name}.{p.key.split('.', 1)[-1]}", p.message, p.hint)
                        for p in params_problems(spec.model, spec.tune, params, None))
    if params.packing:  # its runs count a step's samples as its effective batch; a packed step holds more
        problems.append(Problem(f"{name}.packing", "compare counts each step as batch_size x accumulation samples, and "
                                "a packed step holds more", "compare configs unpacked (tune measures packing)"))
    if params.processes > 1:  # its runs train in one process, which would count the others' samples too
        problems.append(Problem(f"{name}.nproc_per_node", f"compare trains each config in one process, and this one "
                                f"trains on {params.processes} (nproc_per_node x nnodes)",
                                "compare configs of one process; `trainfit tune` probes several"))
    return NamedConfig(name=name, params=params, training=training, given=dict(values))


def _yaml_number(value: Any) -> Any:
    """``1e-4`` as a number: YAML 1.1 (PyYAML) reads an exponent without a dot as a string."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    return value
