"""What a plan is made from: a tune output folder's summary and every config it measured."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.data.analyze import analyze_spec
from trainfit.errors import TrainfitError
from trainfit.files import folder_holder
from trainfit.probe.estimate import StepCost, shapes_step_cost
from trainfit.probe.measurement import Measurement
from trainfit.run_folder import RunFolder
from trainfit.search.journal import journal_storage
from trainfit.search.trial_records import record_problem
from trainfit.search.trials import config_key
from trainfit.spec import Spec, build_spec
from trainfit.summary import Summary

if TYPE_CHECKING:
    from trainfit.data.stats import LengthStats


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One config the search measured and found to fit the budget, as a plan can use it."""

    trial: int | None
    """Its trial; None: the spec's config at the user's figure (``estimated.from_throughput``), measured by none."""
    searched: dict[str, Any]
    """The searched knobs' values (the config's name in the search)."""
    config: dict[str, Any]
    """Every knob (``Params.to_dict``)."""
    samples_per_second: float
    """The probe's expected speed over the epoch's own batches (the median of its probes)."""
    step_time_s: float
    """The probe's expected time of one optimizer step over those batches."""
    samples_per_step: float
    """The effective batch, or under packing the epoch's mean samples an optimizer step trains."""
    spread_rel: float
    """The 95% relative half-width of the measured step time, and the epoch fit's largest miss,
    combined (root of the sum of squares): how far the figure may be off by measurement."""
    peak_gb: float
    optimizer_gb: float
    """The optimizer state the probe measured (a checkpoint holds it)."""
    model_gb: float
    shape_times: list[dict[str, Any]]
    """The timed shapes behind the fit (see ``Measurement.shape_times``)."""
    measurement: Measurement | None = None
    """Its (first) probe, for a command built from it."""
    first_sight_s: float = 0.0
    """What a padded length costs the first time a run meets it (``Measurement.first_sight_s``)."""
    first_sights_s: float = 0.0
    """What a fresh run's first epoch pays for meeting its padded lengths, shared out in
    :attr:`step_time_s` (``Measurement.first_sights_s``) ..."""
    epoch_shapes: int = 0
    """... of which it has this many (``Measurement.epoch_shapes``)."""

    @property
    def lora_r(self) -> int:
        return int(self.config.get("lora_r") or 0)

    def step_cost(self) -> StepCost | None:
        """The step cost fitted through :attr:`shape_times` (None without timed shapes)."""
        return shapes_step_cost(self.shape_times, 0.0, self.first_sight_s)

    @property
    def max_length(self) -> int:
        return int(self.config["max_length"])

    @property
    def capacity(self) -> tuple[float, int]:
        """What ``quality`` and ``balanced`` prefer: full fine-tuning over any LoRA rank, a larger rank, then a
        longer ``max_length``."""
        return (float("inf") if not self.lora_r else float(self.lora_r), self.max_length)


@dataclass(frozen=True, kw_only=True)
class TuneRun:
    folder: Path
    summary: Summary
    candidates: list[Candidate]
    """Every fitting config, fastest first."""
    spec_doc: dict[str, Any] | None
    """The spec as the tune was given it (before validation), for what the plan rebuilds from it."""
    left_out: dict[int, str] = field(default_factory=dict)
    """Measured trials whose record in the journal does not read back, by number, with why: left out
    of the plan, as tune leaves them out of its search (it probes their configs again)."""

    def spec(self) -> Spec:
        """The tune's spec rebuilt from the journal's copy, relative paths against the spec file's
        folder as then; a clear error where it cannot be (a study from before trainfit kept it, its
        data or factory moved since)."""
        source = self.summary.spec.source
        if self.spec_doc is None or not source:
            raise TrainfitError(f"{self.folder}'s study holds no spec to rebuild", "tune again with this trainfit")
        return build_spec(self.spec_doc, base_dir=Path(source).parent)


def best_step_cost(folder: Path | RunFolder) -> StepCost | None:
    """The fitted step cost of the tune folder's best config (the one its command trains), with its
    wait for data, by which a calibration prices the steps it times; None where its probe timed no
    shapes."""
    run = load_run(folder)
    best = run.summary.best_config
    assert best is not None  # load_run refuses a folder where nothing fit
    found = next((c for c in run.candidates if c.searched == best.searched), None)
    if found is None:
        return None
    wait = found.measurement.data_wait_s if found.measurement else None
    return shapes_step_cost(found.shape_times, wait or 0.0, found.first_sight_s)


def load_run(run_folder: Path | RunFolder) -> TuneRun:
    """Read a tune output folder: its ``summary.json`` and every probe its study journal kept."""
    run = RunFolder.of(run_folder)
    folder = run.path
    if not folder.is_dir():
        raise TrainfitError(f"{folder} is not a folder", "give the tune output folder (the one holding summary.json)")
    _check_not_running(folder)
    summary = run.summary
    if summary.best_config is None:
        raise TrainfitError(f"no config fit the budget in {folder}: there is nothing to plan",
                            "see its summary.json's all_failed advice, then tune again")
    studies = _studies(folder)
    searched = list(summary.best_config.searched)
    left_out: dict[int, str] = {}
    by_key: dict[str, list[tuple[int, Measurement]]] = {}
    for number, values, m in _measured(studies, searched, left_out):
        if m.fits and m.samples_per_second and m.expected_step_time_s:
            by_key.setdefault(config_key(values), []).append((number, m))
    candidates = [_candidate(runs, searched) for runs in by_key.values()]
    candidates.sort(key=lambda c: -c.samples_per_second)
    doc = next((s.user_attrs["spec"] for s in studies if "spec" in s.user_attrs), None)
    return TuneRun(folder=folder, summary=summary, candidates=candidates, spec_doc=doc,
                   left_out=dict(sorted(left_out.items())))


