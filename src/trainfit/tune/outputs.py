"""What a tuning run leaves behind: summary.json (the records of ``trainfit.summary``), trials.csv,
report.html, the command script, advice when nothing fits.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from trainfit.data.stats import LengthStats
from trainfit.devices import versions
from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.probe.measurement import MEMORY_PARTS, Measurement, recorded_budget_gb
from trainfit.search.auto import AutoStrategy
from trainfit.search.loop import common_failure
from trainfit.search.pruned import pruned
from trainfit.search.ranking import (Repeats, TrainerS, pooled, probe_samples_per_second, ranked, with_trainer_cost,
                                     within_noise)
from trainfit.search.trials import Trial, config_key, jsonable
from trainfit.space import SearchSpace, learning_knobs, learning_value
from trainfit.spec import Spec
from trainfit.summary import (
    AllFailed,
    Budget,
    ConfigEntry,
    Confirmation,
    Lengths,
    LeverAside,
    MeasuredPeak,
    ProbeNote,
    PrunedFamily,
    RecordedSpec,
    SmallestPeak,
    Summary,
    Tie,
    TrainerCost,
    UnsupportedValue,
)
from trainfit.trainer.accelerate_launch import ACCELERATE_CONFIG_FILE, accelerate_config_yaml
from trainfit.trainer.axolotl import AXOLOTL_FILE, axolotl_fragment
from trainfit.trainer.command import (
    TRAINING_ARGS_FILE,
    build_command,
    command_inputs,
    command_script,
    initial_model,
    training_arguments,
    trl_data_config,
)
from trainfit.tune.html import tune_report_html


def run_samples(spec: Spec, stats: LengthStats | None) -> float | None:
    """Samples of the full run (the dataset x ``tune.epochs``), for its runtime estimate."""
    return None if stats is None else stats.samples * spec.tune.epochs


def _entry(t: Trial, spec: Spec, space: SearchSpace, stats: LengthStats | None,
           repeats: Repeats | None = None, data_config: Path | None = None,
           model_dir: Path | None = None, trainer_s: TrainerS = 0.0) -> ConfigEntry:
    """``trainer_s``: the trainer's own cost per micro-batch (``tune --calibrate``) its speeds include."""
    m = t.measurement
    params = space.params(t.values)
    samples = run_samples(spec, stats)
    sps = None if m.samples_per_second is None else with_trainer_cost(m.samples_per_second, m, "samples_per_second",
                                                                      trainer_s)
    runtime_h = m.run_seconds(samples, spec.tune.epochs, sps) / 3600 if samples and sps else None
    try:
        command = build_command(spec, params, **command_inputs(params, m, stats, data_config, model_dir))
    except TrainfitError:
        command = None
    return ConfigEntry(
        trial=t.number,
        samples_per_second=sps,
        tokens_per_second=None if m.tokens_per_second is None else with_trainer_cost(
            m.tokens_per_second, m, "tokens_per_second", trainer_s),
        speed_basis=m.speed_basis,
        padding_share=m.padding_share,
        memory_peak_gb=m.peak_memory_gb,
        memory_parts_gb={k: v / 1024**3 for k, v in m.memory_parts_bytes.items()},
        mfu=m.mfu,
        stable=m.stable,
        confirmed_median=(pooled(t, repeats, spec.tune.objective, trainer_s)
                          if repeats and config_key(t.values) in repeats else None),
        estimated_full_runtime_hours=runtime_h,
        searched=jsonable(t.values),
        effective_batch_size=params.effective_batch_size,
        config=params.to_dict(),
        command=command,
        probe_samples_per_second=probe_samples_per_second(t, repeats or {}),
        spread_rel=m.step_time_ci95_rel,
        samples_per_step=m.samples_per_step if params.packing else None,
    )


def unsupported_report(trials: Sequence[Trial]) -> list[UnsupportedValue]:
    """Each knob value a probe found this machine cannot run (the search skipped the rest of its configs)."""
    out: dict[str, UnsupportedValue] = {}
    for t in trials:
        for knob, value in t.measurement.unsupported.items():
            out.setdefault(json.dumps([knob, value], default=list),
                           UnsupportedValue(knob=knob, value=value, trial=t.number, message=t.measurement.message))
    return list(out.values())


