"""``summary.json`` as typed records: what a tuning run found, written by ``trainfit.tune.outputs`` and
read by the CLI, ``report.html`` and any script (``Summary.from_json``).

The records are frozen dataclasses whose fields are the file's keys, in the file's order, so
``to_json`` writes exactly the JSON the earlier dict did. ``SCHEMA_VERSION`` changes when a key
changes meaning or goes away; a new key keeps it. ``summary.json`` is a superset of the seeds'
``bayesopt_summary.json`` (``total_tested``, ``successful``, ``failed_oom``, ``best_config`` with
``samples_per_second``, ``memory_peak_gb``, ``estimated_full_runtime_hours`` and ``config``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainfit.json_record import Malformed, Record, check_bounds, check_finite, check_schema, finite, typed

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class ConfigEntry(Record):
    """One measured config as the summary reports it (the best, a runner-up, the fastest per value)."""

    trial: int
    samples_per_second: float | None = field(metadata={"at_least": 0.0})
    tokens_per_second: float | None
    speed_basis: str | None
    """Which batches the speeds stand for: the epoch's own under the trainer's batching."""
    padding_share: float | None
    """Share of those batches' positions that are padding."""
    memory_peak_gb: float | None
    memory_parts_gb: dict[str, float]
    mfu: float | None
    stable: bool | None
    confirmed_median: float | None
    """The median of the config's confirmation probes (``--confirm``), None when not confirmed."""
    estimated_full_runtime_hours: float | None = field(metadata={"at_least": 0.0})
    searched: dict[str, Any]
    """The searched knobs' values: the config's name in the search space."""
    effective_batch_size: int
    config: dict[str, Any]
    """Every knob of the config (``Params.to_dict``)."""
    command: str | None
    """The training command of this config (None when it cannot be written)."""
    probe_samples_per_second: float | None = field(default=None, metadata={"omit_none": True})
    """The probe's own samples/s, the model's step alone (the median of its measurements when
    confirmed). With a trainer cost (:class:`TrainerCost`, ``tune --calibrate``),
    ``samples_per_second``, ``tokens_per_second``, ``confirmed_median`` and
    ``estimated_full_runtime_hours`` include the trainer's cost; without one they are the probe's.
    Absent from a summary written before it was kept."""
    spread_rel: float | None = field(default=None, metadata={"omit_none": True})
    """The probe's 95% interval of its step time, relative (``Measurement.step_time_ci95_rel``):
    how far ``samples_per_second`` may be off by the probe's own noise. Absent where unknown."""
    samples_per_step: float | None = field(default=None, metadata={"omit_none": True})
    """Under ``packing`` (a row holds several samples): the samples an optimizer step trains, the
    epoch's mean (``Measurement.samples_per_step``); absent otherwise, where it is
    ``effective_batch_size``."""

    @property
    def probe_speed(self) -> float | None:
        """The probe's expected samples/s of this config over the epoch's own batches, before any
        trainer cost: what a calibration compares the trainer's steps with."""
        return self.probe_samples_per_second if self.probe_samples_per_second is not None else self.samples_per_second

    def objective(self, name: str) -> float | None:
        """The value of objective ``name`` (``samples_per_second`` or ``tokens_per_second``)."""
        value = getattr(self, name)
        return None if value is None else float(value)


@dataclass(frozen=True, kw_only=True)
class Tie(Record):
    """A runner-up the probes cannot tell apart from the best (see ``search.ranking.within_noise``)."""

    trial: int
    searched: dict[str, Any]
    samples_per_second: float | None
    gap: float
    """How much slower it measured, as a fraction of the best's objective."""
    noise: float
    """How much slower the two probes' intervals let it measure while being as fast."""


@dataclass(frozen=True, kw_only=True)
class Confirmation(Record):
    """Every measurement of one confirmed config (``--confirm``): the search's, then the repeats'."""

    trial: int
    searched: dict[str, Any]
    median: float | None
    measurements: list[float | None]
    """None: a repeat that did not fit."""


