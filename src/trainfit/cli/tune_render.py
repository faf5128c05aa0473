"""What ``trainfit tune`` prints: a line per trial as the search runs, then the result."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from trainfit.format import OOM_NEED, fmt_need, fmt_num, format_duration, parts_line, spread, table, unit, values_line
from trainfit.probe.events import Phase
from trainfit.search.events import (
    ConfirmEnd,
    JournalRepaired,
    ProbeProgress,
    Resumed,
    SharedStudy,
    StorageBack,
    StorageLost,
    TrialEnd,
    TrialsLost,
    TrialStart,
    TuneEvent,
    Waiting,
)
from trainfit.search.loop import common_failure
from trainfit.tune.options import TuneResult
from trainfit.search.ranking import noise_warning
from trainfit.search.reconnect import outage_line
from trainfit.space import EFFECTIVE_BATCH
from trainfit.spec import Spec
from trainfit.summary import AllFailed, ConfigEntry, LeverAside, SmallestPeak, Summary, TrainerCost


class TuneView:
    """One line per finished trial, and a live line for the probe in flight on a terminal."""

    def __init__(self, quiet: bool, objective: str, run_samples: float | None = None, epochs: float = 1.0) -> None:
        self.quiet, self.objective = quiet, objective
        self.run_samples, self.epochs = run_samples, epochs
        """Samples of the full run (dataset x ``epochs``): each fitting config's line gives its run time."""
        self.tty = sys.stderr.isatty()

    def __call__(self, event: TuneEvent) -> None:
        if self.quiet:
            return
        if isinstance(event, SharedStudy):
            print(f"shared study {event.name} ({event.trials} trials so far): every machine of this "
                  "search prints this name; another name means another spec")
            for other in event.others:
                print(f"warning: the storage also holds {other['name']}, a study of the same spec file that "
                      f"differs in {', '.join(other['differs']) or 'nothing visible'}: machines given different "
                      "options search apart; give every machine the same spec and options", file=sys.stderr)
        elif isinstance(event, JournalRepaired):
            print(f"note: {event.journal} was damaged from line {event.line} of {event.lines} "
                  f"({event.reason}): dropped that tail, which held no complete entry; the file as it was is "
                  f"{event.backup}", file=sys.stderr)
        elif isinstance(event, TrialsLost):
            lost = "; ".join(f"trial {number} ({why})" for number, why in event.trials.items())
            print(f"warning: {event.storage} lacks the records of {len(event.trials)} trial(s) an earlier run "
                  f"measured: {lost}; their configs count as never measured, and are probed again",
                  file=sys.stderr)
        elif isinstance(event, Resumed):
            print(f"resuming: {event.trials} trials already measured"
                  + (f", {event.retried} interrupted trial(s) retried" if event.retried else ""))
        elif isinstance(event, Waiting):
            why = ("their results decide what to probe next" if event.searching
                   else "the summary waits for their results")
            print(f"waiting: {event.busy} config(s) in flight on other runs sharing the storage; {why}",
                  flush=True)
        elif isinstance(event, (StorageLost, StorageBack)):
            if self.tty:
                sys.stderr.write("\r\033[K")  # the live line of the probe in flight
            print(outage_line(event), file=sys.stderr, flush=True)
        elif isinstance(event, TrialStart) and self.tty:
            sys.stderr.write(f"\r\033[K{counter(event)} probing {values_line(event.values)} ...")
            sys.stderr.flush()
        elif isinstance(event, ProbeProgress) and self.tty and isinstance(event.event, Phase):
            sys.stderr.write(f" {event.event.phase}")
            sys.stderr.flush()
        elif isinstance(event, ConfirmEnd):
            m = event.measurement
            result = (f"{fmt_num(getattr(m, self.objective))} {unit(self.objective)}"
                      if m.status == "ok" else m.status.upper())
            print(f"[confirm {event.round}/{event.rounds}] {values_line(event.values)} -> {result}", flush=True)
        elif isinstance(event, TrialEnd):
            if self.tty:
                sys.stderr.write("\r\033[K")
            self.trial_line(event)

    def trial_line(self, event: TrialEnd) -> None:
        """``[3/20] batch_size=4 ... -> 120 samples/s, peak 0.70 GiB | probe 9s | best 129 | elapsed 30s``."""
        m, best = event.measurement, event.best
        if m.status == "ok":
            noise = (f" ±{m.step_time_ci95_rel:.0%} ({m.cut_short or 'not stable'})"
                     if not m.stable and m.step_time_ci95_rel else "")
            result = (f"{fmt_num(getattr(m, self.objective))} {unit(self.objective)}{noise}, "
                      f"peak {m.peak_memory_gb:.2f} GiB{'' if m.fits else ' (over budget)'}")
            if self.run_samples and m.fits and m.samples_per_second:
                result += f", full run ~{format_duration(m.run_seconds(self.run_samples, self.epochs))}"
        else:
            result = m.status.upper() + (f" ({m.headline[:120]})" if m.status in ("error", "diverged") else "")
            if m.oom_needed_gb:
                result += f" ({fmt_need(m.oom_needed_gb)})"
        remaining = event.max_trials - event.index
        eta = format_duration(remaining * event.mean_probe_s) if remaining > 0 else "0s"
        left = "" if event.refining else f", at most {eta} left"  # a local search has no set length
        best_text = f"best {fmt_num(best.objective)}" if best else "best: none yet"
        probe_text = f"probe {format_duration(m.wall_time_s)}{', model reused' if m.model_reused else ''}"
        print(f"{counter(event)} {values_line(event.values)} -> {result} | {probe_text} | {best_text} | "
              f"elapsed {format_duration(event.elapsed_s)}{left}", flush=True)


