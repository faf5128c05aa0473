"""What ``trainfit plan`` leaves in the tune folder: ``plan.json``, ``plan.txt`` (the plan as a
reader checks it, :func:`render`) and the plan's section of ``report.html``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from trainfit.files import write_atomically
from trainfit.format import fmt_num, table, values_line
from trainfit.format import format_duration as dur
from trainfit.page_slots import with_plan
from trainfit.plan import Plan
from trainfit.plan.estimated import ESTIMATED
from trainfit.plan.html import plan_section
from trainfit.trainer.command import is_trl_command

PLAN_FILE = "plan.json"
TEXT_FILE = "plan.txt"


def write_plan(folder: Path, plan: Plan, *, epochs_given: bool = True) -> str:
    """Write ``plan`` into the tune folder ``folder`` (``plan.json``, ``plan.txt``, and its section of
    ``report.html`` where the tune wrote one); returns the text (see :func:`render`)."""
    text = render(plan, epochs_given=epochs_given)
    write_atomically(folder / PLAN_FILE, json.dumps(plan.to_json(), indent=2) + "\n")
    write_atomically(folder / TEXT_FILE, text + "\n")
    report = folder / "report.html"
    if report.is_file():  # the tune's page gains the plan
        write_atomically(report, with_plan(report.read_text(), plan_section(plan)))
    return text


def _schedule(every: int | None) -> str:
    return "at each epoch's end" if every is None else f"every {every:,} steps"


def trainer_cost_words(plan: Plan) -> str:
    """The table's trainer cost, from what the plan rests on: a calibration, the user's figure, or neither."""
    e = plan.eta
    if e.trainer_overhead_s is not None:
        return f"{fmt_num(e.trainer_overhead_s)} s a step, measured, included above"
    if plan.estimated is not None and plan.estimated.basis == "throughput":
        return "whatever your figure holds (see below)"
    return "not calibrated (see below)"


def render(plan: Plan, *, epochs_given: bool = True) -> str:
    """The plan as a reader checks it: the window, the pick and why, the ETA and what it is made
    of, what each priority would pick, and the options when it does not fit. ``epochs_given``:
    False where the epoch count is the spec's, which the plan then says."""
    e = plan.eta
    spare = plan.window_s - e.high_s
    verdict = (f"FITS, {dur(spare)} to spare at the interval's high end" if plan.fits
               else f"DOES NOT FIT: {dur(-spare)} over at the interval's high end")
    lines = [f"PLAN: {plan.epochs:g} epoch{'s' * (plan.epochs != 1)} of {plan.dataset_samples:,} samples in "
             f"{plan.max_hours:g} h, less a {plan.margin_minutes:g} min safety margin: {dur(plan.window_s)} to use",
             *([] if epochs_given else
               [f"  ({plan.epochs:g}: the spec's tune.epochs; --epochs N plans another count)"]),
             *([] if plan.estimated is None else
               [f"{ESTIMATED.upper()}: {plan.estimated.speed}", f"  its interval: {plan.estimated.interval}"]),
             "",
             f"priority {plan.priority}: {plan.rule}",
             f"config: {_config_words(plan)}",
             "",
             f"ETA {dur(e.total_s)} ({e.interval}){', ' + ESTIMATED if plan.estimated else ''}: {verdict}"]
    if e.command_total_s is not None:
        lines.append(f"  (run by `trainfit train`; the written command, with its own start-up: ETA {dur(e.command_total_s)})")
    rows = [("training", f"{e.steps:,} steps x {fmt_num(e.step_time_s)} s = {dur(e.train_s)} (+-{e.spread_rel:.1%})"),
            ("trainer cost", trainer_cost_words(plan)),
            ("start-up", "not calibrated" if e.startup_s is None
             else f"{dur(e.startup_s)} (launch to first step and last step to exit, measured)"
             + (f"; the written command: {dur(e.command_startup_s)}" if e.command_startup_s is not None else "")),
            ("checkpoints", "not priced: no probe measured the memory that gives a checkpoint's size"
             if plan.trial is None else f"{e.checkpoints} save{'s' * (e.checkpoints != 1)}, every "
             f"{dur(plan.checkpoint_every_s)}, {plan.checkpoint_bytes / 2**20:,.0f} MiB each = {dur(e.checkpoint_s)}"),
            ("evaluation", "none (--eval-data prices it)" if plan.evaluation is None else
             f"{e.evals} pass{'es' * (e.evals != 1)} ({_schedule(plan.evaluation.every)}) x "
             f"{fmt_num(plan.evaluation.pass_s)} s = {dur(e.eval_s)} (timed forward-only)")]
    lines += ["", table(rows), "", "what it rests on:", *(f"  - {line}" for line in plan.rests_on)]
    if plan.priorities:
        lines += ["", "each priority's pick:",
                  table([(c.priority, f"trial {c.trial}", values_line(c.searched), dur(c.eta_s),
                          "fits" if c.fits else "does not fit") for c in plan.priorities])]
    lines += _options_lines(plan)
    if plan.command:
        lines += ["", "train it:" if plan.fits else "its command (as planned, it does not fit the window):",
                  f"  {plan.command}"]

        if plan.estimated is not None:
            lines += [f"(`trainfit train` runs a measured plan: tune on {plan.estimated.device}, then plan that folder)"]
        elif is_trl_command(plan.command):
            lines += ["or, checkpointed, resumable and watched against this plan: "
                      f"trainfit train {shlex.quote(plan.run_dir)}"]
    elif plan.trial is None:
        lines += ["", (f"no command: nothing was measured; `trainfit tune {shlex.quote(plan.run_dir)}` on the device "
                       "measures the configs and writes one, and `trainfit plan RUN_DIR` then plans what it measured")]
    else:
        lines += ["", f"tune wrote no command for trial {plan.trial}: set its values ({values_line(plan.searched)}) in "
                      "the spec and tune or probe it for one"]
    return "\n".join(lines)


def _options_lines(plan: Plan) -> list[str]:
    """The plan's options, numbered as ``--apply`` takes them: what would fit a run that does not, or
    what a run with room to spare could buy."""
    if not plan.options:
        return [] if plan.fits else ["", "nothing measured fits the window: a longer window, or tune with a faster space"]
    return ["", "to fit the window (most kept first):" if not plan.fits else
            "room to spare (the run takes under half the window); each of these still fits:",
            *(f"  {i}. {o.change}: ETA {dur(o.eta.total_s)} (up to {dur(o.eta.high_s)}); {o.cost}; from {o.basis}"
              + (f"; in the command: {o.flags}" if o.flags and plan.command else "") for i, o in enumerate(plan.options, 1)),
            *([] if plan.applied is not None else
              ["  (plan again with the same flags and --apply N: the plan then holds option N)"])]


def _config_words(plan: Plan) -> str:
    """The chosen config and its speed, and where the speed comes from."""
    speed = fmt_num(plan.samples_per_second)
    if plan.trial is None:
        shown = {k: plan.config.get(k) for k in ("batch_size", "gradient_accumulation_steps", "max_length")}
        return f"the spec's: {values_line(shown)} ({speed} samples/s at your figure)"
    where = (f"by its probe, peak {plan.peak_gb:.2f} GiB" if plan.estimated is None else
             f"on {plan.estimated.device}, {ESTIMATED}; peak {plan.peak_gb:.2f} GiB as measured")
    return f"trial {plan.trial}: {values_line(plan.searched)} ({speed} samples/s {where})"
