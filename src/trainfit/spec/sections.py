"""The spec's sections as frozen dataclasses (``model``, ``data``, ``budget``, ``probe``, ``tune``,
``plan``; ``train`` is :mod:`trainfit.spec.training`'s)
and :class:`Spec`, the whole of it: what a user's YAML becomes once checked."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainfit.params import Params
from trainfit.spec.training import TrainValues

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
    audio_field: str | None = None
    """A field naming each sample's audio file (relative to the data file's folder): its duration,
    read from the file's header, times ``length_scale`` is the length."""
    length_scale: float = 1.0
    """Positions per unit of ``length_field``, or per second of ``audio_field``'s audio (e.g. 75
    codec frames, or 100 mel frames: the sample rate over the hop length)."""
    length_by: str = "sum"
    """With a text field (or messages) and an audio field both: the length that drives memory, and so
    is each sample's: ``sum`` (text tokens and audio frames in one sequence), ``max``, ``text`` or
    ``audio``. Both are kept and shown by ``trainfit analyze``."""
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
    probe reached it in 200 (2.8-3.6% after 24 s); 5% would take ~60 steps there (~8 s, worked out
    from those figures), and is finer than
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
    data: str = "auto"
    """What the timed steps train on. ``real``: rows of the dataset with the typical batches'
    lengths, made into inputs by a torch ``DataLoader`` with the config's loader knobs
    (``num_workers``...) as the trainer makes them (a Hugging Face model: tokenized with the spec's
    tokenizer; a factory: its ``collate``), so the time a step waits for data is measured.
    ``synthetic``: inputs made on the device, no loader (faster to set up; the model's speed alone).
    ``auto``: real where the data can be read so, else synthetic with a note saying why."""


PROBE_DATA = ("auto", "real", "synthetic")
LENGTH_BY = ("sum", "max", "text", "audio")
"""How a sample with text and audio both is as long (``DataSpec.length_by``)."""


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


PRIORITIES = ("fast", "balanced", "quality", "memory_efficient")
"""``trainfit plan``'s priorities (``plan.choose.RULES`` says what each picks)."""


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """How ``trainfit plan`` fits the run into its window, as guide 002's training_config.json holds
    them; ``plan``'s flags win. The epochs are ``tune.epochs``: the tune's estimate, its command and
    the plan count one run."""

    max_hours: float | None = None
    """The time window, in hours (None: ``plan --max-hours`` gives it)."""
    priority: str = "balanced"
    """fast | balanced | quality | memory_efficient: how the plan chooses among the measured configs."""
    margin_minutes: float = 30.0
    """Safety margin taken off the window."""
    checkpoint_minutes: float = 30.0
    """A checkpoint this often."""


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
    plan: PlanSettings = field(default_factory=PlanSettings)
    train: TrainValues = field(default_factory=TrainValues)
    """``train:``: the values a real run trains by and where its metrics go (out of the digest: a
    step's cost does not depend on them)."""
    source: str | None = None
    """The spec file this came from (for messages and reports)."""
    stated: frozenset[str] | None = None
    """The ``params:`` knobs the spec file and its ``--set`` overrides state (the rest are
    ``Params``' defaults); None: not known (a spec built in code), as if every knob were stated."""

    @property
    def batch_open(self) -> bool:
        """Does the spec leave the batch to the search: no ``batch_size``, no
        ``gradient_accumulation_steps`` and no ``tune.target_effective_batch`` stated? Its default
        search then climbs the batch size to what fits, as the peers' batch finders do, and the
        effective batch is the batch the search picks (it changes what is learned, and says so)."""
        return (self.stated is not None and not self.stated & {"batch_size", "gradient_accumulation_steps"}
                and self.tune.target_effective_batch is None)

    @property
    def uses_trl_sft(self) -> bool:
        """Is the training command ``trl sft`` (a Hugging Face model, no ``tune.command_template``)?
        It then decides the probe's loss (``loss: auto``) and what the command can express."""
        return is_trl_command(self.model.factory, self.tune.command_template)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view of the resolved spec (what reports and measurements record)."""
        out = dataclasses.asdict(dataclasses.replace(self, search=None, stated=None))
        del out["stated"]  # how the file was written, not what is measured
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
        for key in ("params", "source", "tune", "plan", "train"):  # how a search or a plan runs, not what is measured
            d.pop(key)
        for name, cls in SECTIONS.items():
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


def is_trl_command(factory: str | None, command_template: str | None) -> bool:
    """Is the training command a ``trl sft`` one (no user template, a Hugging Face model)? Takes
    the two keys, so a spec being validated can ask too."""
    return not command_template and factory is None


SECTIONS = {
    "model": ModelSpec,
    "data": DataSpec,
    "budget": Budget,
    "probe": ProbeSettings,
    "tune": TuneSettings,
    "plan": PlanSettings,
    "train": TrainValues,
}


TOP_LEVEL = ("model", "tokenizer", "data", "params", "budget", "probe", "search", "tune", "plan", "train")
