"""``trainfit plan``: fit a training run into a time window, from what ``tune`` measured.

A plan never guesses a throughput: the ETA is the epoch's real work at the speed the probes
measured over the data's own batches (``inputs``), plus the trainer's per-step cost where
``--calibrate`` measured it and the checkpoint saves timed on the output disk (``eta``). The
priorities are rules over the measured configs (``choose``); a run that does not fit gets ranked
options, each with its own ETA (``options``). Before the hardware, a plan takes the user's figure or
a measured run scaled to another device, and says in all it writes that it is estimated, not
measured (``estimated``)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.errors import TrainfitError
from trainfit.json_record import Record, check_schema
from trainfit.params import parse_params
from trainfit.plan.choose import PRIORITIES, RULES, choose, of_trial
from trainfit.plan.estimated import Estimated, from_throughput, like_estimated, like_lines, scaled_to, throughput_lines
from trainfit.plan.eta import Eta, checkpoint_bytes, estimate, run_speed, write_speed
from trainfit.plan.eval_pass import Evaluation, eval_set, measure_eval_pass, trl_dataset
from trainfit.plan.from_compare import Winner, keep_learned
from trainfit.plan.inputs import Candidate, Rebuilt, TuneRun, load_run, rebuild
from trainfit.plan.learned import learned
from trainfit.plan.options import Option, fewer_epochs, ranked, subset
from trainfit.plan.rests_on import is_the_tunes, left_out, rests_on
from trainfit.plan.spare import has_room, more_epochs, plan_options
from trainfit.run_folder import TRAINER_COST_FILE, RunFolder
from trainfit.spec.training import TrainValues
from trainfit.summary import Summary
from trainfit.trainer.calibration import Calibration
from trainfit.trainer.command import build_command, command_inputs, trl_data_config, with_eval_split

if TYPE_CHECKING:
    from trainfit.data.stats import LengthStats
    from trainfit.spec import Spec

EtaOf = Callable[..., Eta]
"""A config's run priced: ``eta(candidate, samples=the plan's)``."""

SCHEMA_VERSION = 1

MAX_EPOCHS = 1_000_000
"""The most epochs a plan takes: past any run (a window is a year at most), and a bound that keeps
every figure a plan computes from them finite (a count of samples beyond 1e308 is no number)."""

__all__ = ["MAX_EPOCHS", "PRIORITIES", "Plan", "make_plan", "plan_from_throughput"]


@dataclass(frozen=True, kw_only=True)
class Choice(Record):
    """The config a priority picks and its run's ETA."""

    priority: str
    trial: int
    searched: dict[str, Any]
    eta_s: float
    fits: bool