def _check_not_running(folder: Path) -> None:
    """Refuse a folder whose tune still runs before it wrote its first ``summary.json`` (it writes
    one as its first config is measured): a tune holds its output folder's ``.lock`` while it runs.
    A folder without a ``.lock`` is asked nothing (asking would leave one in it)."""
    if (folder / "summary.json").is_file() or not (folder / ".lock").is_file():
        return
    holder = folder_holder(folder)
    if holder is not None:
        raise TrainfitError(f"a tune is still running in {folder} ({holder}), and it has no summary.json yet",
                            "wait for it to write its summary.json (after its first measured config; `trainfit "
                            "plan` then plans from what it measured so far), or plan from another tune folder")


def _studies(folder: Path) -> list[Any]:
    """The Optuna studies of the folder's journal (tune keeps one per folder)."""
    import optuna

    journal = folder / "study.journal"
    if not journal.is_file():
        raise TrainfitError(f"{folder} holds no study.journal, where tune keeps every config it measured",
                            "plan a tune that kept its trials in its output folder (a --storage run keeps them "
                            "in its database)")
    storage = journal_storage(journal)
    # The storage's list, not optuna.get_all_study_summaries, which reads each trial's constraint (Optuna 5.1):
    # a damaged one there would be a bare TypeError, where a damaged record is left out with why (_measured).
    return [optuna.load_study(study_name=s.study_name, storage=storage) for s in storage.get_all_studies()]


def _measured(studies: list[Any], names: list[str],
              left_out: dict[int, str]) -> Iterator[tuple[int, dict[str, Any], Measurement]]:
    """Every probe of the studies (confirmation repeats too): trial number, searched values,
    measurement. A trial whose record does not read back is left out as tune leaves it out (by the
    same check, :func:`~trainfit.search.trial_records.record_problem`) and put in ``left_out`` with why,
    never refused: it stays in the journal (a finished trial cannot change) after ``tune --resume``
    measured its config again."""
    from optuna.trial import TrialState

    for study in studies:
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.user_attrs.get("measurement") is None or t.user_attrs.get("reused"):
                continue
            problem = record_problem(t, names)
            if problem is not None:
                left_out[t.number] = problem
                continue
            yield t.number, t.user_attrs.get("values", t.params), Measurement.from_dict(t.user_attrs["measurement"])


def probe_spread(m: Measurement) -> float:
    """How far a probe's speed may be off by measurement: its step time's 95% relative half-width and
    the epoch fit's largest miss, combined (root of the sum of squares); the half-width alone where
    it comes from the fit's residuals (``step_time_ci95_basis: fit``), which hold the miss already."""
    if m.step_time_ci95_basis == "fit":
        return m.step_time_ci95_rel or 0.0
    return ((m.step_time_ci95_rel or 0.0) ** 2 + (m.fit_error_rel or 0.0) ** 2) ** 0.5


def _candidate(runs: list[tuple[int, Measurement]], searched: list[str]) -> Candidate:
    """A config from its probes (a confirmed config has several): the median speed and first sights,
    the first probe's shapes and memory."""
    trial, m = runs[0]
    sps = statistics.median(r.samples_per_second or 0.0 for _, r in runs)
    step = statistics.median(r.expected_step_time_s or 0.0 for _, r in runs)
    sight, sights = (statistics.median(getattr(r, name) or 0.0 for _, r in runs)
                     for name in ("first_sight_s", "first_sights_s"))
    parts = m.memory_parts_bytes
    return Candidate(trial=trial, searched={k: m.config.get(k) for k in searched}, config=dict(m.config),
                     samples_per_second=sps, step_time_s=step,
                     samples_per_step=float(m.samples_per_step or m.config.get("batch_size", 1)),
                     spread_rel=probe_spread(m), peak_gb=float(m.peak_memory_gb or 0.0),
                     optimizer_gb=parts.get("optimizer", 0) / 2**30, model_gb=parts.get("model", 0) / 2**30,
                     shape_times=list(m.shape_times), measurement=m, first_sight_s=sight, first_sights_s=sights,
                     epoch_shapes=m.epoch_shapes or 0)


@dataclass(frozen=True)
class Rebuilt:
    """The tune's spec validated again, and its data's lengths (None without data)."""

    spec: Spec
    stats: LengthStats | None


def rebuild(run: TuneRun) -> Rebuilt | None:
    """The tune's spec and its data's lengths (from the length cache, or counted again), for the
    shorter ``max_length`` options and a command tune did not write; None when the spec cannot be
    rebuilt here (its data moved, say)."""
    try:
        spec = run.spec()
        return Rebuilt(spec, analyze_spec(spec, progress=False) if spec.data is not None else None)
    except (TrainfitError, OSError):
        return None
