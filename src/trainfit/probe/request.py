"""The probe request: everything a worker process needs to measure one configuration, and the one
record that crosses into it (``request.json`` in the probe's folder). Frozen and versioned, like
the :class:`~trainfit.probe.measurement.Measurement` that comes back."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from trainfit.errors import SpecError
from trainfit.probe.estimate import TypicalMix
from trainfit.params import Params, model_values, parse_params
from trainfit.spec import ModelSpec, ProbeSettings

SCHEMA_VERSION = 3


@dataclass(frozen=True)
class Bar:
    """The best config measured so far with the same learning values (those that change what is
    learned): a probe whose speed, even at the fast end of its 95% interval, stays below this one's
    slow end cannot be the fastest of them, and stops timing (``Measurement.slower_than``)."""

    trial: int
    """The trial that set it."""
    objective: str
    """``samples_per_second`` or ``tokens_per_second`` (the search's objective)."""
    value: float
    """Its measured objective."""
    ci95_rel: float
    """Its step time's 95% interval, as a share (0 where it was not measured)."""

    @property
    def low(self) -> float:
        """The slow end of its interval: the speed at the long end of its step time's."""
        return self.value / (1 + self.ci95_rel)

    def beats(self, value: float, ci95_rel: float) -> bool:
        """Is a probe of ``value`` (its step time's interval ``ci95_rel``) slower than this bar even at
        the fast end of its interval? Never where that interval is not finite or reaches 100%."""
        return 0 <= ci95_rel < 1 and value / (1 - ci95_rel) < self.low


@dataclass(frozen=True, kw_only=True)
class ProbeRequest:
    """One configuration to measure, with the batch lengths chosen from the data analysis."""

    model: ModelSpec
    """Which model to build (the spec's ``model`` section)."""
    command_template: str | None
    """The spec's ``tune.command_template``: the training command decides what ``loss: auto`` means
    (TRL's fused head for ``trl sft``)."""
    params: Params
    """The configuration."""
    probe: ProbeSettings
    """How long and how carefully to measure."""
    device: str
    """``cpu`` or ``cuda:N`` (resolved by the parent)."""
    max_length: int
    """The length samples are truncated at (positions)."""
    worst_lengths: tuple[int, ...]
    """The worst-case micro-batch: the ``batch_size`` longest samples (positions)."""
    typical: TypicalMix
    """The epoch's micro-batches as the trainer batches the data, and the ones to time."""
    truncated_samples: int | None
    """Samples of the dataset longer than ``max_length`` (None without data)."""
    memory_cap_bytes: int | None
    """The budget the worker runs under (None: the whole device)."""
    budget_memory_gb: float | None
    """``budget.memory_gb`` as the spec gives it (None: the device's own memory)."""
    budget_headroom_gb: float
    """``budget.headroom_gb``."""
    timing_rows: tuple[tuple[Any, ...], ...] | None = None
    """``probe.data: real``: the dataset's rows of each timed micro-batch (one tuple per entry of
    ``typical.timing_batches``, the same lengths), as the workload's collate takes them (a Hugging
    Face model's: ``{"input_ids": [...]}``, tokenized); None: synthetic inputs."""
    notes: tuple[str, ...] = ()
    """What the parent noticed (approximate lengths, truncation), kept in the measurement."""
    slower_than: Bar | None = None
    """The search's bar (:class:`Bar`): timing stops once this config is clearly slower. None: time
    it to the stop rule (a probe of its own, the first of its learning values, a confirmation)."""
    schema_version: int = SCHEMA_VERSION

    @property
    def model_key(self) -> str | None:
        """What the model a worker builds for this request depends on: everything but the batch shape
        and, for a Hugging Face model, the knobs the worker switches on a built one (``Knob.switched``).

        None when the model must not be reused: ``probe.reuse_model: false``, or a compiled config
        (a compiled model meeting new shapes recompiles and may switch to dynamic shapes, which a
        fresh run would not do).
        """
        if not self.probe.reuse_model or self.params.compile != "off":
            return None
        view = self.to_dict()
        return json.dumps({"model": view["model"], "command_template": self.command_template,
                           "params": model_values(view["params"], switched=self.model.factory is None), "probe": view["probe"],
                           "device": self.device, "memory_cap_bytes": self.memory_cap_bytes}, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(dataclasses.replace(self, params=Params()))
        out["params"] = self.params.to_dict()
        return json.loads(json.dumps(out, default=list))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> ProbeRequest:
        d = json.loads(text)
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"probe request schema {d.get('schema_version')}, this worker reads {SCHEMA_VERSION}")
        params, problems = parse_params(d["params"], allow_custom=True)
        if problems:
            raise SpecError(problems, source="probe request")
        return cls(**{**d, "model": ModelSpec(**d["model"]), "params": params, "probe": ProbeSettings(**d["probe"]),
                      "worst_lengths": tuple(d["worst_lengths"]), "typical": TypicalMix.from_dict(d["typical"]),
                      "notes": tuple(d["notes"]),
                      "slower_than": Bar(**d["slower_than"]) if d.get("slower_than") else None,
                      "timing_rows": None if d.get("timing_rows") is None
                      else tuple(tuple(rows) for rows in d["timing_rows"])})
