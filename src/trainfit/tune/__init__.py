"""``tune``: the search (``trainfit.search``) with the outputs it leaves behind (``trainfit.tune.outputs``),
as one call: what ``trainfit tune`` runs and what a script imports."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trainfit.trainer.calibration_checks import check_can_calibrate
from trainfit.errors import SpecError, TrainfitError
from trainfit.tune.trainer_cost import calibrated
from trainfit.tune.outputs import write_outputs
from trainfit.run_folder import RunFolder
from trainfit.search.loop import TuneResult, run_search
from trainfit.search.tune_options import TuneOptions
from trainfit.data.analyze import analyze_spec
from trainfit.data.stats import LengthStats
from trainfit.devices import resolve_device_name
from trainfit.space import default_batch_sizes, default_space
from trainfit.spec import Spec
from trainfit.summary import Summary
from trainfit.template import placeholders


def with_default_search(spec: Spec, stats: LengthStats | None = None) -> Spec:
    """``spec`` itself when it has a ``search:`` section, else with the default one (see
    :func:`trainfit.space.default_space`) and its target effective batch. ``stats``: the data's
    length analysis, by which length grouping joins the search (see :func:`grouping_pays`)."""
    if spec.search is not None and spec.search.dims:
        return spec
    target = spec.search.target_effective_batch if spec.search else None
    space, problems = default_space(spec.params, target,
                                    constraints=[c.text for c in spec.search.constraints] if spec.search else (),
                                    allow_custom=spec.model.factory is not None, liger=takes_liger(spec),
                                    grouping=grouping_pays(spec, stats, target or spec.params.effective_batch_size))
    if problems:
        raise SpecError(problems, source=spec.source or "spec")
    return dataclasses.replace(spec, search=space,
                               tune=dataclasses.replace(spec.tune, target_effective_batch=space.target_effective_batch))


def takes_liger(spec: Spec) -> bool:
    """Does the spec's trainer take Liger's cross-entropy: a Hugging Face model trained by a
    ``tune.command_template`` that passes ``{use_liger_kernel}`` or ``{loss}``? Then the default
    search tries ``loss: liger`` beside the spec's loss. Read from the spec alone, so a study's space
    does not change with what is installed: where Liger-Kernel or CUDA is missing, the probe says so
    and the search skips the value."""
    template = spec.tune.command_template
    return (spec.model.factory is None and template is not None
            and bool(placeholders(template) & {"use_liger_kernel", "loss"}))


GROUPING_PADDING_SHARE = 0.25
"""The padding share of random batches past which the default search tries length-grouped ones too."""


def takes_grouping(spec: Spec) -> bool:
    """Does the spec's trainer take ``group_by_length``: the written ``trl sft`` command, or a
    ``tune.command_template`` that passes ``{group_by_length}``? (``trainfit train``'s own loop,
    which a custom model trains in without one, streams its rows in a shuffled order.)"""
    template = spec.tune.command_template
    return "group_by_length" in placeholders(template) if template else spec.uses_trl_sft


def grouping_pays(spec: Spec, stats: LengthStats | None, target_effective_batch: int) -> bool:
    """Is length grouping worth searching by default: a trainer that takes it, and data whose random
    batches at the default search's largest batch are more than :data:`GROUPING_PADDING_SHARE`
    padding (padded to their longest sample, cut at ``max_length``)? Read from the spec and its
    data alone, so a resumed study searches the same space."""
    if stats is None or spec.params.padding != "longest" or spec.params.packing or not takes_grouping(spec):
        return False
    largest = default_batch_sizes(target_effective_batch, spec.params.processes)[-1]
    return stats.padding_share(largest, spec.params.max_length) > GROUPING_PADDING_SHARE


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
    if options.stats is None and spec.data is not None and not (spec.search and spec.search.dims) \
            and takes_grouping(spec):  # whether grouping joins the default search depends on the data's lengths
        options = dataclasses.replace(options, stats=analyze_spec(spec, progress=False))
    spec = with_default_search(spec, options.stats)
    steps, options = _calibration_plan(spec, options)
    say = options.on_calibration
    # Calibrating: the search's outputs rank by the probes alone, so that the calibration runs the probes' pick.
    # An explicit --calibrate 0 (calibrate_steps 0, not the default's) ranks by the probes alone, leaving
    # trainer_cost.json for a later resume; without it, a stored cost keeps being applied.
    off = options.calibrate_steps == 0 and not options.calibration_optional
    stored = None if steps or off else RunFolder(options.output).trainer_cost
    last: dict[str, Any] = {}

    def outputs(output: Path, *args: Any, **kwargs: Any) -> Summary:
        last.update(args=(output, *args), kwargs=kwargs)  # the last write's trials and state, to write again
        return write_outputs(output, *args, **kwargs, trainer_cost=stored)

    def then(result: TuneResult) -> TuneResult:  # run while the search still holds the output folder
        if not steps or result.best is None:
            return result
        return calibrated(result, steps, options,
                          lambda cost: write_outputs(*last["args"], **last["kwargs"], trainer_cost=cost))

    return run_search(spec, options, outputs=outputs, then=then)


def _calibration_plan(spec: Spec, options: TuneOptions) -> tuple[int | None, TuneOptions]:
    """The real steps to calibrate with (None: none) and the options to search with: without
    ``calibrate_steps``, :func:`calibration_steps`' default (30 on a GPU where the command can run,
    optional: its failure leaves the probes' ranking), said in ``on_calibration`` where it is none; a
    spec whose command cannot be calibrated is refused here, before the search."""
    if options.calibrate_steps is None and options.probe_fn is None:  # real probes: as `trainfit tune` decides it
        steps, why = calibration_steps(spec, resolve_device_name(spec.probe.device), None)
        options = dataclasses.replace(options, calibration_optional=True)
        if why is not None and options.on_calibration is not None:
            options.on_calibration(f"note: {why}")
    else:  # asked for, or a stand-in for the probes (nothing real to calibrate against by default)
        steps = options.calibrate_steps or None
    if steps:
        check_can_calibrate(spec)
    return steps, options
