"""The user's YAML spec plus ``--set`` overrides, validated into one frozen :class:`Spec`.

Precedence is CLI > file > defaults, merged by :func:`merge_overrides` (pure). Validation collects
every problem before raising one :class:`~trainfit.errors.SpecError`, so a user sees all of them
at once. Relative paths are resolved against the spec file's folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import yaml

from trainfit.errors import Problem, SpecError, TrainfitError
from trainfit.params import LORA_OPTIONS, Params, parse_params
from trainfit.space import SearchSpace, did_you_mean, parse_space

GiB = 1024**3
MAX_MEMORY_GB = 2**20
"""The largest ``budget.memory_gb`` and ``headroom_gb``: a pebibyte, past any device's memory. Far
larger ones (``1.0e308``) overflow when made bytes."""
MAX_SEED = 2**32 - 1
"""The largest seed: numpy's legacy seeding, which Optuna's samplers use, takes 0 to 2**32 - 1
(``torch.manual_seed`` takes negative ones and up to 2**64 - 1); a seed must suit all of them."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Which model to train: exactly one of ``path``, ``config`` or ``factory``."""

    path: str | None = None
    """A local Hugging Face model folder (weights loaded, nothing downloaded)."""
    config: Mapping[str, Any] | None = None
    """An inline transformers config with ``model_type``: a random-init model of that shape."""
    factory: str | None = None
    """``package.module:function`` or ``file.py:function`` returning a CustomWorkload."""

    @property
    def kind(self) -> str:
        return "factory" if self.factory else "hf"


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """Where the samples are and how long each one is."""

    path: str
    """JSONL, JSON, CSV/TSV, Parquet, text (one sample per line) or a save_to_disk folder."""
    text_field: str | tuple[str, ...] | None = None
    """Field(s) holding the text; several are joined with a newline."""
    messages_field: str | None = None
    """Field holding chat messages, rendered with the tokenizer's chat template."""
    length_field: str | None = None
    """A numeric field that already is the sample's length (e.g. ``duration_s``)."""
    length_scale: float = 1.0
    """Positions per unit of ``length_field`` (e.g. 100 mel frames per second)."""
    format: str = "auto"
    """auto | jsonl | json | csv | tsv | parquet | text | hf."""
    on_bad_row: str = "stop"
    """stop | skip: what to do with a malformed row (skipped rows are counted and reported)."""


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The memory a configuration may use on one device."""

    memory_gb: float | None = None
    """Hard cap (GiB) the probe runs under; None = the whole device."""
    headroom_gb: float = 1.0
    """A config fits when its measured peak + headroom <= memory_gb."""

    def describe(self) -> str:
        if self.memory_gb is None:
            return f"no budget.memory_gb: the device's own memory (headroom {self.headroom_gb:g} GiB)"
        return f"budget {self.memory_gb:g} GiB (headroom {self.headroom_gb:g} GiB)"


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """How long and how carefully one configuration is measured."""

    device: str = "auto"
    """auto (cuda if available, else cpu) | cpu | cuda | cuda:N."""
    memory_steps: int = 2
    """Optimizer steps on the worst-case batch (>= 2: AdamW allocates its state at step 1)."""
    burn_in_steps: int = 2
    """Untimed steps on typical batches first: compile, cuDNN autotune, allocator warm-up."""
    min_steps: int = 5
    """Timed steps before the stability test is applied."""
    max_steps: int = 200
    """Timed steps at most."""
    max_seconds: float = 60.0
    """Timed phase stops after this many seconds even if not yet stable."""
    target_rel_ci: float = 0.05
    """Stable when the 95% CI half-width of the mean step time <= this share of the mean. 5%: on an
    H100 (2026-11-27) whole cycles of ~0.12 s steps scattered by ~10%, so 2% took ~400 steps and no
    probe reached it in 200 (2.8-3.6% after 24 s); 5% takes ~60 steps there, ~8 s, and is finer than
    the 10% an ETA is held to. Ranking adds both probes' intervals before calling one faster."""
    timeout_s: float = 900.0
    """The whole child process is killed after this long (status ``timeout``)."""
    seed: int = 0
    """Seed for typical-batch sampling and model init (0 to 2**32 - 1)."""
    reuse_model: bool = True
    """Probes that differ only in batch shape (batch size, accumulation, max_length, padding) run
    one after another in the same worker on the model it already built; a fresh worker follows
    any failure. false: a fresh process and model for every probe (e.g. a factory whose model
    depends on the batch size)."""


STRATEGIES = ("auto", "grid", "random", "bayes")
OBJECTIVES = ("samples_per_second", "tokens_per_second")