@dataclass(frozen=True, kw_only=True)
class Plan(Record):
    """``plan.json``: the inputs, what the estimate rests on, the chosen config, its ETA and
    interval, the checkpoint interval, and what to change when the run does not fit."""

    schema_version: int = SCHEMA_VERSION
    created_at: str
    run_dir: str
    """The tune folder the plan rests on; for a plan from the user's figure, which rests on none, the spec."""
    max_hours: float
    margin_minutes: float
    window_s: float
    """The time the run may take: the window less the safety margin."""
    epochs: float
    dataset_samples: int
    priority: str
    rule: str
    trial: int | None
    """The chosen config's trial; None: a plan from the user's figure, of the spec's config."""
    searched: dict[str, Any]
    config: dict[str, Any]
    samples_per_second: float
    """The probe's expected speed of the chosen config (before calibration)."""
    peak_gb: float
    command: str | None
    """The chosen config's training command for this run: ``tune``'s, with the plan's epochs and a
    checkpoint every ``save_steps`` steps for a ``trl sft`` command; a command template as tune wrote
    it. None: tune wrote none for this config."""
    save_steps: int
    """Optimizer steps between checkpoints: the checkpoint interval at the expected step time."""
    eta: Eta
    fits: bool
    checkpoint_every_s: float
    checkpoint_bytes: int
    write_bytes_per_s: float
    calibration: dict[str, Any] | None
    rests_on: list[str]
    """What the estimate rests on, in words, and what it leaves out."""
    priorities: list[Choice]
    """What each priority would pick, for comparison."""
    options: list[Option] = field(default_factory=list)
    """When the run does not fit: what would, ranked."""
    step_cost: list[float] | None = None
    """The chosen config's fitted step cost ``[a, b, c]``: ``a + b*L + c*L**2`` seconds for an
    optimizer step whose micro-batches are padded to ``L``; what the monitor weighs each batch
    it sees by. None: no timed shapes (a plan from an older trainfit)."""
    model_step_s: float | None = None
    """The probe's expected step over the epoch's batches (``eta.step_time_s`` less the trainer's
    calibrated cost), with a share of an epoch's first sights of its lengths (``eta.first_sights``)."""
    evaluation: Evaluation | None = None
    """The eval set, its schedule and one pass's measured cost; None: the run evaluates nothing."""
    estimated: Estimated | None = field(default=None, metadata={"omit_none": True})
    """A plan before the hardware (``--throughput``, ``--like``): where its speed comes from and the
    interval it can claim; absent from a plan of what was measured on the device."""
    max_steps: int | None = field(default=None, metadata={"omit_none": True})
    """The run stops after this many optimizer steps (an applied ``subset`` option: that many steps'
    samples, drawn from the whole dataset); None: its epochs decide."""
    applied: Option | None = field(default=None, metadata={"omit_none": True})
    """The option of the plan before which this plan applies (``plan --apply N``)."""
    from_compare: Winner | None = field(default=None, metadata={"omit_none": True})
    """The compare config this plan carries on (``plan --from-compare``): its configs learn as it
    does, and its run trains with its training values."""

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Plan:
        check_schema(raw, SCHEMA_VERSION, "plan.json", "plan again with this trainfit")
        return super().from_json(raw)

    def counts_its_run(self, steps: int) -> bool:
        """Whether a run of ``steps`` optimizer steps is this plan's whole run as a trainer counts
        it: the plan counts the epochs' samples together (``ceil(samples x epochs / effective
        batch)``), a trainer each epoch's last partial step apart, up to one step an epoch more."""
        return 0 <= steps - self.eta.steps <= math.ceil(self.epochs)

    def eta_for(self, steps: int) -> Eta:
        """The ETA of this plan's run cut to (or stretched to) ``steps`` optimizer steps, as
        ``train --max-steps`` runs it: what a run of that length is checked against. The plan's own
        ETA where ``steps`` is its run counted as a trainer counts it (a partial last step in each
        epoch: up to one step an epoch more than the plan's whole-run count)."""
        if self.counts_its_run(steps):
            return self.eta
        return self.eta.for_steps(steps, checkpoint_every_s=self.checkpoint_every_s, evaluation=self.evaluation,
                                  epochs=self.epochs)


