"""``plan --apply N``: a plan with its option N applied (one that makes a run fit its window, or one
that a run with room to spare could buy), so that ``trainfit train`` runs exactly that: fewer or more
epochs, another ``max_length``, a subset's steps, or another measured config (planned anew for that
trial, by the caller's ``replan``)."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.format import format_duration as dur
from trainfit.plan import Plan, steps_between_saves
from trainfit.plan.options import Option
from trainfit.plan.spare import has_room
from trainfit.trainer.command import is_trl_command


def apply_option(plan: Plan, number: int, replan: Callable[[int], Plan]) -> Plan:
    """``plan`` with its option ``number`` (1 = the first listed) applied; ``replan(trial)`` plans a
    faster config's run as the plan's flags ask. A clear error where there is no such option, or it
    cannot be applied (a plan written before options said what they change; a command template,
    which trainfit runs as written)."""
    option = _option(plan, number)
    if "trial" in option.sets:
        applied = replan(int(option.sets["trial"]))
        applied = dataclasses.replace(applied, rule=f"option {number} of the plan before: {option.change}, in place "
                                                    f"of trial {plan.trial}, the one priority {plan.priority} picks")
    else:
        applied = dataclasses.replace(plan, **_changes(plan, option, number))
    return dataclasses.replace(applied, applied=option,
                               rests_on=[*applied.rests_on, f"option {number} applied: {option.change} ({option.cost})"])


def _option(plan: Plan, number: int) -> Option:
    if plan.fits and not plan.options:
        why = ("no option fits the time left (no other config, no longer max_length, not one more whole epoch)"
               if has_room(plan.eta, plan.window_s) else "with less than half of it to spare, so the plan lists no option")
        raise TrainfitError(f"--apply {number}: the run fits its window (ETA {dur(plan.eta.total_s)} of "
                            f"{dur(plan.window_s)}) {why}", "drop --apply")
    if not plan.options:
        raise TrainfitError(f"--apply {number}: nothing measured fits the window, so the plan lists no option",
                            "give a longer --max-hours, or tune a faster space")
    if not 1 <= number <= len(plan.options):
        listed = "; ".join(f"{i}. {o.change}" for i, o in enumerate(plan.options, 1))
        raise TrainfitError(f"--apply {number}: the plan lists {len(plan.options)} option(s): {listed}",
                            f"give --apply 1 to {len(plan.options)}")
    option = plan.options[number - 1]
    if option.kind == "longer_max_length":
        raise TrainfitError(f"--apply {number} ({option.change}): the peak memory of a longer worst case was not "
                            "measured, so trainfit cannot promise that it fits",
                            f"tune it first (trainfit tune SPEC --set max_length={option.sets['max_length']}), "
                            "then plan that folder")
    if not option.sets:
        raise TrainfitError(f"--apply {number}: this plan's options were written by an older trainfit, which did "
                            "not record what each changes", "plan again, then --apply")
    return option


def _changes(plan: Plan, option: Option, number: int) -> dict[str, Any]:
    """The fields of ``plan`` that ``option`` (one that keeps the chosen config) changes: its run's
    ETA, and what the trainer is told (the epochs, the config's ``max_length``, a cap on the steps)
    in the plan and in its ``trl sft`` command."""
    sets, e = option.sets, option.eta
    save_steps = steps_between_saves(plan.checkpoint_every_s, e.step_time_s)
    # each priority's pick was priced for the run that did not fit: not this one's
    changes: dict[str, Any] = {"eta": e, "fits": True, "options": [], "save_steps": save_steps, "priorities": []}
    flags = {"save_steps": save_steps}
    if "epochs" in sets:
        changes["epochs"] = float(sets["epochs"])
        flags["num_train_epochs"] = sets["epochs"]
    if "max_length" in sets:
        changes["config"] = {**plan.config, "max_length": sets["max_length"]}
        changes["model_step_s"] = e.step_time_s - (e.trainer_overhead_s or 0.0)  # the probe's step, its cost fitted
        before = plan.model_step_s or plan.eta.step_time_s - (plan.eta.trainer_overhead_s or 0.0)
        changes["samples_per_second"] = plan.samples_per_second * before / changes["model_step_s"]
        flags["max_length"] = sets["max_length"]
    if "max_steps" in sets:
        changes["max_steps"] = int(sets["max_steps"])
        flags["max_steps"] = sets["max_steps"]
    if plan.command is not None:
        if not is_trl_command(plan.command):
            raise TrainfitError(f"--apply {number} ({option.change}): the chosen config trains with your "
                                "tune.command_template, which trainfit runs as written and cannot change",
                                f"make the change in your command ({option.flags} in trl's words) or the spec, "
                                "tune and plan again")
        changes["command"] = with_flags(plan.command, flags)
    return changes


def with_flags(command: str, flags: dict[str, Any]) -> str:
    """``command`` with each ``--flag value`` of ``flags`` set: its value replaced where the command
    has the flag, else added at the end."""
    words = shlex.split(command)
    for name, value in flags.items():
        flag = f"--{name}"
        if flag in words and words.index(flag) + 1 < len(words):
            words[words.index(flag) + 1] = str(value)
        else:
            words += [flag, str(value)]
    return shlex.join(words)