@dataclass(frozen=True, kw_only=True)
class UnsupportedValue(Record):
    """A knob value this machine cannot run (the search skipped every config with it)."""

    knob: str
    value: Any
    trial: int
    message: str | None


@dataclass(frozen=True, kw_only=True)
class PrunedFamily(Record):
    """Configs the ``auto`` search left unprobed because they could not win, and why."""

    config: dict[str, Any]
    """The searched knobs' values but the batch size."""
    up_to_batch: int | None
    """Its batch sizes up to this one were skipped (None: every batch size)."""
    reason: str


@dataclass(frozen=True, kw_only=True)
class LeverAside(Record):
    """A lever the search left out because it changes what is learned, measured on the pick so that
    what it would buy is known (``packing``): the user decides."""

    knob: str
    value: Any
    searched: dict[str, Any]
    """The pick's values with the lever."""
    status: str
    """Its probe's status (``ok``, ``oom``...)."""
    samples_per_second: float | None
    speedup: float | None
    """Its probe's samples/s over the pick's probe's (None: it did not run)."""
    peak_gb: float | None
    fits: bool
    why: str
    """Why it is not taken by default."""
    how: str
    """How to take it."""


@dataclass(frozen=True, kw_only=True)
class ProbeNote(Record):
    """A note the probes made (a truncation, a loss, a dtype), with the trials that made it."""

    note: str
    trials: list[int]


@dataclass(frozen=True, kw_only=True)
class Budget(Record):
    memory_gb: float | None
    headroom_gb: float
    of: str
    """``the spec``, or ``the device (no budget.memory_gb)``."""

    @property
    def of_device(self) -> bool:
        return self.of.startswith("the device")


@dataclass(frozen=True, kw_only=True)
class Lengths(Record):
    """How the worst-case and typical batches were drawn: the data's lengths, in positions."""

    description: str
    min: int
    median: float
    p99: float
    max: int
    model_positions: int | None


@dataclass(frozen=True, kw_only=True)
class MeasuredPeak(Record):
    searched: dict[str, Any]
    peak_gb: float | None
    status: str
    oom_needs_more_than_gb: float | None


@dataclass(frozen=True, kw_only=True)
class SmallestPeak(Record):
    """The config that came closest to fitting, where its peak went, and the budget it needs."""

    searched: dict[str, Any]
    status: str
    peak_gb: float
    parts_gb: dict[str, float]
    oom_needs_more_than_gb: float | None
    needs_memory_gb: float
    at_least: bool
    """True for an OOM: it needs at least ``needs_memory_gb``."""
    full_logits_gb: float | None


@dataclass(frozen=True, kw_only=True)
class AllFailed(Record):
    """When no config fits: every measured peak, the closest one, and what to change."""

    measured_peaks_gb: list[MeasuredPeak]
    smallest_peak: SmallestPeak | None
    advice: list[str]