def counter(event: TrialStart | TrialEnd) -> str:
    """``[4/20] trial 3``: the count during the search (``[23, refine]`` for the neighbours probed
    after it, --refine) and the trial's number, as trials.csv, the summary and probes/ name it."""
    count = f"[{event.index}, refine]" if event.refining else f"[{event.index}/{event.max_trials}]"
    return f"{count} trial {event.number}:"


def print_result(result: TuneResult, spec: Spec) -> int:
    """The search's outcome, then the best config (exit status 0) or why nothing fits (1)."""
    s = result.summary
    print(f"\nstopped: {result.stop_reason}")
    print(f"tested {s.total_tested}: {s.successful} fit, {s.failed_oom} OOM, {s.over_budget} over budget, "
          f"{s.failed_error} errors, {s.failed_timeout} timeouts"
          f"{f', {s.failed_diverged} diverged' if s.failed_diverged else ''}; probe time {s.probe_time_s:.0f} s")
    if (noisy := noise_warning(result.trials)) is not None:
        print(noisy)
    for n in s.notes:
        which = "every probe" if len(n.trials) == s.total_tested else f"{len(n.trials)} of the probes"
        print(f"note ({which}): {n.note}")
    for u in s.unsupported:
        reason = "; ".join(line.strip() for line in (u.message or "").splitlines() if line.strip())
        print(f"skipped every config with {u.knob}={u.value}: cannot run on this machine ({reason})")
    for p in s.pruned:
        where = "every batch" if p.up_to_batch is None else f"batches up to {p.up_to_batch}"
        print(f"not probed: {values_line(p.config)} at {where}: {p.reason}")
    if s.best_config is None and s.total_tested == 0:
        print(f"\nNo configuration was probed ({result.stop_reason}).")
        return 1
    if s.best_config is None and (failure := common_failure(result.trials)) is not None:
        print(f"\nNo configuration fits: {failure.advice(result.output)}")  # no memory knob: what summary.json says
        return 1
    if s.best_config is None:
        print_nothing_fits(spec, s.all_failed)
        return 1
    print_best(result, s, s.best_config)
    return 0