@dataclass(frozen=True, kw_only=True)
class TuneSettings:
    """How ``trainfit tune`` searches (the space itself is the ``search:`` section)."""

    strategy: str = "auto"
    """auto (uses memory/throughput structure) | grid | random | bayes (Optuna GP with constraints)."""
    max_trials: int | None = None
    """Probes at most (None: the whole grid for grid, 30 otherwise)."""
    time_budget_s: float | None = None
    """No new probe starts after this many seconds of tuning."""
    objective: str = "samples_per_second"
    """samples_per_second | tokens_per_second."""
    target_effective_batch: int | None = None
    """Derive gradient accumulation so batch_size x accumulation ~= this."""
    constraints: tuple[str, ...] = ()
    """Expressions such as 'lora_r >= 16' that every configuration must satisfy."""
    command_template: str | None = None
    """Your training command with {knob} placeholders, e.g. '--per_device_train_batch_size {batch_size}'."""
    epochs: float = 1.0
    """Epochs of the full run: the runtime estimate is for them, the ``trl sft`` command trains
    them (``--num_train_epochs``), a ``command_template`` gets them as ``{epochs}``."""
    seed: int = 0
    """Seed of the ``random`` strategy's order and of Optuna's sampler (0 to 2**32 - 1)."""
    patience: int = 12
    """random/bayes stop after this many probes without a better feasible config; bayes also
    after its sampler proposes this many measured (or excluded) configs in a row."""
    confirm_rounds: int = 0
    """After the search, probe the best config and the runners-up within its measurement noise
    (or within ``confirm_margin``) again this many times each, interleaved, and rank them by the
    median of all their measurements (for noisy or shared machines; 0 = off)."""
    confirm_margin: float = 0.05
    """Runners-up this close to the best (relative gap in the objective) are confirmed too, even
    when their probes' CIs do not overlap: the CI of one probe does not see a machine that drifts
    between probes."""


@dataclass(frozen=True, kw_only=True)
class Spec:
    """A validated, frozen description of one tuning problem."""

    model: ModelSpec
    data: DataSpec | None
    params: Params
    budget: Budget = field(default_factory=Budget)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    tokenizer: str | None = None
    """A local tokenizer folder or tokenizer.json; default: the ``model.path`` folder when it holds
    a tokenizer, else None = a stated approximate count."""
    search: Any = None
    """The :class:`trainfit.space.SearchSpace` (None when the spec has no ``search:``)."""
    tune: TuneSettings = field(default_factory=TuneSettings)
    source: str | None = None
    """The spec file this came from (for messages and reports)."""

    @property
    def uses_trl_sft(self) -> bool:
        """Is the training command ``trl sft`` (a Hugging Face model, no ``tune.command_template``)?
        It then decides the probe's loss (``loss: auto``) and what the command can express."""
        return is_trl_command(self.model.factory, self.tune.command_template)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view of the resolved spec (what reports and measurements record)."""
        out = dataclasses.asdict(dataclasses.replace(self, search=None))
        out["params"] = self.params.to_dict()
        if self.search is not None:
            out["search"] = {d.name: list(d.choices) if d.choices else {"low": d.low, "high": d.high, "log": d.log}
                             for d in self.search.dims}
        return json.loads(json.dumps(out, default=list))

    def digest(self) -> str:
        """Short stable hash of everything that changes a measurement except ``params``. Settings at
        their defaults are left out, so one that a later trainfit adds (at its default) does not
        change the hash, and a study started before it still resumes."""
        d = self.to_dict()
        for key in ("params", "source", "tune"):
            d.pop(key)
        for name, cls in _SECTIONS.items():
            if isinstance(d.get(name), dict):
                d[name] = without_defaults(d[name], cls)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def without_defaults(values: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """``values`` (a JSON view of a ``cls`` dataclass) less the fields equal to ``cls``'s defaults."""
    defaults = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    defaults = json.loads(json.dumps(defaults, default=list))
    return {k: v for k, v in values.items() if k not in defaults or defaults[k] != v}


_SECTIONS = {
    "model": ModelSpec,
    "data": DataSpec,
    "budget": Budget,
    "probe": ProbeSettings,
    "tune": TuneSettings,
}
_TOP_LEVEL = ("model", "tokenizer", "data", "params", "budget", "probe", "search", "tune")
_DATA_FORMATS = ("auto", "jsonl", "json", "csv", "tsv", "parquet", "text", "hf")


MAX_YAML_VALUES = 100_000
"""Values a spec may hold once its YAML aliases are expanded: a real spec holds a few hundred, and a
600-byte "billion laughs" of nested aliases holds billions (gigabytes once copied)."""


