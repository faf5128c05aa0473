"""A measured trial as the strategies see it (:class:`Trial`), the key of a config, and what every
strategy shares: the protocol, a config's model family, the knob values this device cannot run."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trainfit.params import model_values
from trainfit.probe.measurement import Measurement

SAMPLER = "sampler"


def jsonable(values: Mapping[str, Any]) -> dict[str, Any]:
    """Searched values as JSON has them (module lists are tuples in Params)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def config_key(values: Mapping[str, Any]) -> str:
    """Identity of a searched configuration (JSON of the sorted values)."""
    return json.dumps(jsonable(values), sort_keys=True)


@dataclass(frozen=True)
class Trial:
    """One finished probe as the search sees it."""

    number: int
    values: dict[str, Any]
    measurement: Measurement
    objective: float | None
    """The measured objective (None unless the probe succeeded)."""

    @property
    def feasible(self) -> bool:
        return self.measurement.fits

    @property
    def measured_objective(self) -> float:
        """``objective`` of a trial whose probe succeeded (every feasible trial: both objectives are
        measured by a successful probe); raises for one that has none."""
        if self.objective is None:
            raise ValueError(f"trial {self.number} has no objective: its probe did not succeed")
        return self.objective


class Strategy(Protocol):
    name: str

    def propose(self, history: Sequence[Trial], busy: Collection[str] = ()) -> dict[str, Any] | str | None: ...


def model_family(values: Mapping[str, Any]) -> str:
    """Identity of the model a configuration builds: its values but the batch-shape knobs
    (configs of one family can share a built model, see ``probe.reuse_model``)."""
    return config_key(model_values(values))


def unsupported_values(history: Sequence[Trial]) -> list[dict[str, Any]]:
    """Knob values this machine cannot run, as failed probes found them (``Measurement.unsupported``)."""
    return [t.measurement.unsupported for t in history if t.measurement.unsupported]


def can_run(values: Mapping[str, Any], unsupported: Sequence[Mapping[str, Any]]) -> bool:
    """False when ``values`` holds a value a probe found unsupported (one of a knob that is not
    searched holds for every config)."""
    return not any(all(k not in values or values[k] == v for k, v in u.items()) for u in unsupported)