def probe_notes(trials: Sequence[Trial]) -> list[ProbeNote]:
    """Each distinct note the probes made (a truncation, a loss, a dtype, frozen experts), with the
    trials that made it."""
    out: dict[str, list[int]] = {}
    for t in trials:
        for note in t.measurement.notes:
            out.setdefault(note, []).append(t.number)
    return [ProbeNote(note=note, trials=numbers) for note, numbers in out.items()]


UNCALIBRATED_GPU_NOTE = (
    "the ETA and the ranking time the model's step alone: the training command's trainer adds its own "
    "per-step work, which on a GPU can be as large as the step (a Hugging Face Trainer epoch on an H100 took "
    "2.1x this estimate, docs/benchmarks.md). Read the ETA as a lower bound; a `trl sft` command, and a "
    "tune.command_template with a {max_steps} placeholder, are calibrated by default on a GPU (tune --calibrate N)")


def uncalibrated_notes(spec: Spec, trials: Sequence[Trial], trainer_cost: TrainerCost | None) -> list[ProbeNote]:
    """A note where the speeds on a GPU leave out a trainer the probes do not run: a ``trl sft`` command
    or a ``tune.command_template`` without a calibration (``trainfit train``'s own loop, which a custom
    model trains in, runs the probe's very step)."""
    if trainer_cost is not None or not (spec.tune.command_template or spec.uses_trl_sft):
        return []
    on_gpu = [t.number for t in trials if t.measurement.status == "ok" and t.measurement.device.startswith("cuda")]
    return [ProbeNote(note=UNCALIBRATED_GPU_NOTE, trials=on_gpu)] if on_gpu else []


def smallest_peak(spec: Spec, trials: Sequence[Trial]) -> SmallestPeak | None:
    """The config that came closest to fitting, where its peak went, and the budget it needs."""
    measured = [t for t in trials if t.measurement.status in ("ok", "oom") and t.measurement.peak_memory_gb]
    if not measured:
        return None
    t = min(measured, key=lambda t: t.measurement.needed_bytes)
    m = t.measurement
    return SmallestPeak(searched=jsonable(t.values), status=m.status, peak_gb=m.peak_memory_gb or 0.0,
                        parts_gb={k: v / 1024**3 for k, v in m.memory_parts_bytes.items()},
                        oom_needs_more_than_gb=m.oom_needed_gb,
                        needs_memory_gb=m.needed_bytes / 1024**3 + spec.budget.headroom_gb, at_least=m.status == "oom",
                        full_logits_gb=m.full_logits_bytes / 1024**3 if m.full_logits_bytes else None)


def oom_advice(trials: Sequence[Trial], stats: LengthStats | None, smallest: SmallestPeak | None) -> list[str]:
    """Concrete knobs that would lower peak memory, from what was searched and measured: knobs
    not tried yet, the ones acting on the largest measured part of ``smallest`` (the
    :func:`smallest_peak`) first."""
    tried: dict[str, set[Any]] = {}
    for t in trials:
        for k, v in t.measurement.config.items():
            tried.setdefault(k, set()).add(json.dumps(v, default=list))

    def never(knob: str, value: Any) -> bool:
        return json.dumps(value) not in tried.get(knob, set())

    cuda = any(t.measurement.device.startswith("cuda") for t in trials)
    advice: list[tuple[str, str]] = []  # (the part of the peak it lowers, advice)
    if never("gradient_checkpointing", True):
        advice.append(("step", "gradient_checkpointing: true (recompute activations: far less activation memory, "
                               "~20-40% slower)"))
    if never("batch_size", 1):
        advice.append(("step", "batch_size: 1 with more gradient_accumulation_steps (same effective batch)"))
    if stats is not None:
        max_lengths = {t.measurement.config.get("max_length") for t in trials}
        rec = stats.recommended_max_length
        if all(ml is None or ml > rec for ml in max_lengths):
            advice.append(("step", f"max_length: {rec} ({stats.recommended_rule}; truncates "
                                   f"{stats.truncated_share:.2%} of samples) instead of the longest sample"))
    if cuda and never("precision", "bf16"):
        advice.append(("step", "precision: bf16 (half-size activations; with LoRA the frozen base is held in "
                               "bf16 too)"))
    if never("lora_r", 8) and all(t.measurement.config.get("lora_r") is None for t in trials):
        advice.append(("optimizer", "lora_r: 8-16 (train adapters only: no gradients or Adam state for the "
                                    "base weights)"))
    if cuda and never("optimizer", "adamw_8bit"):
        advice.append(("optimizer", "optimizer: adamw_8bit (Adam state at 2 instead of 8 bytes per trainable "
                                    "parameter)"))
    logits = smallest.full_logits_gb if smallest else None
    if smallest and logits and logits >= 0.1 * smallest.peak_gb:
        # first of the step's remedies: it costs one LM-head recompute, not a whole forward
        advice.insert(0, ("step", f"a loss without the full logits: the model's own loss holds the worst-case "
                               f"batch's (batch x length x vocab) logits in fp32, {logits:.2f} GiB, and their "
                               "gradient as much again; `trl sft` computes it with TRL's fused LM head in tiles "
                               "(what loss: auto probes for it); a transformers Trainer with use_liger_kernel, in "
                               "Liger-Kernel's fused linear cross-entropy (loss: liger, on CUDA)"))
    parts = smallest.parts_gb if smallest else {}
    if (smallest and parts.get("allocator_cache", 0.0) >= 0.1 * smallest.peak_gb
            and "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")):
        advice.append(("allocator_cache", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment "
                                          "(less fragmentation: reserved memory closer to what tensors use)"))
    if parts:
        advice.sort(key=lambda a: -parts.get(a[0], 0.0))  # stable: equal parts keep the order above
    return [text for _, text in advice]


