"""A :class:`Spec` built from plain data (:func:`build_spec`) or a file and overrides
(:func:`load_spec`): each section checked, relative paths resolved against the spec's folder, one
:class:`~trainfit.errors.SpecError` with every problem."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, overload

from trainfit.data_paths import NotRegularFile, data_files, refuse_special, special_kind
from trainfit.errors import Problem, SpecError, TrainfitError
from trainfit.params import Params, parse_params
from trainfit.space import SearchSpace, parse_space
from trainfit.spec.fields import SEED_RANGE, check_field_bounds, check_one_of, typed_sections, unknown
from trainfit.spec.rules import params_problems
from trainfit.spec.sections import (
    LENGTH_BY,
    MAX_MEMORY_GB,
    OBJECTIVES,
    PRIORITIES,
    PROBE_DATA,
    STRATEGIES,
    TOP_LEVEL,
    Budget,
    DataSpec,
    ModelSpec,
    PlanSettings,
    ProbeSettings,
    Spec,
    TuneSettings,
)
from trainfit.spec.training import TrainValues, check_training
from trainfit.spec.yaml_input import load_yaml, merge_overrides, parse_override

_DATA_FORMATS = ("auto", "jsonl", "json", "csv", "tsv", "parquet", "text", "hf")


@overload
def _resolve(base: Path, value: str) -> str: ...
@overload
def _resolve(base: Path, value: None) -> None: ...
@overload
def _resolve(base: Path, value: str | None) -> str | None: ...
def _resolve(base: Path, value: str | None) -> str | None:
    """``value`` as an absolute path, relative ones taken from ``base`` (None stays None)."""
    if value is None:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def model_folder_tokenizer(path: str | None) -> str | None:
    """The model folder itself when it holds a tokenizer: what ``trl sft`` tokenizes with, so the
    sample lengths are counted as the training run will count them."""
    if path is None or not Path(path).is_dir():
        return None
    return path if any((Path(path) / name).is_file() for name in _TOKENIZER_FILES) else None


def _factory_target(factory: str, base_dir: Path, problems: list[Problem]) -> str:
    """``model.factory`` checked; a ``file.py:function`` one with the file resolved against ``base_dir``."""
    target, colon, func = factory.rpartition(":")
    if not colon or not target or not func:
        problems.append(Problem("model.factory", f"{factory!r} is not 'module:function'",
                                "e.g. mypkg.models:make_workload or models.py:make_workload"))
        return factory
    if not target.endswith(".py"):
        return factory
    resolved = _resolve(base_dir, target)
    if not Path(resolved).is_file():
        problems.append(Problem("model.factory", f"{resolved} does not exist"))
    return f"{resolved}:{func}"


def _model_section(model: dict[str, Any] | None, base_dir: Path, problems: list[Problem]) -> ModelSpec | None:
    """``model:``: exactly one of path, config, factory; a config with its ``model_type``; a folder
    that exists; a factory named ``module:function``."""
    if model is None:
        return None
    given = [k for k in ("path", "config", "factory") if model.get(k) is not None]
    if len(given) != 1:
        problems.append(Problem("model", f"give exactly one of path, config, factory (got {given or 'none'})",
                                "e.g. model: {config: {model_type: llama, hidden_size: 64, ...}}"))
    if model.get("config") is not None and "model_type" not in model["config"]:
        problems.append(Problem("model.config.model_type", "is required",
                                "e.g. model_type: llama (any transformers model type)"))
    if model.get("path") is not None:
        model["path"] = _resolve(base_dir, model["path"])
        if not Path(model["path"]).is_dir():
            problems.append(Problem("model.path", f"{model['path']} is not a folder",
                                    "give a local Hugging Face model folder (config.json inside)"))
    if model.get("factory") is not None:
        model["factory"] = _factory_target(model["factory"], base_dir, problems)
    return ModelSpec(**model)


def _data_section(typed: dict[str, Any] | None, base_dir: Path, problems: list[Problem]) -> DataSpec | None:
    """``data:``: a path the readers can read, one length source at most, known format and row policy."""
    if typed is None:
        return None
    data = DataSpec(**{**typed, "path": _resolve(base_dir, typed["path"])})

    try:
        data_files(data.path)  # a file, a folder of shards, a glob pattern or a save_to_disk folder
    except NotRegularFile as err:
        problems.append(Problem("data.path", err.message, err.hint))
    except TrainfitError as err:
        problems.append(Problem("data.path", err.message,
                                "check the path; a relative path starts at the spec's folder"))
    fields_given = [k for k in ("text_field", "messages_field", "length_field", "audio_field")
                    if getattr(data, k) is not None]
    text_and_audio = len(fields_given) == 2 and "audio_field" in fields_given and "length_field" not in fields_given
    if len(fields_given) > 1 and not text_and_audio:
        problems.append(Problem("data", f"give one of text_field, messages_field, length_field, audio_field, or a "
                                        f"text (or messages) field with an audio field (got {fields_given})"))
    check_one_of(data, "data", "format", _DATA_FORMATS, problems)
    check_one_of(data, "data", "length_by", LENGTH_BY, problems)
    if data.on_bad_row not in ("stop", "skip"):
        problems.append(Problem("data.on_bad_row", "must be stop or skip"))
    if data.length_scale <= 0:
        problems.append(Problem("data.length_scale", "must be > 0"))
    return data


def _params_section(raw_params: Any, model: ModelSpec | None, data: DataSpec | None,
                    problems: list[Problem]) -> Params:
    """``params:`` (the knobs, custom ones for a factory model); without a dataset it must set
    ``max_length``. The defaults when it is not a mapping."""
    raw_params = raw_params or {}
    if not isinstance(raw_params, Mapping):
        problems.append(Problem("params", "expected a mapping of knob: value"))
        return Params()
    params, param_problems = parse_params(raw_params, allow_custom=model is not None and model.factory is not None)
    problems += param_problems
    if data is None and params.max_length is None and not param_problems:
        problems.append(Problem("data", "no dataset and no params.max_length",
                                "add data: {path: ..., text_field: ...} or set params.max_length"))
    return params


def _budget_section(typed: dict[str, Any] | None, problems: list[Problem]) -> Budget | None:
    """``budget:``: a positive memory cap that the headroom leaves something of."""
    if typed is None:
        return None
    budget = Budget(**typed)
    check_field_bounds(budget, "budget", ("memory_gb",), "> 0", problems)
    check_field_bounds(budget, "budget", ("headroom_gb",), ">= 0", problems)
    for name in ("memory_gb", "headroom_gb"):
        if (value := getattr(budget, name)) is not None and value > MAX_MEMORY_GB:
            problems.append(Problem(f"budget.{name}", f"must be <= {MAX_MEMORY_GB:,} GiB (a pebibyte), got {value:g}"))
    mem, head = budget.memory_gb, budget.headroom_gb
    if mem is not None and mem > 0 and head >= mem:
        problems.append(Problem("budget.headroom_gb", f"headroom {head} GiB leaves nothing of memory_gb {mem}",
                                "lower headroom_gb or raise memory_gb"))
    return budget


def _probe_section(typed: dict[str, Any] | None, problems: list[Problem]) -> ProbeSettings | None:
    """``probe:``: step counts and limits in range, a device trainfit knows how to name."""
    if typed is None:
        return None
    probe = ProbeSettings(**typed)
    check_field_bounds(probe, "probe", ("memory_steps", "min_steps", "max_steps"), ">= 1", problems)
    check_field_bounds(probe, "probe", ("burn_in_steps",), ">= 0", problems)
    check_field_bounds(probe, "probe", ("max_seconds", "timeout_s", "target_rel_ci"), "> 0", problems)
    check_field_bounds(probe, "probe", ("seed",), SEED_RANGE, problems)
    check_one_of(probe, "probe", "data", PROBE_DATA, problems)
    dev = probe.device
    if not (dev in ("auto", "cpu", "cuda") or dev.startswith("cuda:")):
        problems.append(Problem("probe.device", f"{dev!r} is not auto, cpu, cuda or cuda:N"))
    return probe


def _tune_section(typed: dict[str, Any] | None, problems: list[Problem]) -> TuneSettings | None:
    """``tune:``: a known strategy and objective, counts and limits in range (its constraints are
    checked with the search space, its command template against the knobs)."""
    if typed is None:
        return None
    tune = TuneSettings(**typed)
    check_one_of(tune, "tune", "strategy", STRATEGIES, problems)
    check_one_of(tune, "tune", "objective", OBJECTIVES, problems)
    check_field_bounds(tune, "tune", ("max_trials", "target_effective_batch", "patience"), ">= 1", problems)
    check_field_bounds(tune, "tune", ("epochs", "time_budget_s"), "> 0", problems)
    check_field_bounds(tune, "tune", ("confirm_rounds",), ">= 0", problems)
    check_field_bounds(tune, "tune", ("seed",), SEED_RANGE, problems)
    if not 0 <= tune.confirm_margin < 1:
        problems.append(Problem("tune.confirm_margin", "must be between 0 and 1 (a relative gap, e.g. 0.05)"))
    return tune


def _plan_section(typed: dict[str, Any] | None, problems: list[Problem]) -> PlanSettings | None:
    """``plan:``: a known priority, a window and minutes in range."""
    if typed is None:
        return None
    plan = PlanSettings(**typed)
    check_one_of(plan, "plan", "priority", PRIORITIES, problems)
    check_field_bounds(plan, "plan", ("max_hours", "checkpoint_minutes"), "> 0", problems)
    check_field_bounds(plan, "plan", ("margin_minutes",), ">= 0", problems)
    if plan.max_hours is not None and plan.margin_minutes >= plan.max_hours * 60:
        problems.append(Problem("plan.margin_minutes", f"{plan.margin_minutes:g} leaves no time in the "
                                f"{plan.max_hours:g} h window (plan.max_hours)", "a margin shorter than the window"))
    return plan


def _train_section(typed: dict[str, Any] | None, problems: list[Problem]) -> TrainValues | None:
    """``train:``: each value in range (as a compare config's), a warmup given one way."""
    if typed is None:
        return None
    problems += [Problem(f"train.{key}", bad) for key, value in typed.items() if (bad := check_training(key, value))]
    if (typed.get("warmup_steps") or 0) > 0 and (typed.get("warmup_ratio") or 0) > 0:
        problems.append(Problem("train.warmup_ratio", "is set with train.warmup_steps: the warmup is one or the other",
                                "keep one of them"))
    if "report_to" in typed:
        typed["report_to"] = tuple(dict.fromkeys(typed["report_to"]))  # a service named twice reports once
    return TrainValues(**typed)


def _search_section(raw_search: Any, tune: TuneSettings | None, model: ModelSpec | None, params: Params,
                    problems: list[Problem]) -> SearchSpace | None:
    """``search:`` with ``tune``'s constraints and target effective batch; None when neither gives a
    space (or ``tune:`` is invalid, which leaves the search unchecked)."""
    if tune is None:
        return None
    if raw_search is not None and not isinstance(raw_search, Mapping):
        problems.append(Problem("search", "expected a mapping of knob: [choices] or {low, high}"))
        return None
    if raw_search is None and not tune.target_effective_batch and not tune.constraints:
        return None
    space, space_problems = parse_space(
        raw_search, params, allow_custom=model is not None and model.factory is not None,
        constraints=tune.constraints, target_effective_batch=tune.target_effective_batch)
    problems += space_problems
    return space


def _tokenizer(value: Any, model: ModelSpec | None, base_dir: Path, problems: list[Problem]) -> str | None:
    """``tokenizer:`` resolved against ``base_dir``; left out, the model folder's own tokenizer if any."""
    if value is None:
        return model_folder_tokenizer(model.path) if model is not None else None
    if not isinstance(value, str):
        problems.append(Problem("tokenizer", "expected a path"))
        return None
    tokenizer = _resolve(base_dir, value)

    if not Path(tokenizer).exists():
        problems.append(Problem("tokenizer", f"{tokenizer} does not exist",
                                "give a local tokenizer folder or tokenizer.json"))
    elif kind := special_kind(tokenizer):
        problems.append(Problem("tokenizer", f"{tokenizer} is {kind}, not a file or folder",
                                "give a local tokenizer folder or tokenizer.json"))
    return tokenizer


def build_spec(raw: Mapping[str, Any], *, base_dir: Path, source: str | None = None) -> Spec:
    """Validate a merged spec mapping into a :class:`Spec` or raise one SpecError with all problems.

    Problems are listed in a fixed order: unknown sections, every section's types, then each
    section's own checks, then the checks across sections (loss, LoRA, what ``trl sft`` takes)."""
    problems = [unknown(str(key), "unknown section", str(key), TOP_LEVEL, "sections are")
                for key in raw if key not in TOP_LEVEL]
    sections = typed_sections(raw, problems)
    model = _model_section(sections["model"], base_dir, problems)
    data = _data_section(sections.get("data"), base_dir, problems)
    params = _params_section(raw.get("params"), model, data, problems)
    budget = _budget_section(sections["budget"], problems)
    probe = _probe_section(sections["probe"], problems)
    tune = _tune_section(sections["tune"], problems)
    plan = _plan_section(sections["plan"], problems)
    train = _train_section(sections["train"], problems)
    space = _search_section(raw.get("search"), tune, model, params, problems)
    problems += params_problems(model, tune, params, space)
    tokenizer = _tokenizer(raw.get("tokenizer"), model, base_dir, problems)
    if problems:
        raise SpecError(problems, source=source or "spec")
    # A section that is not a mapping is None here, and added a problem above.
    assert model is not None and budget is not None and probe is not None and tune is not None and plan is not None
    assert train is not None
    raw_params = raw.get("params")
    return Spec(model=model, data=data, params=params, budget=budget, probe=probe, tokenizer=tokenizer,
                search=space, tune=tune, plan=plan, train=train, source=source,
                stated=frozenset(raw_params) if isinstance(raw_params, Mapping) else frozenset())


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> Spec:
    """Read a YAML spec, apply ``key=value`` overrides, and validate.

    Raises:
        TrainfitError: the file is missing or not YAML.
        SpecError: the content is invalid (all problems listed).
    """
    path = Path(path)
    if path.is_dir():
        raise TrainfitError(f"spec {path} is a folder, not a file",
                            "pass the path of a YAML spec file, e.g. examples/tiny-llama.yaml")

    refuse_special(path, "spec ")  # /dev/zero would be read without end; a pipe has no folder for relative paths
    if not path.is_file():
        raise TrainfitError(f"spec file {path} not found",
                            "pass the path of a YAML spec, e.g. examples/tiny-llama.yaml")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise TrainfitError(f"cannot read the spec {path}: {err}") from None
    raw = load_yaml(text, str(path)) or {}
    if not isinstance(raw, dict):
        raise TrainfitError(f"{path} must hold a mapping (model:, data:, params:, ...)")
    merged = merge_overrides(raw, [parse_override(o) for o in overrides])
    return build_spec(merged, base_dir=path.resolve().parent, source=str(path))


RUN_LIMITS = ("strategy", "max_trials", "time_budget_s", "patience", "confirm_rounds", "confirm_margin", "seed")
"""The ``tune:`` settings :func:`with_tune` changes: how a search runs, not what it searches (the
space, its constraints and the command template are the spec file's)."""


def with_tune(spec: Spec, **changes: Any) -> Spec:
    """``spec`` with these ``tune:`` settings (of :data:`RUN_LIMITS`), checked as the file's are:
    the one channel for a search's strategy and limits, from the CLI's flags or a library call,
    e.g. ``with_tune(spec, max_trials=5)``. A setting given as None keeps the spec's (a flag not
    passed).

    Raises:
        SpecError: a setting out of range or unknown (all problems listed).
    """
    changes = {name: value for name, value in changes.items() if value is not None}
    problems = [Problem(f"tune.{name}", f"not a run limit: set it in the spec file (run limits: {', '.join(RUN_LIMITS)})")
                for name in changes if name not in RUN_LIMITS]
    tune = None if problems else _tune_section({**dataclasses.asdict(spec.tune), **changes}, problems)
    if problems or tune is None:
        raise SpecError(problems)
    return dataclasses.replace(spec, tune=tune)
