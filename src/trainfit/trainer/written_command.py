"""The ``train_command.sh`` a tune wrote, read back checked: the ``trl sft`` command of the summary's
best config, with no placeholder left, that a calibration and ``trainfit train`` run; or the spec's
``tune.command_template`` filled for that config with a step count, that a calibration runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from trainfit.trainer.command import is_trl_command, script_command
from trainfit.errors import TrainfitError
from trainfit.params import parse_params
from trainfit.run_folder import COMMAND_FILE, RunFolder
from trainfit.summary import ConfigEntry, Summary
from trainfit.template import placeholders, render_template

FALLBACK_HINT = "plan without --calibrate: the estimate then rests on the probe alone"


_HEADER_TRIAL = re.compile(r"^# trainfit: fastest measured config \(trial (\d+)\)", re.MULTILINE)


def written_command(run_dir: Path | RunFolder, fallback: str = FALLBACK_HINT, *, use: str = "a calibration",
                    without_it: str | None = None) -> tuple[str, ConfigEntry, Summary]:
    """The text of the tune folder ``run_dir``'s train_command.sh, the best config it trains and the summary, once
    checked to be a ``trl sft`` command ``use`` (what runs it, for the errors) can run; ``fallback``:
    the errors' way out; ``without_it``: the way out where there is no such file (default: tune
    again, or ``fallback``), for a ``fallback`` that runs the file itself."""
    run = RunFolder.of(run_dir)
    summary, best = _best(run, use)
    if summary.command_template:
        raise TrainfitError(f"this run's training command is the spec's tune.command_template: {use} "
                            "runs only the `trl sft` command trainfit writes, for now", fallback)
    script_path, script = run.path / COMMAND_FILE, run.command_script
    if script is None:
        raise TrainfitError(f"{run.path} holds no {COMMAND_FILE} (tune writes it once a config fits)",
                            without_it or f"tune again into a new folder, or {fallback}")
    written_for = _HEADER_TRIAL.search(script)
    if written_for is not None and int(written_for.group(1)) != best.trial:
        raise TrainfitError(f"{script_path} is for trial {written_for.group(1)}, summary.json's best config is "
                            f"trial {best.trial}: is a tune still writing {run.path}?",
                            "wait for the tune to end")
    body, why_none = script_command(script)
    if body is None:
        raise TrainfitError(f"tune wrote no training command in {script_path}: {why_none}", fallback)
    if not is_trl_command(body):
        raise TrainfitError(f"{script_path} is not the `trl sft` command trainfit writes: {use} runs only "
                            "that command, for now", fallback)
    placeholder = re.search(r"'(<[^']*>)'", body)
    if placeholder is not None:
        raise TrainfitError(f"{script_path} still has a placeholder to fill: {placeholder.group(1)}",
                            "fill it in (the script's '# note:' lines say how), then try again")
    return script, best, summary


def _best(run: RunFolder, use: str) -> tuple[Summary, ConfigEntry]:
    summary = run.summary
    best = summary.best_config
    if best is None or best.samples_per_second is None:
        raise TrainfitError(f"no config fit the budget in {run.path}: there is no command for {use}",
                            "see its summary.json's all_failed advice, then tune again")
    return summary, best


NO_MAX_STEPS_HINT = "add `--max_steps {max_steps}` (your trainer's flag for it) to tune.command_template"
"""How a template becomes one a calibration can run: ``{max_steps}`` is null in ``train_command.sh``
(its flag dropped), a step count in a calibration's runs."""


def template_for_steps(run_dir: Path | RunFolder, steps: int, *,
                       use: str = "a calibration runs your tune.command_template for a few steps") -> tuple[
                           str, ConfigEntry, Summary]:
    """The spec's ``tune.command_template`` filled for the best config of the tune folder ``run_dir``
    as ``train_command.sh`` has it, with ``{max_steps}`` set to ``steps``; the config and the summary.
    Raises :class:`TrainfitError` where the template has no ``{max_steps}`` (a calibration could not
    stop it), or where filled without a step count it is not the command tune wrote for that config
    (a summary edited, or written by another version). ``use``: what needs it, for the error."""
    run = RunFolder.of(run_dir)
    summary, best = _best(run, "a calibration")
    template = summary.command_template
    assert template is not None, "a summary with a command template"
    if "max_steps" not in placeholders(template):
        raise TrainfitError(f"{use}, and it has no {{max_steps}} placeholder to stop it with",
                            f"{NO_MAX_STEPS_HINT}, then tune again with --resume: nothing is probed again")
    params, problems = parse_params(best.config, allow_custom=True)
    lengths, cut = summary.lengths, best.config.get("max_length")
    # The length the probe truncated at, as tune filled it in (``command.command_length``); None without data.
    max_length = None if lengths is None else min(cut or lengths.max, lengths.model_positions or cut or lengths.max)
    filled = [render_template(template, params, summary.epochs_for_estimate, max_length, max_steps=n)
              for n in (None, steps)]
    if problems or filled[0] != best.command:
        raise TrainfitError(f"{run.path / 'summary.json'}'s best config does not fill tune.command_template into the "
                            f"command tune wrote for it ({best.command!r})", "tune again into a new folder")
    return filled[1], best, summary


def as_one_line(script: str, args: list[str]) -> str:
    """The script's command on one line, its own arguments (``"$@"``) replaced by ``args``."""
    body, _ = script_command(script)
    return " ".join([body or "", *([shlex.join(args)] if args else [])])