def confirmation(order: Sequence[Trial], repeats: Repeats, objective: str, trainer_s: TrainerS = 0.0
                 ) -> list[Confirmation]:
    """Every measurement of each confirmed config, fastest median first (the speeds the trainer's
    cost per micro-batch ``trainer_s`` included)."""
    def speed(value: float | None, m: Measurement) -> float | None:
        return None if value is None else with_trainer_cost(value, m, objective, trainer_s)

    return [Confirmation(trial=t.number, searched=jsonable(t.values), median=pooled(t, repeats, objective, trainer_s),
                         measurements=[speed(t.objective, t.measurement),
                                       *(speed(getattr(m, objective), m) if m.fits else None
                                         for m in repeats[config_key(t.values)])])
            for t in order if config_key(t.values) in repeats]


def fastest_per_value(spec: Spec, space: SearchSpace, order: Sequence[Trial],
                      entry: Callable[[Trial], ConfigEntry]) -> dict[str, dict[str, ConfigEntry]]:
    """Per searched knob that changes what is learned (:func:`learning_knobs`): the fastest config of
    each of its values, keyed by the value as JSON."""
    per_value: dict[str, dict[str, ConfigEntry]] = {}
    for knob in learning_knobs(space):
        best_by_value: dict[str, ConfigEntry] = {}
        for t in order:
            key = json.dumps(learning_value(space, t.values, knob), default=list)
            if key not in best_by_value:
                best_by_value[key] = entry(t)
        per_value[knob] = best_by_value
    return per_value


def all_failed(spec: Spec, trials: Sequence[Trial], stats: LengthStats | None, output: Path) -> AllFailed:
    """Why nothing fits: every measured peak, the config closest to fitting, and advice: knobs that
    lower memory, or, where no probe measured memory (each failed with an error or timed out), the
    failure to fix first (:func:`common_failure`: no memory knob helps), naming its probe's files in
    ``output``, the run folder."""
    smallest = smallest_peak(spec, trials)
    failure = common_failure(trials)
    return AllFailed(
        measured_peaks_gb=[MeasuredPeak(searched=t.values, peak_gb=t.measurement.peak_memory_gb,
                                        status=t.measurement.status,
                                        oom_needs_more_than_gb=t.measurement.oom_needed_gb) for t in trials],
        smallest_peak=smallest,
        advice=[failure.advice(output)] if failure is not None else oom_advice(trials, stats, smallest))


def run_lengths(stats: LengthStats | None) -> Lengths | None:
    """The data's lengths the worst-case and typical batches were drawn from."""
    return None if stats is None else Lengths(
        description=stats.description, min=stats.min, median=stats.percentiles["p50"],
        p99=stats.percentiles["p99"], max=stats.max, model_positions=stats.max_positions)


def pruned_report(spec: Spec, space: SearchSpace, trials: Sequence[Trial], strategy: str) -> list[PrunedFamily]:
    """What the ``auto`` strategy left unprobed over ``trials``, and why (:func:`trainfit.search.pruned.pruned`)."""
    if strategy != "auto" or not trials:
        return []
    auto = AutoStrategy(space, spec.budget.memory_gb, spec.budget.headroom_gb, trials[0].measurement.device or "cpu")
    return [PrunedFamily(config=p.family, up_to_batch=p.below_batch, reason=p.reason) for p in pruned(auto, trials)]


