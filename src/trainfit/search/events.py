"""What a running search reports, one frozen record per kind: ``SearchOptions.on_event`` gets
them in order; ``trainfit tune`` renders them (``cli/tune_render.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from trainfit.probe.events import ProbeEvent
from trainfit.probe.measurement import Measurement
from trainfit.search.trials import Trial


@dataclass(frozen=True)
class SharedStudy:
    """The run joined a study in a shared storage: its name (every machine of one search prints
    the same), the trials it holds, and other studies of the same spec file with what differs."""

    name: str
    trials: int
    others: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Resumed:
    """An earlier run's trials were found; ``retried`` of them were cut off and are probed again."""

    trials: int
    retried: int


@dataclass(frozen=True)
class JournalRepaired:
    """The journal's damaged tail (from ``line`` of ``lines``) was dropped; ``backup`` is the file as it was."""

    journal: str
    line: int
    lines: int
    reason: str
    backup: str


@dataclass(frozen=True)
class TrialsLost:
    """Trials an earlier run measured that the study no longer holds readably (see
    ``TrialStore.lost``): a record of the wrong type, or a trial trials.csv shows and the journal
    lacks. Their configs count as never measured, so the search probes them again."""

    storage: str
    """The output folder's journal, or the --storage URL (its password hidden)."""
    trials: Mapping[int, str]
    """Trial number -> what is wrong with it, in words."""


@dataclass(frozen=True)
class Waiting:
    """Other runs of a shared storage probe ``busy`` configs; ``searching``: their results decide
    what to probe next (else the summary waits for them)."""

    busy: int
    searching: bool
    elapsed_s: float


@dataclass(frozen=True)
class StorageLost:
    """The shared ``--storage`` stopped answering (its database server restarting, the network to it
    cut): the run waits and retries the call that failed, at most ``patience_s``; what it measured
    meanwhile is kept and recorded once the storage answers."""

    storage: str
    """The --storage URL, its password hidden."""
    reason: str
    """The driver's first line about it."""
    patience_s: float


@dataclass(frozen=True)
class StorageBack:
    """The shared ``--storage`` answers again after ``waited_s`` seconds: the run goes on where it was."""

    storage: str
    waited_s: float


@dataclass(frozen=True)
class TrialStart:
    """A probe of ``values`` begins: the ``index``-th trial of at most ``max_trials``."""

    number: int
    index: int
    max_trials: int
    refining: bool
    """Probed by --refine, after the search proper."""
    values: Mapping[str, Any]
    elapsed_s: float


@dataclass(frozen=True)
class ProbeProgress:
    """What the probe in flight reports (its phase, its timed steps)."""

    event: ProbeEvent


@dataclass(frozen=True)
class TrialEnd:
    """A trial's measurement, with the best so far and the mean probe time (for the time left)."""

    number: int
    index: int
    max_trials: int
    refining: bool
    values: Mapping[str, Any]
    measurement: Measurement
    best: Trial | None
    elapsed_s: float
    mean_probe_s: float


@dataclass(frozen=True)
class ConfirmStart:
    """Confirmation round ``round`` of ``rounds`` re-probes ``values``."""

    round: int
    rounds: int
    values: Mapping[str, Any]


@dataclass(frozen=True)
class ConfirmEnd:
    round: int
    rounds: int
    values: Mapping[str, Any]
    measurement: Measurement


TuneEvent = Union[SharedStudy, Resumed, JournalRepaired, TrialsLost, Waiting, StorageLost, StorageBack, TrialStart,
                  ProbeProgress, TrialEnd, ConfirmStart, ConfirmEnd]