def make_plan(folder: Path | RunFolder, *, max_hours: float, epochs: float | None = None, priority: str = "balanced",
              margin_minutes: float = 30.0, checkpoint_minutes: float = 30.0, calibration: Calibration | None = None,
              eval_data: str | Path | None = None, eval_every: int | None = None, eval_batch_size: int | None = None,
              device: str | None = None, trial: int | None = None, winner: Winner | None = None) -> Plan:
    """The plan of a run of ``epochs`` (default: the tune's ``tune.epochs``) over the tune folder
    ``folder``'s dataset in ``max_hours``, less ``margin_minutes``, with ``priority``'s config.
    ``eval_data``: an eval set (the training data's format and fields), evaluated every
    ``eval_every`` optimizer steps (None: at each epoch's end) in batches of ``eval_batch_size``
    (default: the config's batch size); one pass is timed forward-only on the config the priority
    picks without it, and the passes join every config's ETA. ``device``: plan the run on that
    device instead (by name: ``H100``), each config's speed scaled by the two devices' peak FLOP/s
    at its measured MFU (``estimated.scaled_to``): estimated, not measured. Neither a calibration
    nor an eval pass can be timed for it here. ``trial``: that measured config instead of the one
    ``priority`` picks (``plan --apply`` of a faster config). ``winner``: a compare config
    (``plan --from-compare``): the configs that learn as it does, trained with its values."""
    window = usable_window_s(max_hours, epochs, margin_minutes, checkpoint_minutes, priority)
    run, calibration = _inputs(folder, calibration, device, eval_data, winner)
    run_dir, summary = run.folder, run.summary
    epochs = _epochs(epochs, summary.epochs_for_estimate)
    samples = summary.dataset_samples
    assert samples  # _inputs refuses a tune without a dataset
    total = round(samples * epochs)
    _check_one_step(run.candidates, window, max_hours, margin_minutes)
    every, own = checkpoint_minutes * 60, _own_costs(summary, calibration)
    speed = write_speed(run_dir, max(checkpoint_bytes(c) for c in run.candidates))

    evaluation: Evaluation | None = None

    def eta(c: Candidate, n: int = total) -> Eta:
        return estimate(c, n, write_bytes_per_s=speed, checkpoint_every_s=every, calibration=calibration,
                        evaluation=evaluation, epochs=n / samples, per_micro_batch_s=own(c))

    rebuilt = rebuild(run)
    chosen = _pick(priority, run, eta, window, trial)
    if eval_data is not None:  # timed on the pick without it; again if the passes change the pick
        evaluation = _evaluation(run, rebuilt, chosen, Path(eval_data), eval_every, eval_batch_size)
        if (again := _pick(priority, run, eta, window, trial)) is not chosen:
            chosen = again
            evaluation = _evaluation(run, rebuilt, chosen, Path(eval_data), eval_every, eval_batch_size)
    run_eta = eta(chosen)
    save_steps = steps_between_saves(every, run_eta.step_time_s)
    fits = run_eta.fits(window)
    options = plan_options(run, rebuilt, chosen, samples, epochs, total, window, eta)
    estimated = like_estimated(chosen, device, run) if device is not None else None
    return carried(winner, summary, Plan(
                created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), run_dir=str(run_dir),
                max_hours=max_hours, margin_minutes=margin_minutes, window_s=window, epochs=epochs,
                dataset_samples=samples, priority=priority, rule=RULES[priority], trial=chosen.trial,
                searched=chosen.searched, config=chosen.config, samples_per_second=chosen.samples_per_second,
                peak_gb=chosen.peak_gb, save_steps=save_steps, eta=run_eta, fits=fits,
                command=planned_command(chosen_command(run, rebuilt, chosen), epochs, save_steps,
                                        template=bool(summary.command_template),
                                        evaluation=_trl_evaluation(run, rebuilt, evaluation)),
                checkpoint_every_s=every, checkpoint_bytes=checkpoint_bytes(chosen), write_bytes_per_s=speed,
                calibration=calibration.to_json() if calibration else None,
                rests_on=rests_on(run, chosen, calibration, evaluation, estimated)
                + (like_lines(chosen, estimated) if estimated else []),
                priorities=[_choice(p, choose(p, run.candidates, eta, window), eta, window) for p in PRIORITIES],
                options=options, step_cost=_coefficients(chosen), model_step_s=chosen.step_time_s,
                evaluation=evaluation, estimated=estimated))


def carried(winner: Winner | None, summary: Summary, plan: Plan) -> Plan:
    """``plan`` carrying ``winner`` on: recorded, said in what it rests on, and its training values
    as flags after the planned ``trl sft`` command's own (a later flag wins; warmup as steps of the
    run). A command template is left as written (its values are your command's own)."""
    if winner is None:
        return plan
    base = TrainValues.of(summary.spec.train)
    command = plan.command
    if command is not None and not summary.command_template and summary.spec.factory is None:
        flags = winner.values(base).trl_args(plan.eta.steps, against=base)
        command = " ".join([command, *(shlex.quote(w) for w in flags)])
    return dataclasses.replace(plan, from_compare=winner, command=command, rests_on=[*plan.rests_on, winner.line()])