def print_nothing_fits(spec: Spec, failed: AllFailed | None) -> None:
    """The measured peaks, the config closest to fitting and where its memory went, and advice."""
    print(f"\nNo configuration fits: {spec.budget.describe()}.")
    if failed is None:
        return
    print(table([("over budget" if p.status == "ok" else p.status,
                  (f"peak {p.peak_gb:.2f} GiB" if p.peak_gb is not None else "peak n/a")
                  + (f", {fmt_need(p.oom_needs_more_than_gb)}" if p.oom_needs_more_than_gb else ""),
                  values_line(p.searched)) for p in failed.measured_peaks_gb]))
    if failed.smallest_peak:
        print_closest(failed.smallest_peak)
    if failed.advice:
        print("\nTo lower peak memory (knobs to add to the search space; the largest part first):")
        for line in failed.advice:
            print(f"  - {line}")


def print_closest(smallest: SmallestPeak) -> None:
    """The config closest to fitting: its peak, where it went, and the budget it would fit."""
    print(f"\nclosest to fitting: {values_line(smallest.searched)}, peak "
          f"{'at least ' if smallest.at_least else ''}{smallest.peak_gb:.2f} GiB"
          + (f" ({fmt_need(smallest.oom_needs_more_than_gb)}: {OOM_NEED})"
             if smallest.oom_needs_more_than_gb else ""))
    parts = smallest.parts_gb
    if parts:
        print("  of which " + parts_line(parts, unit=1024**3))
        if max(parts, key=lambda k: parts[k]) == "runtime":
            print("  the largest part is the process itself (interpreter, libraries), the same for "
                  "every config: no knob lowers that part")
    beyond = (smallest.oom_needs_more_than_gb or 0.0) - smallest.peak_gb
    if beyond >= 0.01:
        print(f"  and at least {beyond:.2f} GiB more than that peak when it failed (what the step was "
              "allocating then: the knobs below lower it)")
    print(f"  it would fit with --memory-gb {'above ' if smallest.at_least else ''}"
          f"{smallest.needs_memory_gb:.2f} (or less budget.headroom_gb)")


def print_best(result: TuneResult, s: Summary, best: ConfigEntry) -> None:
    """The best config, its confirmation, the configs as fast within noise, the fastest per value."""
    objective_unit = unit(s.objective)
    rows = [("config", values_line(best.searched)),
            ("samples/s", fmt_num(best.samples_per_second)
             + (f"{spread(best.spread_rel)} (the probe's 95% interval)" if spread(best.spread_rel) else "")
             + (f" (confirmation median: {fmt_num(best.confirmed_median)} {objective_unit})"
                if best.confirmed_median is not None else "")),
            ("tokens/s", f"{fmt_num(best.tokens_per_second)} (real tokens)"),
            *([("batches", f"{best.speed_basis}" + (f"; {best.padding_share:.0%} of positions are padding"
                                                     if best.padding_share is not None else ""))]
              if best.speed_basis else []),
            ("peak memory", f"{best.memory_peak_gb:.2f} GiB"
             + (f" ({parts_line(best.memory_parts_gb, unit=1024**3)})" if best.memory_parts_gb else "")),
            ("effective batch", str(best.effective_batch_size)
             + (" (it differs between configs and changes what is learned: set tune.target_effective_batch to keep "
                "one)" if EFFECTIVE_BATCH in s.fastest_per_value else ""))]
    if s.trainer_cost is not None:
        rows.insert(2, ("trainer cost", trainer_cost_line(s.trainer_cost, best)))
    if best.estimated_full_runtime_hours is not None:
        rows.append(("full run", f"~{format_duration(best.estimated_full_runtime_hours * 3600)} for "
                                 f"{s.epochs_for_estimate:g} epoch(s) of {s.dataset_samples:,} samples"))
    print("\nBEST CONFIGURATION (peak memory on the worst-case batch; speed expected over the epoch's own batches)")
    print(table(rows))
    if s.confirmation:
        print("\nconfirmed (every measurement of each config; ranked by the median):")
        print(table([(f"trial {e.trial}", f"median {fmt_num(e.median)}",
                      ", ".join(fmt_num(x) if x is not None else "failed" for x in e.measurements),
                      values_line(e.searched)) for e in s.confirmation]))
    if s.within_noise_of_best:
        print(f"\nas fast within measurement noise ({len(s.within_noise_of_best)}): the gap to the best is no "
              "larger than the two probes' 95% CIs; --confirm N re-probes them, or raise probe.max_seconds for "
              "tighter probes")
        print(table([(f"trial {e.trial}", f"{fmt_num(e.samples_per_second)} samples/s",
                      f"{e.gap:.1%} slower (noise allows {e.noise:.1%})",
                      values_line(e.searched)) for e in s.within_noise_of_best]))
    for knob, by_value in s.fastest_per_value.items():
        if len(by_value) > 1:
            print_fastest_per_value(knob, by_value.values(), objective_unit)
    for lever in s.aside:
        print_aside(lever)
    written = [name for name in TUNE_FILES if (result.output / name).exists()]
    print(f"\nwrote {result.output}/: {', '.join(written)} (docs/outputs.md says what each holds)")