@dataclass(frozen=True, kw_only=True)
class TrainerCost(Record):
    """The trainer's own time beyond the model's step, measured once by ``tune --calibrate N`` on
    the config the probes ranked first and added to every config's steps (per micro-batch) before
    the ranking, the speeds and the command: the speed of the run, not of the model's step alone."""

    schema_version: int = 1
    per_micro_batch_s: float = field(metadata={"at_least": 0.0})
    """Seconds; at least 0 (``Calibration.trainer_overhead_s`` is)."""
    trial: int = field(metadata={"at_least": 0})
    """The config it was measured on: the probes' pick when it was measured."""
    searched: dict[str, Any]
    calibration: dict[str, Any]
    """The whole measurement (``trainfit.trainer.calibration.Calibration``'s JSON, versioned on its own), which
    ``trainfit plan`` reuses: its start-ups, its spread, the command it ran."""
    measured: list[dict[str, Any]] = field(default_factory=list)
    """Each config the trainer ran (``trial``, ``searched``, ``config``: its searched knobs as the
    probe's config holds them, its own ``per_micro_batch_s`` and ``micro_batches`` a step), ranked by
    its own cost: the probes' pick, and where the cost moved the pick to a config the trainer had not
    run, that one too; ``per_micro_batch_s`` is then theirs pooled, the other configs' cost. Empty in
    a cost recorded before it was kept: the one of ``trial``, whose cost is everyone's."""

    def per_micro_batch_for(self, config: Mapping[str, Any]) -> float:
        """The trainer's cost per micro-batch of ``config`` (a measurement's whole config): its own
        where the trainer ran it, else :attr:`per_micro_batch_s`."""
        own = next((m["per_micro_batch_s"] for m in self.measured  # a config of {}: recorded before it was kept
                    if m["config"] and all(config.get(k) == v for k, v in m["config"].items())), None)
        return self.per_micro_batch_s if own is None else float(own)

    def timed(self) -> list[dict[str, Any]]:
        """The configs the trainer ran: :attr:`measured`, or (recorded before it was kept) the one of :attr:`trial`."""
        return self.measured or [{"trial": self.trial, "searched": self.searched, "config": {},
                                  "per_micro_batch_s": self.per_micro_batch_s,
                                  "micro_batches": int(self.calibration.get("micro_batches") or 1)}]

    def joined(self, other: TrainerCost) -> TrainerCost:
        """This cost and ``other`` (another config's, timed after the pick moved to it): each config
        ranked by its own, the others by their pooled cost per micro-batch (their per-step costs over
        their micro-batches), ``other``'s calibration at the top."""
        timed = [*self.timed(), *other.timed()]
        pooled = (sum(m["per_micro_batch_s"] * m["micro_batches"] for m in timed)
                  / sum(m["micro_batches"] for m in timed))
        return dataclasses.replace(other, per_micro_batch_s=pooled, measured=timed)

    def words(self) -> str:
        """What the trainer's runs measured, for a reader: each config's own cost where it ran several."""
        if len(self.measured) < 2:
            return f"{self.per_micro_batch_s * 1000:.3g} ms a micro-batch, timed on trial {self.trial}"
        each = ", ".join(f"{m['per_micro_batch_s'] * 1000:.3g} ms on trial {m['trial']}" for m in self.measured)
        return (f"a micro-batch {each}, each config ranked by its own; the others at their pooled "
                f"{self.per_micro_batch_s * 1000:.3g} ms")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TrainerCost:
        check_schema(raw, 1, "a trainer cost", "calibrate again with this trainfit (tune --calibrate N --resume)")
        check_finite(raw)  # its calibration's too: Calibration.to_json writes an unknown figure as null
        for k, m in enumerate(typed(list[Any], raw.get("measured", []), "measured", nullable=False)):
            typed(dict[str, Any], m, f"measured[{k}]", nullable=False)
            for name, kind in MEASURED_ENTRY.items():
                if m.get(name) is None:
                    raise Malformed(f"measured[{k}].{name}", "missing")
                typed(kind, m[name], f"measured[{k}].{name}")  # a searched knob's null is a value
            check_bounds(f"measured[{k}].per_micro_batch_s", m["per_micro_batch_s"], {"at_least": 0.0})
            check_bounds(f"measured[{k}].micro_batches", m["micro_batches"], {"at_least": 1})
        return super().from_json(raw)


MEASURED_ENTRY: dict[str, Any] = {"trial": int, "searched": dict[str, Any], "config": dict[str, Any],
                                  "per_micro_batch_s": float, "micro_batches": int}
"""What each of :attr:`TrainerCost.measured` holds."""


