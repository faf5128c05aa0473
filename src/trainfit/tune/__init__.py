"""``tune``: the search (``trainfit.search``) with the outputs it leaves behind (``trainfit.tune.outputs``),
as one call: what ``trainfit tune`` runs and what a script imports.

It reads top to bottom (:func:`run_tune`): each default decided once (:func:`resolve`), the trial
loop with the outputs written after each trial, the calibration, the final write."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from trainfit.trainer.calibration_checks import check_can_calibrate
from trainfit.errors import SpecError, TrainfitError
from trainfit.tune.trainer_cost import calibrated
from trainfit.tune.options import TuneOptions, TuneResult, best_trial
from trainfit.tune.aside import packing_aside
from trainfit.tune.levers import PADDING_SHARE, takes_liger, trainer_takes
from trainfit.tune.outputs import write_outputs
from trainfit.run_folder import SUMMARY_FILE, RunFolder
from trainfit.search.loop import Search, SearchState, open_search
from trainfit.data.analyze import analyze_spec
from trainfit.data.stats import LengthStats
from trainfit.devices import resolve_device_name
from trainfit.space import default_batch_choices, default_space
from trainfit.spec import Spec
from trainfit.summary import LeverAside, Summary, TrainerCost


def with_default_search(spec: Spec, stats: LengthStats | None = None) -> Spec:
    """``spec`` itself when it has a ``search:`` section, else with the default one (see
    :func:`trainfit.space.default_space`) and its target effective batch: none where the spec leaves
    the batch open (``Spec.batch_open``). ``stats``: the data's length analysis, by which length
    grouping joins the search (see :func:`grouping_pays`)."""
    if spec.search is not None and spec.search.dims:
        return spec
    open_batch = spec.batch_open
    target = spec.search.target_effective_batch if spec.search else None
    largest = default_batch_choices(spec.params, target, open_batch)[-1]
    space, problems = default_space(spec.params, target,
                                    constraints=[c.text for c in spec.search.constraints] if spec.search else (),
                                    allow_custom=spec.model.factory is not None, liger=takes_liger(spec),
                                    grouping=grouping_pays(spec, stats, largest), open_batch=open_batch)
    if problems:
        raise SpecError(problems, source=spec.source or "spec")
    return dataclasses.replace(spec, search=space,
                               tune=dataclasses.replace(spec.tune, target_effective_batch=space.target_effective_batch))


def grouping_pays(spec: Spec, stats: LengthStats | None, largest: int) -> bool:
    """Is length grouping worth searching by default: a trainer that takes it, and data whose random
    batches at the default search's ``largest`` batch are more than :data:`~trainfit.tune.levers.PADDING_SHARE`
    padding (padded to their longest sample, cut at ``max_length``)? Read from the spec and its
    data alone, so a resumed study searches the same space."""
    if stats is None or spec.params.padding != "longest" or spec.params.packing or not trainer_takes(spec, "group_by_length"):
        return False
    return stats.padding_share(largest, spec.params.max_length) > PADDING_SHARE


GPU_CALIBRATION_STEPS = 30
"""Real steps ``tune`` times by default on a GPU, where the trainer's own work around each step is
as large as the step (1.4-2.1x the probe's step in the H100 and H200 runs of docs/benchmarks.md)
and moves the best batch up; on a CPU it is small beside the step, and a calibration is asked for."""


def calibration_steps(spec: Spec, device: str, asked: int | None) -> tuple[int | None, str | None]:
    """How many real steps of the written command ``tune`` times after the search, and a note on why
    (None: none). ``asked``: ``--calibrate N`` (0: none); without it, on a CUDA ``device``,
    :data:`GPU_CALIBRATION_STEPS` where a calibration can run (the written ``trl sft`` command; a
    note says why not where it cannot)."""
    if asked is not None:
        return asked or None, None  # asked for: a failure is an error
    if not device.startswith("cuda"):
        return None, None
    try:
        check_can_calibrate(spec)
    except TrainfitError as err:
        return None, f"not calibrated on this GPU (the ranking rests on the probes alone): {err.message}"
    return GPU_CALIBRATION_STEPS, (f"on a GPU the trainer's own cost is timed by default: {GPU_CALIBRATION_STEPS} "
                                   "real steps after the search (--calibrate 0: none)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TunePlan:
    """A tune with every default decided (:func:`resolve`), for :func:`run_tune`."""

    spec: Spec
    """The spec with the space it searches: its own ``search:`` section, or the default one."""
    options: TuneOptions
    """The options, with the data's lengths where the default search depends on them."""
    calibrate_steps: int | None
    """Real steps of the written command timed after the search (None: no calibration)."""
    default_search: bool
    """The spec had no ``search:`` section: :func:`with_default_search` chose the space."""
    earlier_tuning_s: float = 0.0
    """What the folder's earlier parts tuned for (a resumed tune's): its total counts them too."""


def resolve(spec: Spec, options: TuneOptions) -> TunePlan:
    """Each default ``tune`` decides, decided once: the search space (the spec's, else
    :func:`with_default_search`'s, which reads the data's lengths), and the calibration
    (:func:`calibration_steps`: without ``options.calibrate_steps``, 30 real steps on a GPU where the
    written command can run, and then optional; a note in ``options.on_calibration`` where it is none).
    A spec whose command cannot be calibrated while a calibration is asked for is refused here,
    before anything is probed."""
    if options.stats is None and spec.data is not None and not (spec.search and spec.search.dims) \
            and trainer_takes(spec, "group_by_length"):  # whether grouping joins the default search depends on the data's lengths
        options = dataclasses.replace(options, stats=analyze_spec(spec, progress=False))
    searched = with_default_search(spec, options.stats)
    if options.calibrate_steps is None and options.probe_fn is None:  # real probes: the device decides
        steps, why = calibration_steps(searched, resolve_device_name(searched.probe.device), None)
        options = dataclasses.replace(options, calibration_optional=True)
        if why is not None and options.on_calibration is not None:
            options.on_calibration(f"note: {why}")
    else:  # asked for, or a stand-in for the probes (nothing real to calibrate against by default)
        steps = options.calibrate_steps or None
    if steps:
        check_can_calibrate(searched)
    return TunePlan(spec=searched, options=options, calibrate_steps=steps, default_search=searched is not spec)


def tune(spec: Spec, options: TuneOptions) -> TuneResult:
    """Search ``spec.search`` (without one: batch sizes and gradient checkpointing, and what else the
    trainer and the data make worth it, see :func:`with_default_search`) for the fastest
    configuration that fits ``spec.budget``, within the limits of ``spec.tune`` (set them with
    :func:`trainfit.spec.with_tune`), and write summary.json, trials.csv, report.html and
    train_command.sh to ``options.output`` (see :class:`TuneOptions` for the rest).

    ``options.calibrate_steps``: then time that many real steps of the written command (None, the
    default: :func:`calibration_steps`' choice, 30 on a GPU where the command can run, none with a
    stand-in ``probe_fn``; 0: none; see
    :func:`trainfit.trainer.calibration.calibrate`), add the trainer's own cost per micro-batch it
    measured to every config's steps, rank again and write the outputs for the new pick (the cost is
    kept in ``trainer_cost.json``, so a later ``resume`` ranks with it too). A spec whose command a
    calibration cannot run is refused before the search. ``options.calibration_optional``: a
    calibration nobody asked for (:func:`calibration_steps`' default on a GPU) that fails leaves the
    search's result, ranked by the probes, and says why in ``options.on_calibration``, instead of
    failing a search that succeeded.

    Example::

        import trainfit
        spec = trainfit.load_spec("examples/tiny-llama.yaml")
        result = trainfit.tune.tune(spec, trainfit.TuneOptions(output="runs/a", quick=True))
        print(result.summary.best_config)
    """
    return run_tune(resolve(spec, options))


def run_tune(plan: TunePlan) -> TuneResult:
    """:func:`tune` of a resolved plan: the trial loop, the outputs written after each trial, the
    calibration, the final write. Everything runs while the study holds the output folder."""
    options = plan.options
    output = Path(options.output)
    # Calibrating: the search's outputs rank by the probes alone, so that the calibration runs the probes' pick.
    # An explicit --calibrate 0 (calibrate_steps 0, not the default's) ranks by the probes alone, leaving
    # trainer_cost.json for a later resume; without it, a stored cost keeps being applied.
    off = options.calibrate_steps == 0 and not options.calibration_optional
    stored = None if plan.calibrate_steps or off else RunFolder(output).trainer_cost
    plan = dataclasses.replace(plan, earlier_tuning_s=_earlier_tuning(output))
    with open_search(plan.spec, options) as search:
        with contextlib.closing(search.measured()) as measured:
            for state in measured:
                write_state(plan, search, state, stored)
        final = search.outcome()
        summary = write_state(plan, search, final, stored)
        result = TuneResult(trials=final.trials, best=best_trial(final.trials, summary), summary=summary,
                            output=output, stop_reason=final.stop_reason, new_trials=final.new_trials)
        if plan.calibrate_steps and result.best is not None:
            result = calibrated(result, plan.calibrate_steps, options,
                                lambda cost: write_state(plan, search, final, cost))
        if plan.default_search and not options.quick and result.best is not None:
            aside = packing_aside(plan.spec, result.best, search.probe_aside)  # on the final pick, written first
            if aside:
                result = dataclasses.replace(result, summary=write_state(plan, search, final,
                                                                         result.summary.trainer_cost, aside))
    return result


def _earlier_tuning(output: Path) -> float:
    """The tuning time a resumed folder's summary holds (its parts so far); 0 for a new one, or a
    summary that cannot be read (it is written again)."""
    try:
        s = RunFolder(output).summary if (output / SUMMARY_FILE).is_file() else None
    except TrainfitError:
        return 0.0
    return 0.0 if s is None else s.total_tuning_time_s if s.total_tuning_time_s is not None else s.tuning_time_s


def write_state(plan: TunePlan, search: Search, state: SearchState, trainer_cost: TrainerCost | None,
                aside: Sequence[LeverAside] = ()) -> Summary:
    """The run's outputs (:func:`write_outputs`) from the search's ``state``, ranked with ``trainer_cost``,
    with the levers measured aside (:mod:`trainfit.tune.aside`)."""
    return write_outputs(Path(plan.options.output), plan.spec, search.space, state.trials, stats=search.stats,
                         strategy=search.limits.strategy, stop_reason=state.stop_reason,
                         elapsed_s=state.elapsed_s, repeats=state.repeats, trainer_cost=trainer_cost, aside=aside,
                         earlier_s=plan.earlier_tuning_s)