def print_aside(lever: LeverAside) -> None:
    """A lever measured on the pick and left to the user: what it would buy, why it is not taken, how to take it."""
    if lever.speedup is not None:
        bought = (f"{fmt_num(lever.samples_per_second)} samples/s, {lever.speedup:.2f}x the pick's probe, peak "
                  f"{lever.peak_gb:.2f} GiB{'' if lever.fits else ' (over budget)'}")
    else:
        bought = f"{lever.status.upper()} on the pick's config"
    print(f"\nnot taken: {lever.knob}={str(lever.value).lower()} measured on the pick: {bought}. Not taken by "
          f"default: {lever.why}. To take it: {lever.how}")


TUNE_FILES = ("summary.json", "trials.csv", "report.html", "train_command.sh", "training_args.json", "axolotl.yaml",
              "accelerate_config.yaml", "trl_data.yaml", "model/")
"""What a tune folder may hold for the user, in the order the end of the run names them (what is there)."""


def trainer_cost_line(cost: TrainerCost, best: ConfigEntry) -> str:
    """What ``tune --calibrate`` measured and what it changed."""
    steps = cost.calibration.get("steps")
    trainer = "`trl sft`" if cost.calibration.get("train_startup_s") is not None else "training-command"
    if len(cost.measured) > 1:
        return (f"the trainer's own cost beyond the model's step, {cost.words()}, measured by {steps} real {trainer} "
                f"steps each (the probe alone: {fmt_num(best.probe_samples_per_second)} samples/s)")
    return (f"{cost.per_micro_batch_s * 1000:.3g} ms a micro-batch beyond the model's step, measured by {steps} real "
            f"{trainer} steps of trial {cost.trial} (the probes' pick then), added to every config's micro-batches "
            f"(the probe alone: {fmt_num(best.probe_samples_per_second)} samples/s)")


def print_fastest_per_value(knob: str, entries: Iterable[ConfigEntry], objective_unit: str) -> None:
    """The fastest config of each value of a knob that changes what is learned."""
    print(f"\nfastest per {knob} (changes what is learned):")
    print(table([(f"{knob}={e.searched.get(knob, getattr(e, knob, None))}",
                  f"{fmt_num(e.samples_per_second)} samples/s"
                  + (f" (confirmation median {fmt_num(e.confirmed_median)} {objective_unit})"
                     if e.confirmed_median is not None else ""),
                  f"{e.memory_peak_gb:.2f} GiB",
                  values_line(e.searched))
                 for e in entries]))