@dataclass(frozen=True, kw_only=True)
class RecordedSpec(Record):
    """The resolved spec a tune ran (``Spec.to_dict()``), as ``summary.json`` records it: one key a
    section, in the spec's order (a test keeps the two the same), each section the spec's own JSON
    (``trainfit.spec`` reads those; this record does not repeat them), with typed accessors for
    what later steps read of it."""

    model: dict[str, Any]
    data: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    search: dict[str, Any] | None = None
    tune: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    """``plan:``, what ``trainfit plan`` reads of the spec where its flags say nothing (empty: a tune
    before the section existed)."""
    train: dict[str, Any] = field(default_factory=dict)
    """``train:``, the values a real run trains by (empty: a tune before the section existed)."""
    source: str | None = None
    """The spec file the tune read."""

    @property
    def command_template(self) -> str | None:
        """``tune.command_template`` (None: the command is the ``trl sft`` one trainfit writes)."""
        return self.tune.get("command_template")

    @property
    def factory(self) -> str | None:
        """``model.factory``: a custom model's ``module:function`` (None: a Hugging Face model)."""
        return self.model.get("factory")

    @property
    def data_path(self) -> str | None:
        """``data.path``: the data the tune measured (None: it had none)."""
        return (self.data or {}).get("path")


@dataclass(frozen=True, kw_only=True)
class Summary(Record):
    """``summary.json``: the counts, the best config and its runners-up, the evidence behind the
    pick, and what the run was (spec, device, versions)."""

    schema_version: int = SCHEMA_VERSION
    created_at: str
    total_tested: int
    successful: int
    failed_oom: int
    over_budget: int
    failed_error: int
    failed_timeout: int
    failed_diverged: int = 0
    """Configs whose loss was not finite (status ``diverged``)."""
    best_config: ConfigEntry | None
    runners_up: list[ConfigEntry]
    within_noise_of_best: list[Tie]
    confirmation: list[Confirmation]
    fastest_per_value: dict[str, dict[str, ConfigEntry]]
    """Per searched knob that changes what is learned: the fastest config of each of its values."""
    unsupported: list[UnsupportedValue]
    pruned: list[PrunedFamily] = field(default_factory=list)
    """What the ``auto`` search did not probe because it could not win (a memory-only knob at a
    batch that fits without it), and why."""
    aside: list[LeverAside] = field(default_factory=list)
    """Levers the default search leaves out because they change what is learned, measured on the pick."""
    notes: list[ProbeNote]
    objective: str
    strategy: str
    stop_reason: str
    tuning_time_s: float
    """This part's: a resumed tune's last process, from its start."""
    total_tuning_time_s: float | None = field(default=None, metadata={"omit_none": True})
    """A resumed tune's parts together (absent: one part, ``tuning_time_s``)."""
    probe_time_s: float
    budget: Budget
    epochs_for_estimate: float = field(metadata={"above": 0.0})
    dataset_samples: int | None = field(metadata={"at_least": 0})
    lengths: Lengths | None
    device: str | None
    versions: dict[str, Any]
    spec: RecordedSpec
    all_failed: AllFailed | None = field(default=None, metadata={"omit_none": True})
    budget_matrix: list[dict[str, Any]] | None = field(default=None, metadata={"omit_none": True})
    """With ``tune --budgets``: the fastest config under each budget (``budgets.json``'s rows)."""
    trainer_cost: TrainerCost | None = field(default=None, metadata={"omit_none": True})
    """With ``tune --calibrate``: what the ranking and the speeds add to each step."""

    def entry(self, trial: int) -> ConfigEntry | None:
        """The measured config of ``trial`` as the summary reports it (the best, a runner-up, a fastest
        per value); None where it reports it nowhere."""
        per_value = (e for per in self.fastest_per_value.values() for e in per.values())
        return next((e for e in (self.best_config, *self.runners_up, *per_value) if e is not None and e.trial == trial),
                    None)

    @property
    def command_template(self) -> str | None:
        """The spec's ``tune.command_template`` (None: the command is the ``trl sft`` one trainfit writes)."""
        return self.spec.command_template

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Summary:
        check_schema(raw, SCHEMA_VERSION, "summary.json",
                     "read it with the trainfit version that wrote it, or tune again")
        check_finite(raw)
        return super().from_json(raw)

    def to_json(self) -> dict[str, Any]:
        """The file's content; refused where a figure is NaN or an infinity (:func:`finite`), which
        every writer of ``summary.json`` (``report``, ``budgets``) writes through."""
        return finite(super().to_json(), "summary.json")