def build_summary(spec: Spec, space: SearchSpace, trials: Sequence[Trial], *, output: Path,
                  stats: LengthStats | None, strategy: str, stop_reason: str, elapsed_s: float,
                  repeats: Repeats | None = None, data_config: Path | None = None, model_dir: Path | None = None,
                  trainer_cost: TrainerCost | None = None, aside: Sequence[LeverAside] = ()) -> Summary:
    """``output``: the run folder, absolute (the summary is read from anywhere), where the advice
    finds the probes' files; ``data_config``: the TRL config file that loads the data; ``model_dir``:
    the saved random-init model (see :func:`write_outputs`); ``trainer_cost``: what each micro-batch
    adds to the speeds and the ranking (``tune --calibrate``); ``aside``: levers measured on the pick
    (``trainfit.tune.aside``)."""
    repeats = repeats or {}
    objective = spec.tune.objective
    trainer_s: TrainerS = trainer_cost.per_micro_batch_for if trainer_cost else 0.0
    order = ranked(trials, repeats, objective, trainer_s)
    statuses = [t.measurement.status for t in trials]

    def entry(t: Trial) -> ConfigEntry:
        return _entry(t, spec, space, stats, repeats, data_config, model_dir, trainer_s)

    return Summary(
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        total_tested=len(trials),
        successful=sum(1 for t in trials if t.feasible),
        failed_oom=statuses.count("oom"),
        over_budget=sum(1 for t in trials if t.measurement.status == "ok" and not t.feasible),
        failed_error=statuses.count("error"),
        failed_timeout=statuses.count("timeout"),
        failed_diverged=statuses.count("diverged"),
        best_config=entry(order[0]) if order else None,
        runners_up=[entry(t) for t in order[1:6]],
        within_noise_of_best=[] if repeats else [Tie(**tie) for tie in within_noise(order, objective, trainer_s)],
        confirmation=confirmation(order, repeats, objective, trainer_s),
        fastest_per_value=fastest_per_value(spec, space, order, entry),
        unsupported=unsupported_report(trials),
        pruned=pruned_report(spec, space, trials, strategy),
        aside=list(aside),
        notes=probe_notes(trials) + uncalibrated_notes(spec, trials, trainer_cost),
        objective=objective,
        strategy=strategy,
        stop_reason=stop_reason,
        tuning_time_s=elapsed_s,
        probe_time_s=sum(t.measurement.wall_time_s or 0.0 for t in trials)
        + sum(m.wall_time_s or 0.0 for ms in repeats.values() for m in ms),  # confirmation probes included
        budget=Budget(memory_gb=spec.budget.memory_gb or recorded_budget_gb(t.measurement for t in trials),
                      headroom_gb=spec.budget.headroom_gb,
                      of="the spec" if spec.budget.memory_gb else "the device (no budget.memory_gb)"),
        epochs_for_estimate=spec.tune.epochs,
        dataset_samples=stats.samples if stats else None,
        lengths=run_lengths(stats),
        device=trials[0].measurement.device_name if trials else None,
        versions=versions(),
        spec=RecordedSpec.from_json(spec.to_dict()),
        all_failed=all_failed(spec, trials, stats, output) if trials and not order else None,
        trainer_cost=trainer_cost,
    )


def write_trials_csv(path: Path, space: SearchSpace, trials: Sequence[Trial], repeats: Repeats | None = None) -> None:
    """One row per probe: each trial's, then its confirmation repeats (``measurement`` 2, 3, ...).
    Written whole or not at all, as every output (a full disk's error names the file)."""
    columns = ["trial", "measurement", "status", *space.names, "samples_per_second", "tokens_per_second",
               "memory_peak_gb", *(f"memory_{p}_gb" for p in MEMORY_PARTS), "oom_needs_more_than_gb", "fits",
               "stable", "mfu", "probe_wall_s", "message"]
    text = io.StringIO(newline="")
    w = csv.writer(text)
    w.writerow(columns)
    for t in sorted(trials, key=lambda t: t.number):
        for i, m in enumerate([t.measurement, *(repeats or {}).get(config_key(t.values), ())], start=1):
            w.writerow([t.number, i, m.status, *(t.values.get(n) for n in space.names), m.samples_per_second,
                        m.tokens_per_second, m.peak_memory_gb,
                        *(m.memory_parts_bytes[p] / 1024**3 if p in m.memory_parts_bytes else None
                          for p in MEMORY_PARTS),
                        m.oom_needed_gb, m.fits, m.stable, m.mfu, m.wall_time_s,
                        m.headline[:200]])
    write_atomically(path, text.getvalue())