def steps_between_saves(every_s: float, step_time_s: float) -> int:
    """Optimizer steps between checkpoints: the interval at the expected step time (at least 1)."""
    return max(1, int(every_s // step_time_s))


def _pick(priority: str, run: TuneRun, eta: EtaOf, window: float, trial: int | None) -> Candidate:
    """The config ``priority`` picks, or the measured one of ``trial`` where given."""
    return choose(priority, run.candidates, eta, window) if trial is None else of_trial(run.candidates, trial)


def _own_costs(summary: Summary, calibration: Calibration | None) -> Callable[[Candidate], float | None]:
    """Each config's trainer cost per micro-batch where the tune's calibration timed several configs
    (``TrainerCost.measured``) and the plan uses it: each timed one's own, the others' pooled; None:
    the calibration's cost per micro-batch, for every config."""
    cost = summary.trainer_cost
    if calibration is None or cost is None or len(cost.measured) < 2 or not is_the_tunes(calibration, summary):
        return lambda c: None
    return lambda c: cost.per_micro_batch_for(c.config)


def _inputs(folder: Path | RunFolder, calibration: Calibration | None, device: str | None,
            eval_data: str | Path | None, winner: Winner | None = None) -> tuple[TuneRun, Calibration | None]:
    """The tune folder's run (scaled to ``device`` where given; its configs those that learn as
    ``winner`` where given) and the calibration the plan uses: the one given, else the tune's own
    (none for another device: it timed this machine's trainer)."""
    if device is not None and (calibration is not None or eval_data is not None):
        raise TrainfitError(f"a calibration and an eval pass are timed on this machine, not on {device}",
                            "plan for another device without --calibrate and --eval-data (or tune on it)")
    run = load_run(folder)
    run = keep_learned(run, winner) if winner is not None else run
    calibration = calibration or ((learned(run) or _tunes_calibration(run.folder, run.summary)) if device is None
                                  else None)  # the run before's measured pace first: the real run's own
    _check_candidates(run)
    if not run.summary.dataset_samples:
        raise TrainfitError(f"the tune in {run.folder} had no dataset: there is no epoch to plan",
                            "give the spec a data.path and tune again")
    return (run if device is None else scaled_to(run, device)), calibration


def plan_from_throughput(spec: Spec, stats: LengthStats, folder: Path, *, max_hours: float,
                         tokens_per_second: float | None = None, samples_per_second: float | None = None,
                         epochs: float | None = None, priority: str = "balanced", margin_minutes: float = 30.0,
                         checkpoint_minutes: float = 30.0) -> Plan:
    """A plan before the hardware: a run of the spec's config over its data (``stats``, its length
    analysis) at the user's figure, ``tokens_per_second`` or ``samples_per_second``, taken as given
    (``estimated.from_throughput``), priced as a measured config is: its steps, the window less the
    margin, and what would fit when it does not. Nothing measured a checkpoint's size, a trainer's
    start-up or another config: none is in it. ``folder``: where it is written (its disk is timed)."""
    window = usable_window_s(max_hours, epochs, margin_minutes, checkpoint_minutes, priority)
    chosen, estimated = from_throughput(spec.params, stats, tokens_per_second=tokens_per_second,
                                        samples_per_second=samples_per_second)
    epochs = _epochs(epochs, spec.tune.epochs)
    samples = stats.samples
    total = round(samples * epochs)
    _check_one_step([chosen], window, max_hours, margin_minutes)
    every = checkpoint_minutes * 60
    speed = write_speed(folder, 0)  # a checkpoint of no measured size costs nothing at any speed

    def eta(c: Candidate, n: int = total) -> Eta:
        return estimate(c, n, write_bytes_per_s=speed, checkpoint_every_s=every, epochs=n / samples)

    run_eta = eta(chosen)
    fits = run_eta.fits(window)
    if not fits:
        options = ranked([fewer_epochs(chosen, samples, epochs, window, eta), subset(chosen, samples, epochs, window, eta)])
    else:  # no other config, no lengths measured: more epochs is what room to spare buys
        more = more_epochs(chosen, samples, epochs, window, eta) if has_room(run_eta, window) else None
        options = [more] if more is not None else []
    return Plan(created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), run_dir=spec.source or "",
                max_hours=max_hours, margin_minutes=margin_minutes, window_s=window, epochs=epochs,
                dataset_samples=samples, priority=priority, rule="the spec's config at your figure (the priorities "
                "choose among measured configs, and none was measured)", trial=None, searched={},
                config=chosen.config, samples_per_second=chosen.samples_per_second, peak_gb=0.0, command=None,
                save_steps=steps_between_saves(every, run_eta.step_time_s), eta=run_eta, fits=fits, checkpoint_every_s=every,
                checkpoint_bytes=0, write_bytes_per_s=speed, calibration=None,
                rests_on=throughput_lines(stats), priorities=[], options=options,
                model_step_s=chosen.step_time_s, estimated=estimated)


def _check_candidates(run: TuneRun) -> None:
    """Refuse a tune folder with no config to plan: none measured an epoch speed that fits, or every
    one that did has a damaged record (``tune --resume`` measures those configs again)."""
    if run.candidates:
        return
    journal = run.folder / "study.journal"
    if run.left_out:
        raise TrainfitError(f"no config in {journal} fits the budget with a record that reads back: "
                            f"{left_out(run.left_out)}",
                            f"`trainfit tune SPEC --output {run.folder} --resume` probes their configs again; "
                            "then plan again")
    raise TrainfitError(f"no config in {journal} fits the budget with an epoch speed measured",
                        "tune again into a new folder with this trainfit (an older one kept no epoch speed)")


def _epochs(given: float | None, spec_epochs: float) -> float:
    """The plan's epochs: ``given``, else the spec's ``tune.epochs``; refused past :data:`MAX_EPOCHS`."""
    epochs = float(given if given is not None else spec_epochs)
    if not epochs <= MAX_EPOCHS:
        raise TrainfitError(f"{epochs:g} epochs is past any run: a plan takes at most {MAX_EPOCHS:,} epochs",
                            "give --epochs N with fewer (the plan then says how many fit the window)")
    return epochs


def _tunes_calibration(run_dir: Path, summary: Summary) -> Calibration | None:
    """The calibration ``tune --calibrate`` measured, which a plan without ``--calibrate`` uses; one
    damaged in ``summary.json`` is refused, naming the key and the ways on."""
    if summary.trainer_cost is None:
        return None
    try:
        return Calibration.from_json(summary.trainer_cost.calibration)
    except (ValueError, TypeError) as err:
        raise TrainfitError(f"the calibration in {run_dir / 'summary.json'} (trainer_cost.calibration) is damaged: "
                            f"{err}", f"measure it again with `trainfit plan --calibrate N`, or rebuild summary.json "
                            f"from {run_dir / TRAINER_COST_FILE} with `trainfit tune YOUR_SPEC.yaml --output "
                            f"{shlex.quote(str(run_dir))} --resume`") from None


def _evaluation(run: TuneRun, rebuilt: Rebuilt | None, chosen: Candidate, path: Path, every: int | None,
                batch_size: int | None) -> Evaluation:
    """One eval pass of ``path`` timed on ``chosen``'s config (see :mod:`trainfit.plan.eval_pass`)."""
    if rebuilt is None or rebuilt.spec.data is None:
        raise TrainfitError(f"an eval pass is timed on the tune's model and data, and the spec of {run.folder} cannot "
                            "be rebuilt here (its model, tokenizer or data moved?)",
                            "plan where the tune ran, or plan without --eval-data")
    path = eval_set(path)  # absolute: plan.json is read from elsewhere (trainfit train's working folder)
    params, problems = parse_params(chosen.config, allow_custom=True)
    if problems:
        raise TrainfitError(f"the config of trial {chosen.trial} does not parse: {problems[0]}", "tune again")
    m = chosen.measurement
    stats = rebuilt.stats
    assert chosen.trial is not None  # a tune's config: a measured trial
    return measure_eval_pass(rebuilt.spec, params, path=path, every=every, batch_size=batch_size or params.batch_size,
                             max_length=stats.truncation_length(params.max_length) if stats else params.max_length,
                             trial=chosen.trial, threads=m.cpu_threads if m is not None else None)


def _trl_evaluation(run: TuneRun, rebuilt: Rebuilt | None, evaluation: Evaluation | None) -> tuple[Evaluation, Path] | None:
    """The evaluation and the dataset folder (train and test splits) its ``trl sft`` command reads."""
    if evaluation is None or rebuilt is None or run.summary.command_template or trl_data_config(rebuilt.spec) is None:
        return None
    return evaluation, trl_dataset(run.folder.resolve() / "trl_dataset", rebuilt.spec, Path(evaluation.path))


def _coefficients(c: Candidate) -> list[float] | None:
    cost = c.step_cost()
    return None if cost is None else [cost.a, cost.b, cost.c]


def usable_window_s(max_hours: float, epochs: float | None, margin: float, checkpoint: float, priority: str) -> float:
    """The time the run may take (s): the window less the margin; a clear error for an input out of range."""
    if priority not in PRIORITIES:
        raise TrainfitError(f"unknown priority {priority!r}", f"use one of: {', '.join(PRIORITIES)}")
    if not max_hours > 0:
        raise TrainfitError(f"--max-hours must be positive, got {max_hours:g}", "e.g. --max-hours 12")
    if epochs is not None and not epochs > 0:
        raise TrainfitError(f"--epochs must be positive, got {epochs:g}", "e.g. --epochs 3")
    if margin < 0 or margin >= max_hours * 60:
        raise TrainfitError(f"--margin-minutes {margin:g} leaves no time in a {max_hours:g} h window",
                            "use a margin shorter than the window (default 30 minutes)")
    if not checkpoint > 0:
        raise TrainfitError(f"--checkpoint-minutes must be positive, got {checkpoint:g}",
                            "e.g. --checkpoint-minutes 30")
    return max_hours * 3600 - margin * 60


def _check_one_step(candidates: list[Candidate], window_s: float, max_hours: float, margin_minutes: float) -> None:
    """A window shorter than one optimizer step of the fastest-stepping config measured fits no run,
    not even a part of one: say so, rather than list options of which none can fit."""
    shortest = min(c.step_time_s for c in candidates)
    if window_s < shortest:
        raise TrainfitError(f"--max-hours {max_hours:g} less the {margin_minutes:g} min margin leaves "
                            f"{window_s:.3g} s, shorter than one optimizer step of any measured config (the shortest: "
                            f"{shortest:.3g} s)", "give more --max-hours, or a shorter --margin-minutes")


def planned_command(command: str | None, epochs: float, save_steps: int, template: bool = False,
                    evaluation: tuple[Evaluation, Path] | None = None) -> str | None:
    """``command`` for the planned run: the ``trl sft`` command trainfit writes trains ``epochs``
    and saves a checkpoint every ``save_steps`` (keeping the last 3); with ``evaluation`` (the
    passes and a dataset folder holding the train and test splits) it reads that folder and
    evaluates on its schedule. A ``template`` (the spec's ``tune.command_template``) is left as written."""
    if command is None or template:
        return command
    command = re.sub(r"--num_train_epochs \S+", f"--num_train_epochs {epochs:g}", command)
    command = f"{command} --save_strategy steps --save_steps {save_steps} --save_total_limit 3"
    if evaluation is not None:
        passes, folder = evaluation
        command = shlex.join(with_eval_split(shlex.split(command), folder, passes.trl_args()))
    return command


def chosen_command(run: TuneRun, rebuilt: Rebuilt | None, chosen: Candidate) -> str | None:
    """The chosen config's command: the one tune wrote for it, else built as tune builds it (a
    config outside the summary's entries); None when neither can be had."""
    entry = run.summary.entry(chosen.trial) if chosen.trial is not None else None
    written = entry.command if entry is not None else None
    if written is not None or rebuilt is None or rebuilt.spec.search is None or chosen.measurement is None:
        return written

    spec = rebuilt.spec
    params = spec.search.params(chosen.searched)
    data_config = run.folder / "trl_data.yaml"
    model_dir = run.folder.resolve() / "model"
    try:
        return build_command(spec, params, **command_inputs(
            params, chosen.measurement, rebuilt.stats, data_config if data_config.is_file() else None,
            model_dir if (model_dir / "config.json").is_file() else None))
    except TrainfitError:
        return None


def _choice(priority: str, c: Candidate, eta: EtaOf, window: float) -> Choice:
    e = eta(c)
    assert c.trial is not None  # a tune's config: a measured trial
    return Choice(priority=priority, trial=c.trial, searched=c.searched, eta_s=e.total_s, fits=e.fits(window))