class NotYaml(TrainfitError):
    """The text is not YAML at all (an override's value is then taken as plain text)."""


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice: the later value would replace
    the earlier one without a word (two configs of one name in a comparison, say)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys may be given again
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"found the key {key!r} twice in one mapping (the later would replace the "
                        "earlier): give each its own name", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads a number in scientific notation as text unless it has a dot and a signed
# exponent (``1.0e+9``): ``memory_gb: 1e9`` was "expected a number, got '1e9'" and a model config's
# ``rms_norm_eps: 1e-6`` a string. Read them as YAML 1.2 (and Python, and JSON) do: as numbers.
_UniqueKeys.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_yaml(text: str, where: str) -> Any:
    """YAML text -> plain data, refusing what is not YAML, a mapping with a key twice, and aliases
    that expand past ``MAX_YAML_VALUES`` values (or into themselves); ``1e9`` is a number."""
    try:
        data = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        raise NotYaml(f"{where} is not valid YAML: {err}") from None
    sizes: dict[int, int] = {}  # expanded size of each container seen, by id: shared aliases count once each

    def expanded(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) in sizes:
            if sizes[id(node)] < 0:
                raise TrainfitError(f"{where} has a YAML alias that contains itself", "write the values out")
            return sizes[id(node)]
        sizes[id(node)] = -1  # in progress
        children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        sizes[id(node)] = min(1 + sum(expanded(c) for c in children), MAX_YAML_VALUES + 1)
        return sizes[id(node)]

    try:
        size = expanded(data)
    except RecursionError:
        raise TrainfitError(f"{where} nests its values too deep", "write a flatter spec") from None
    if size > MAX_YAML_VALUES:
        raise TrainfitError(f"{where} expands to more than {MAX_YAML_VALUES:,} values (YAML aliases repeated "
                            "within aliases)", "write the values out, or use fewer nested aliases")
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` -> (dotted key, YAML-typed value). A bare key means ``params.key``, except a
    top-level name: ``tokenizer``, or a whole section (``search={batch_size: [1, 2]}``)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise TrainfitError(f"override {text!r} is not key=value", "e.g. --set batch_size=8")
    if "." not in key and key not in _TOP_LEVEL:
        key = f"params.{key}"
    try:
        parsed = load_yaml(value, f"--set {key}") if value.strip() else None
    except NotYaml as err:
        if value.strip()[:1] in ("{", "["):  # meant as a YAML mapping or list: say what is wrong with it
            raise TrainfitError(err.message, f"to give text that begins with {value.strip()[0]} (a glob, say), "
                                f"quote it in YAML: --set \"{key}='{value.strip()}'\"") from None
        parsed = value  # the text itself
    return key, parsed


def merge_overrides(raw: Mapping[str, Any], overrides: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """A deep copy of ``raw`` with each dotted override set (CLI wins over file)."""
    merged = json.loads(json.dumps(raw))
    for key, value in overrides:
        node = merged
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return merged


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


def _unknown(key: str, what: str, name: str, known: Sequence[str], listing: str) -> Problem:
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
        if f is None:
            problems.append(_unknown(f"{key}.{name}", "unknown key", str(name), list(fields), "known keys"))
        elif (checked := _field_value(f, f"{key}.{name}", value, problems)) is not _INVALID:
            values[name] = checked
    for name, f in fields.items():
        if name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if not any(p.key == f"{key}.{name}" for p in problems):
                problems.append(Problem(f"{key}.{name}", "is required"))
            return None
    return values


def is_trl_command(factory: str | None, command_template: str | None) -> bool:
    """Is the training command a ``trl sft`` one (no user template, a Hugging Face model)? Takes
    the two keys, so a spec being validated can ask too."""
    return not command_template and factory is None


def _trl_problems(model: ModelSpec | None, tune: TuneSettings | None, params: Params | None,
                 space: Any) -> list[Problem]:
    """What a ``trl sft`` command cannot take, said when the spec is loaded rather than after the
    search: TRL's ``--lora_alpha`` is an integer, while the knob is a float (for trainers of one's
    own). ``model``, ``tune``: the spec's sections; ``space``: its ``SearchSpace``, if any."""
    if model is None or tune is None or params is None or not is_trl_command(model.factory, tune.command_template):
        return []
    dim = space.dim("lora_alpha") if space is not None else None
    if dim is not None and dim.is_range:  # a float range proposes fractions, however whole its ends
        floats = not (isinstance(dim.low, int) and isinstance(dim.high, int))
        what = f"a range of floats ({dim.low:g} to {dim.high:g})" if floats else None
    else:
        values = dim.choices if dim is not None else (params.lora_alpha,)
        what = ", ".join(f"{v:g}" for v in values if v is not None and not float(v).is_integer()) or None
    if what is None:
        return []
    key = "params.lora_alpha" if dim is None else "search.lora_alpha"
    return [Problem(key, f"{what}: not a whole number, and trl sft's --lora_alpha takes an integer",
                    "use whole numbers (e.g. 16; a range with integer ends), or a tune.command_template "
                    "for a trainer that takes a float")]


def _loss_problems(model: ModelSpec | None, tune: TuneSettings | None, params: Params,
                   space: Any) -> list[Problem]:
    """``loss`` must be one the training command computes: TRL's fused head for ``trl sft``, and
    none at all for a factory model, which computes its own."""
    if model is None or tune is None:
        return []
    dim = space.dim("loss") if space is not None else None
    values = (params.loss, *(dim.choices if dim is not None else ()))
    key = "search.loss" if dim is not None else "params.loss"
    if model.factory is not None and any(v != "auto" for v in values):
        return [Problem(key, "a factory model computes its own loss; loss applies to Hugging Face models",
                        "drop loss, or name a custom key your factory reads")]
    trl = is_trl_command(model.factory, tune.command_template)
    if trl and "model" in values:
        return [Problem(key, "loss: model, but the training command is `trl sft`, which always computes the loss "
                             "with TRL's fused LM head",
                        "use loss: auto or fused, or a tune.command_template for a trainer that computes the "
                        "full logits")]
    if trl and "liger" in values:
        return [Problem(key, "loss: liger, but the training command is `trl sft`, which keeps its own fused LM head "
                             "and applies no Liger cross-entropy (its --use_liger_kernel adds the layer kernels only)",
                        "use loss: auto or fused, or a tune.command_template for a transformers Trainer script "
                        "that takes --use_liger_kernel")]
    return []


def _searchable_values(params: Params, space: Any, name: str) -> tuple[Any, ...]:
    """Every value knob ``name`` can take: its searched values, else its ``params`` value."""
    dim = space.dim(name) if space is not None else None
    return dim.grid_values() if dim is not None else (getattr(params, name),)


def _lora_options_set(params: Params, space: Any) -> list[str]:
    """The LoRA options (besides the rank) that some config of the search sets."""
    return [n for n in LORA_OPTIONS if any(v is not None for v in _searchable_values(params, space, n))]


def _lora_problems(params: Params, space: Any) -> list[Problem]:
    """LoRA options need a rank. Checked over the search space, not ``params`` alone: a searched
    ``lora_r: [4, 32]`` gives every config a rank; a ``null`` among them is a full fine-tuning
    config, where the options are simply unused (see :func:`unused_lora_note`)."""
    options = _lora_options_set(params, space)
    if not options or any(r is not None for r in _searchable_values(params, space, "lora_r")):
        return []
    searched = space is not None and space.dim("lora_r") is not None
    return [Problem("search.lora_r" if searched else "params.lora_r",
                    f"LoRA options are set ({', '.join(options)}) but lora_r is null",
                    "set lora_r (e.g. 16) or drop the lora_* keys")]


def unused_lora_note(spec: Spec) -> str | None:
    """A line for a search whose ``lora_r`` choices include null (full fine-tuning) beside set LoRA options."""
    options = _lora_options_set(spec.params, spec.search)
    if not options or None not in _searchable_values(spec.params, spec.search, "lora_r"):
        return None
    return (f"lora_r=null configs train every weight (full fine-tuning): {', '.join(options)} apply only to "
            "the configs with a rank")


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


def _check_one_of(section: Any, key: str, name: str, choices: Sequence[str], problems: list[Problem]) -> None:
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


def _check_bounds(section: Any, key: str, names: Sequence[str], bound: str, problems: list[Problem]) -> None:
    """Each field of ``names`` that is set (not None) must satisfy ``bound`` (a key of ``_BOUNDS``).
    Every default satisfies its bound, so a key left out is never reported."""
    for name in names:
        value = getattr(section, name)
        if value is not None and not _BOUNDS[bound](value):
            problems.append(Problem(f"{key}.{name}", f"must be {bound}"))


def _typed_sections(raw: Mapping[str, Any], problems: list[Problem]) -> dict[str, dict[str, Any] | None]:
    """Every section type-checked against its dataclass (``data`` only when given); None for one
    that is not a mapping or lacks a required key."""
    return {name: _section(cls, raw.get(name), name, problems)
            for name, cls in _SECTIONS.items() if name != "data" or raw.get("data") is not None}


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
    from trainfit.data.readers import NotRegularFile, data_files

    try:
        data_files(data.path)  # a file, a folder of shards, a glob pattern or a save_to_disk folder
    except NotRegularFile as err:
        problems.append(Problem("data.path", err.message, err.hint))
    except TrainfitError as err:
        problems.append(Problem("data.path", err.message,
                                "check the path; a relative path starts at the spec's folder"))
    fields_given = [k for k in ("text_field", "messages_field", "length_field") if getattr(data, k) is not None]
    if len(fields_given) > 1:
        problems.append(Problem("data", f"give one of text_field, messages_field, length_field (got {fields_given})"))
    _check_one_of(data, "data", "format", _DATA_FORMATS, problems)
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
    _check_bounds(budget, "budget", ("memory_gb",), "> 0", problems)
    _check_bounds(budget, "budget", ("headroom_gb",), ">= 0", problems)
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
    _check_bounds(probe, "probe", ("memory_steps", "min_steps", "max_steps"), ">= 1", problems)
    _check_bounds(probe, "probe", ("burn_in_steps",), ">= 0", problems)
    _check_bounds(probe, "probe", ("max_seconds", "timeout_s", "target_rel_ci"), "> 0", problems)
    _check_bounds(probe, "probe", ("seed",), SEED_RANGE, problems)
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
    _check_one_of(tune, "tune", "strategy", STRATEGIES, problems)
    _check_one_of(tune, "tune", "objective", OBJECTIVES, problems)
    _check_bounds(tune, "tune", ("max_trials", "target_effective_batch", "patience"), ">= 1", problems)
    _check_bounds(tune, "tune", ("epochs", "time_budget_s"), "> 0", problems)
    _check_bounds(tune, "tune", ("confirm_rounds",), ">= 0", problems)
    _check_bounds(tune, "tune", ("seed",), SEED_RANGE, problems)
    if not 0 <= tune.confirm_margin < 1:
        problems.append(Problem("tune.confirm_margin", "must be between 0 and 1 (a relative gap, e.g. 0.05)"))
    return tune


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


def _template_problems(tune: TuneSettings | None, params: Params, space: SearchSpace | None) -> list[Problem]:
    """``tune.command_template`` may name only knobs (set or searched) and the template's extras."""
    if tune is None or tune.command_template is None:
        return []
    from trainfit.template import TEMPLATE_EXTRAS, template_problem

    names = [*params.to_dict(), *(space.names if space is not None else ()), *TEMPLATE_EXTRAS]
    problem = template_problem(tune.command_template, dict.fromkeys(names))
    return [Problem("tune.command_template", problem)] if problem else []


def _tokenizer(value: Any, model: ModelSpec | None, base_dir: Path, problems: list[Problem]) -> str | None:
    """``tokenizer:`` resolved against ``base_dir``; left out, the model folder's own tokenizer if any."""
    if value is None:
        return model_folder_tokenizer(model.path) if model is not None else None
    if not isinstance(value, str):
        problems.append(Problem("tokenizer", "expected a path"))
        return None
    tokenizer = _resolve(base_dir, value)
    from trainfit.data.readers import special_kind

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
    problems = [_unknown(str(key), "unknown section", str(key), _TOP_LEVEL, "sections are")
                for key in raw if key not in _TOP_LEVEL]
    sections = _typed_sections(raw, problems)
    model = _model_section(sections["model"], base_dir, problems)
    data = _data_section(sections.get("data"), base_dir, problems)
    params = _params_section(raw.get("params"), model, data, problems)
    budget = _budget_section(sections["budget"], problems)
    probe = _probe_section(sections["probe"], problems)
    tune = _tune_section(sections["tune"], problems)
    space = _search_section(raw.get("search"), tune, model, params, problems)
    problems += _template_problems(tune, params, space)
    problems += _loss_problems(model, tune, params, space)
    problems += _lora_problems(params, space)
    problems += _trl_problems(model, tune, params, space)
    tokenizer = _tokenizer(raw.get("tokenizer"), model, base_dir, problems)
    if problems:
        raise SpecError(problems, source=source or "spec")
    # A section that is not a mapping is None here, and added a problem above.
    assert model is not None and budget is not None and probe is not None and tune is not None
    return Spec(model=model, data=data, params=params, budget=budget, probe=probe, tokenizer=tokenizer,
                search=space, tune=tune, source=source)


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
    from trainfit.data.readers import refuse_special

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


__all__ = ["Budget", "DataSpec", "GiB", "ModelSpec", "ProbeSettings", "Spec", "build_spec", "load_spec",
           "merge_overrides", "parse_override"]