def write_outputs(output: Path, spec: Spec, space: SearchSpace, trials: Sequence[Trial], *,
                  stats: LengthStats | None, strategy: str, stop_reason: str, elapsed_s: float,
                  repeats: Repeats | None = None, trainer_cost: TrainerCost | None = None,
                  aside: Sequence[LeverAside] = (), earlier_s: float = 0.0) -> Summary:
    """Write summary.json, trials.csv, report.html and train_command.sh (atomically enough to run
    after every trial) and, for a ``trl sft`` command, trl_data.yaml: the TRL config that loads the
    spec's data file, and training_args.json: the best config for a Trainer of one's own; for a
    Hugging Face model, axolotl.yaml: the best config in Axolotl's keys; for a config of several
    processes, accelerate_config.yaml: its launch as a config file; and for a ``config:``
    model, once a config fits, model/: the random-init model and its tokenizer, for the command to
    train. ``trainer_cost``: the trainer's own cost the speeds and the ranking include (``tune
    --calibrate``; see ``RunFolder.trainer_cost``). ``earlier_s``: a resumed tune's earlier parts'
    tuning time (the summary's ``total_tuning_time_s`` adds them)."""
    data_config = None
    trl_data = trl_data_config(spec)
    if trl_data is not None:
        data_config = output.resolve() / "trl_data.yaml"
        write_atomically(data_config, yaml.safe_dump(trl_data, sort_keys=False))
    model_dir = initial_model(output, spec) if any(t.feasible for t in trials) else None
    summary = build_summary(spec, space, trials, output=output.resolve(), stats=stats, strategy=strategy,
                            stop_reason=stop_reason, elapsed_s=elapsed_s, repeats=repeats, data_config=data_config,
                            model_dir=model_dir, trainer_cost=trainer_cost, aside=aside)
    if earlier_s:  # a resumed tune: its parts together
        summary = dataclasses.replace(summary, total_tuning_time_s=earlier_s + elapsed_s)
    write_atomically(output / "summary.json", json.dumps(summary.to_json(), indent=2, default=list) + "\n")
    write_trials_csv(output / "trials.csv", space, trials, repeats)
    write_atomically(output / "report.html", tune_report_html(summary, trials, spec.source or "spec"))
    best = summary.best_config
    script = output / "train_command.sh"
    if best is not None:
        trial = next(t for t in trials if t.number == best.trial)
        m = trial.measurement
        trainer = (f" with the trainer's own cost (calibrated; the probe's: {best.probe_samples_per_second:.4g})"
                   if summary.trainer_cost is not None else "")
        header = (f"# trainfit: fastest measured config (trial {best.trial}): "
                  f"{best.samples_per_second:.4g} samples/s{trainer}, peak {m.peak_memory_gb:.2f} GiB on "
                  f"{m.device_name}\n"
                  f"# worst-case batch probed: {len(m.worst_case_lengths)} x {max(m.worst_case_lengths or [0])}; "
                  f"{spec.budget.describe()}")
        params = space.params(trial.values)
        inputs = command_inputs(params, m, stats, data_config, model_dir)
        write_atomically(script, command_script(spec, params, header, **inputs))
        exported = training_arguments(spec, params, max_length=inputs["max_length"], cpu_threads=inputs["cpu_threads"])
        if exported is not None:  # the same config for a Trainer of one's own
            write_atomically(output / TRAINING_ARGS_FILE, json.dumps(exported, indent=2) + "\n")
        fragment = axolotl_fragment(spec, params, max_length=inputs["max_length"], cpu_threads=inputs["cpu_threads"],
                                    model_dir=model_dir)
        if fragment is not None:  # the same config for Axolotl
            write_atomically(output / AXOLOTL_FILE, fragment.to_yaml(header))
        launch = accelerate_config_yaml(params, header, cpu=inputs["cpu_threads"] is not None)
        if launch is not None:  # the same processes for a script of one's own under accelerate launch
            write_atomically(output / ACCELERATE_CONFIG_FILE, launch)
        else:  # a best config of one process now: no earlier best's launch left behind
            (output / ACCELERATE_CONFIG_FILE).unlink(missing_ok=True)
        script.chmod(0o755)
    return summary
