"""``trainfit train``: the training that was measured, run to its end, checkpointed and resumable.

From a tune output folder it trains the config the folder's ``plan.json`` chose (``trainfit
plan``), else the fastest one: a Hugging Face model with the written ``trl sft`` arguments run by
TRL's own trainer in this process (:mod:`trainfit.train.sft`), a factory model in trainfit's loop
on the probe's ``TrainStep`` (:mod:`trainfit.train.loop`). It adds a checkpoint every
``checkpoint_every_s`` and at the end (only complete ones count: :mod:`trainfit.train.checkpoints`),
a clean stop with a checkpoint on SIGTERM or before a deadline, the on-track check against the plan
(:class:`trainfit.OnTrackCallback`) and a JSON-lines log. ``resume=True`` continues from the last
complete checkpoint with the optimizer, scheduler, RNG states and data position it saved,
after checking that nothing that changes the training differs.

Output folder: ``train.json`` (what is trained, written once), ``checkpoint-STEP/`` (the newest
``keep``), ``train_log.jsonl``, the final model, ``train_result.json`` (and the plan folder's
``actual.json``: the actual time against the plan's ETA).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainfit.devices import torch_threads
from trainfit.errors import Terminated, TrainfitError
from trainfit.files import held_folder, write_atomically
from trainfit.plan import Plan
from trainfit.plan.eval_pass import Evaluation
from trainfit.summary import Record, Summary, check_schema
from trainfit.train.checkpoints import incomplete, latest_complete, step_of, unloadable
from trainfit.train.data_check import identity, refuse_changed, trained_files
from trainfit.train.records import Damaged, load_record

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class TrainRun(Record):
    """``train.json``: what an output folder trains; written at the first start, checked on resume."""

    schema_version: int = SCHEMA_VERSION
    run_dir: str
    """The tune output folder it came from."""
    source: str
    """``plan.json`` (the plan's chosen config and epochs), else ``train_command.sh`` (a Hugging
    Face model: the fastest config's command) or ``summary.json`` (a factory model: the fastest config)."""
    trial: int
    kind: str
    """``trl_sft`` (the written command, by TRL's trainer), ``factory`` (trainfit's loop on the
    probe's ``TrainStep``) or ``command`` (the spec's ``tune.command_template``, as a child process)."""
    threads: int | None
    """CPU threads the probe used (``OMP_NUM_THREADS`` of the command); None: the library default."""
    argv: list[str] = field(default_factory=list)
    """``trl_sft``: the ``trl sft`` arguments trained, the user's extra ones and trainfit's own last;
    ``command``: the one command line run."""
    config: dict[str, Any] = field(default_factory=dict)
    """``factory``: every knob of the config trained."""
    epochs: float | None = None
    """``factory``: passes over the data (the plan's, else the spec's ``tune.epochs``)."""
    max_steps: int | None = None
    """A cap on the optimizer steps (``--max-steps``); None: the epochs decide."""
    evaluation: Evaluation | None = None
    """``factory``: the plan's eval set and schedule (a ``trl_sft`` run has them in its arguments)."""
    started_at: float
    """Epoch seconds of the first start: a deadline and the actual time count from it."""
    data: str | None = None
    """The fingerprint of the data the run trains on at its first start (:mod:`trainfit.train.data_check`):
    a resume on other data would not see the same samples in the same order. None: no data, or a
    record written before it was kept."""

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TrainRun:
        check_schema(raw, SCHEMA_VERSION, "train.json", "train into a new --output with this trainfit")
        return super().from_json(raw)

    def into(self, output: Path) -> TrainRun:
        """This record training into ``output``: a ``trl_sft`` run's ``--output_dir`` (the last, the
        one that wins) set to it. The folder resumed may have been moved or copied since the record
        was written, and a run writes and rotates checkpoints only in the folder it is given: the
        recorded path would recreate the old folder, or rotate away the original's checkpoints."""
        if self.kind != "trl_sft" or "--output_dir" not in self.argv:
            return self
        at = len(self.argv) - 1 - self.argv[::-1].index("--output_dir")
        return dataclasses.replace(self, argv=[*self.argv[:at + 1], str(output), *self.argv[at + 2:]])

    def data_files(self, spec: Mapping[str, Any]) -> list[str]:
        """The files this run trains on (:func:`trainfit.train.data_check.trained_files`), ``spec`` its tune's."""
        return trained_files(spec, self.argv if self.kind == "trl_sft" else None)

    def what(self) -> dict[str, str]:
        """What decides the training, flat, for :func:`differences`."""
        from trainfit.train.sft import flags

        out = {"tune folder": self.run_dir, "trial": str(self.trial), "max steps": str(self.max_steps)}
        if self.kind == "trl_sft":  # the output folder is the one resumed, however it is spelled
            return {**out, **{f"--{k}": v for k, v in flags(self.argv).items() if k != "output_dir"}}
        if self.kind == "command":
            return {**out, "command": " ".join(self.argv)}
        e = self.evaluation
        if e is not None:
            out["evaluation"] = f"{e.path}, every {e.every or 'epoch'}, batch {e.batch_size}"
        return {**out, "epochs": f"{self.epochs:g}" if self.epochs is not None else "None",
                **{k: json.dumps(v) for k, v in self.config.items()}}


@dataclass(frozen=True, kw_only=True)
class TrainResult(Record):
    """``train_result.json``: how the run (or this part of it) ended."""

    schema_version: int = SCHEMA_VERSION
    status: str
    """``finished``, or ``stopped`` (SIGTERM or the deadline: resume it with ``--resume``)."""
    stopped_by: str | None
    step: int | None
    """Optimizer steps done (None: your own command ran, trainfit does not see its steps)."""
    max_steps: int | None
    resumed_from: str | None
    """The checkpoint this process started from; None: step 0."""
    process_s: float
    """This process's time in ``train``: start-up, model, data, the steps, the saves."""
    elapsed_s: float
    """Since the first start (``train.json``'s ``started_at``), pauses between resumes included."""
    planned_s: float | None
    """The plan's ETA for a run of ``max_steps`` steps (the plan's own, or a ``--max-steps`` run's;
    None: trained without a plan)."""
    planned_low_s: float | None = None
    planned_high_s: float | None = None
    output: str
    resume: str | None = None
    """The command that continues a stopped run (None: it finished)."""
    at_once: bool = False
    """Stopped without a save (a second Ctrl-C, or a signal before the first step): ``step`` is the
    last complete checkpoint's (0: none), where ``resume`` continues; the steps after it are lost."""
    before_first_step: bool = False
    """Stopped at once while the run started up (loading, before the trainer's first step): this
    process trained nothing, so nothing was lost."""


def _plan(run_dir: Path) -> Plan | None:
    path = run_dir / "plan.json"
    if not path.is_file():
        return None
    return load_record(Plan, path, "the plan", f"plan again: trainfit plan {shlex.quote(str(run_dir))} --max-hours H")


def training_command(run_dir: Path, plan: Plan | None) -> tuple[str, str, int]:
    """The one-line ``trl sft`` command to train, where it came from, and its trial."""
    from trainfit.command import is_trl_command
    from trainfit.written_command import as_one_line, written_command

    fallback = f"run the command yourself: bash {shlex.quote(str(run_dir / 'train_command.sh'))} --output_dir DIR"
    if plan is not None:
        if plan.command is None or not is_trl_command(plan.command):
            raise TrainfitError(f"{run_dir / 'plan.json'} chose trial {plan.trial}, which has no `trl sft` command "
                                "trainfit wrote: `trainfit train` runs only that command, for now", fallback)
        return plan.command, "plan.json", plan.trial
    script, best, _ = written_command(run_dir, fallback, use="`trainfit train`",
                                      without_it="tune again into a new folder")
    return as_one_line(script, []), "train_command.sh", best.trial


def template_command(run_dir: Path, plan: Plan | None) -> tuple[str, str, int]:
    """The filled ``tune.command_template`` to run (the plan's choice, else the fastest config's
    ``train_command.sh``), where it came from, and its trial."""
    from trainfit.command import script_command
    from trainfit.summary import read_summary

    if plan is not None:
        if plan.command is None:
            raise TrainfitError(f"{run_dir / 'plan.json'} chose trial {plan.trial}, for which tune wrote no command",
                                "plan again with another priority, or fill its values into your command yourself")
        return plan.command, "plan.json", plan.trial
    best = read_summary(run_dir).best_config
    script_path = run_dir / "train_command.sh"
    if best is None or not script_path.is_file():
        raise TrainfitError(f"{run_dir} holds no train_command.sh: no config fit the budget",
                            "see its summary.json's all_failed advice, then tune again")
    line, why_none = script_command(script_path.read_text())
    if line is None:
        raise TrainfitError(f"tune wrote no training command in {script_path}: {why_none}",
                            "fix the spec's tune.command_template and tune again")
    return line, "train_command.sh", best.trial


def differences(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The keys whose values differ (either side missing counts), as ``key: before -> now``."""
    return [f"{k}: {before.get(k, '(unset)')} -> {now.get(k, '(unset)')}" for k in sorted(before.keys() | now.keys())
            if before.get(k) != now.get(k)]


def _planned_since(run_dir: Path, record: TrainRun, now: TrainRun) -> str:
    """Where a `trainfit plan` since the run's start changed what it trains: the words that say so."""
    plan = run_dir / "plan.json"
    if "plan.json" not in (record.source, now.source) or not plan.is_file() or \
            plan.stat().st_mtime <= record.started_at:
        return ""
    return (f"\n{plan} was written after this run started (from {record.source}): to resume, put back "
            + ("the plan it started with" if record.source == "plan.json" else "the folder without a plan (move "
               "plan.json aside)") + "; to train the new plan, give it a new --output")


def to_train(run_dir: Path, output: Path, *, extra_args: Sequence[str] = (), max_steps: int | None = None,
             loop: bool = False) -> tuple[TrainRun, Plan | None]:
    """What ``run_dir`` says to train (its plan's choice, else its fastest config), as a record
    started now with the fingerprint of the data it trains on, and the plan. A spec with a
    ``tune.command_template`` trains with that command, unless ``loop`` (a factory model, in
    trainfit's loop)."""
    from trainfit.summary import read_summary

    if not run_dir.is_dir():
        raise TrainfitError(f"{run_dir} is not a folder", "pass the output folder of `trainfit tune`")
    summary = read_summary(run_dir)
    record, plan = _chosen(run_dir, output, summary, extra_args=extra_args, max_steps=max_steps, loop=loop)
    return dataclasses.replace(record, data=identity(record.data_files(summary.spec))), plan


def _chosen(run_dir: Path, output: Path, summary: Summary, *, extra_args: Sequence[str], max_steps: int | None,
            loop: bool) -> tuple[TrainRun, Plan | None]:
    """:func:`to_train`'s record, before its data's fingerprint."""
    plan = _plan(run_dir)
    common = functools.partial(TrainRun, run_dir=str(run_dir.resolve()), max_steps=max_steps, started_at=time.time())
    factory = bool((summary.spec.get("model") or {}).get("factory"))
    if loop and not factory:
        raise TrainfitError("--loop trains a factory model in trainfit's loop; this tune folder's model is a Hugging "
                            "Face one, trained by TRL's trainer", "drop --loop")
    if summary.command_template and not loop:
        if max_steps:
            raise TrainfitError("--max-steps caps trainfit's own loops; this run is your command_template",
                                "pass your trainer's own step limit after --"
                                + (", or add --loop to train the factory model in trainfit's loop" if factory else ""))
        line, source, trial = template_command(run_dir, plan)
        return common(source=source, trial=trial, kind="command", threads=None,
                      argv=[" ".join([line, *(shlex.quote(a) for a in extra_args)])]), plan
    if factory:
        if extra_args:
            raise TrainfitError("arguments after -- go to `trl sft`, and this tune folder's model is a factory model, "
                                "which trains in trainfit's own loop", "drop them (--max-steps caps the steps)")
        best = summary.best_config
        if plan is None and (best is None or best.samples_per_second is None):
            raise TrainfitError(f"no config fit the budget in {run_dir}: there is nothing to train",
                                "see its summary.json's all_failed advice, then tune again")
        chosen = (plan.trial, plan.config, plan.epochs) if plan is not None else (
            best.trial, best.config, float(summary.epochs_for_estimate or 1))  # type: ignore[union-attr]
        return common(source="plan.json" if plan else "summary.json", trial=chosen[0], kind="factory", threads=None,
                      config=dict(chosen[1]), epochs=chosen[2], evaluation=plan.evaluation if plan else None), plan
    command, source, trial = training_command(run_dir, plan)
    from trainfit.train.sft import relocated, split_command

    threads, argv = split_command(command)
    argv = [*relocated(argv, run_dir), *extra_args, *(["--max_steps", str(max_steps)] if max_steps else []),
            "--output_dir", str(output), "--save_strategy", "no", "--disable_tqdm", "false"]
    return common(source=source, trial=trial, kind="trl_sft", threads=threads, argv=argv), plan


def resume_command(run_dir: str | Path, output: str | Path, *, max_steps: int | None = None, loop: bool = False,
                   extra_args: Sequence[str] = (), options: Sequence[str] = ()) -> str:
    """The command that continues a run in ``output``: the same tune folder and the arguments that
    decide what trains (``--max-steps``, ``--loop``, the ``trl sft`` ones after ``--``: a resume with
    others is refused), ``options`` (e.g. the run's ``--deadline``), and ``--resume``."""
    parts = ["trainfit", "train", str(run_dir), "--output", str(output),
             *(["--max-steps", str(max_steps)] if max_steps else []), *(["--loop"] if loop else []), *options,
             "--resume", *(["--", *extra_args] if extra_args else [])]
    return shlex.join(parts)


def prepare(run_dir: Path, output: Path, *, resume: bool, extra_args: Sequence[str] = (), max_steps: int | None = None,
            loop: bool = False, record_batches: bool = False, again: str,
            say: Callable[[str], None] = print) -> tuple[TrainRun, Path | None, Plan | None]:
    """Check the input and the output folder; returns what to train, the checkpoint to resume
    from (None: from step 0) and the plan. Removes unfinished checkpoints (they cannot be resumed).
    ``again``: the command that resumes the run (:func:`resume_command`), for the errors.
    ``record_batches``: the run will record its batches, which only a ``trl sft`` run can."""
    run_dir, output = Path(run_dir), Path(output).resolve()
    now, plan = to_train(run_dir, output, extra_args=extra_args, max_steps=max_steps, loop=loop)
    if record_batches and now.kind != "trl_sft":
        raise TrainfitError(f"--record-batches records the batches of a `trl sft` run; this run is a {now.kind}",
                            "leave --record-batches out")
    record_path = output / "train.json"
    if resume:
        record = _recorded(run_dir, output, now, say)
        changed = differences(record.what(), now.what())
        if changed:
            raise TrainfitError(f"{output} trains something else than this command would; what differs:\n  "
                                + "\n  ".join(changed) + _planned_since(run_dir, record, now),
                                "resume with the same tune folder, plan and arguments, or train into a new --output")
        if record.data is not None and now.data != record.data:
            from trainfit.summary import read_summary

            refuse_changed(now.data_files(read_summary(run_dir).spec), output, readable=now.data is not None)
    else:
        if record_path.exists() or any(output.glob("checkpoint-*")):
            raise TrainfitError(f"{output} already holds a run (train.json or checkpoints)",
                                f"continue it: {again}; or pick a new --output")
        if now.kind == "trl_sft":
            from trainfit.train.sft import parse

            parse(now.argv)  # refused before a record is written: the corrected command then starts afresh
        output.mkdir(parents=True, exist_ok=True)
        record = now
        write_atomically(record_path, json.dumps(record.to_json(), indent=2) + "\n")
    if record.kind == "command":  # its checkpoints are your trainer's own: trainfit leaves them alone
        return record, None, plan
    for folder in incomplete(output):
        say(f"trainfit: removing {folder.name}: its save did not finish (no completion mark), so it cannot be resumed")
        shutil.rmtree(folder, ignore_errors=True)
    checkpoint = latest_complete(output) if resume else None
    if resume and checkpoint is None:
        say(f"trainfit: {output} holds no complete checkpoint: starting again from step 0")
    if plan is not None and not plan.fits and record.max_steps is None:
        from trainfit.progress import format_duration as dur

        say(f"trainfit: warning: {run_dir / 'plan.json'} does not fit its window (ETA {dur(plan.eta.total_s)} "
            f"against {dur(plan.window_s)}): --deadline stops the run with a checkpoint before the window ends, "
            f"or plan again and take one of its options (trainfit plan {shlex.quote(str(run_dir))} ...)")
    return record, checkpoint, plan


def _recorded(run_dir: Path, output: Path, now: TrainRun, say: Callable[[str], None]) -> TrainRun:
    """The record of the run ``output`` holds, training into ``output``; where its ``train.json``
    is damaged or gone but a complete checkpoint is there, rebuilt (:mod:`trainfit.train.rebuild`)
    as ``now``, what the resume command trains."""
    from trainfit.train.rebuild import rebuilt

    record_path = output / "train.json"
    if not record_path.is_file():
        if latest_complete(output) is None:
            raise TrainfitError(f"there is nothing to resume in {output}: it holds no train.json",
                                "start the run without --resume: "
                                + shlex.join(["trainfit", "train", str(run_dir), "--output", str(output)]))
        return rebuilt(output, now, f"{record_path} is missing", say)
    try:
        return load_record(TrainRun, record_path, "the run record", "train into a new --output").into(output)
    except Damaged as err:
        return rebuilt(output, now, err.message, say)


def train(run_dir: str | Path, output: str | Path, *, resume: bool = False, checkpoint_minutes: float | None = None,
          keep: int = 2, deadline_hours: float | None = None, use_plan_deadline: bool = False,
          extra_args: Sequence[str] = (), max_steps: int | None = None, loop: bool = False,
          monitor_every_s: float = 60.0, record_batches: str | Path | None = None,
          say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> TrainResult:
    """Train the tune folder ``run_dir``'s chosen config into ``output`` (see the module); a
    factory model trains in trainfit's loop (:mod:`trainfit.train.loop`).

    ``checkpoint_minutes``: between checkpoints (default: the plan's, else 30). ``keep``: complete
    checkpoints kept. ``deadline_hours`` (since the first start) or ``use_plan_deadline`` (the
    plan's window): stop with a checkpoint when the next step and save would pass it.
    ``extra_args``: more ``trl sft`` arguments, after the written ones (a later flag wins).
    ``max_steps``: a cap on the optimizer steps. ``loop``: a factory model trains in trainfit's
    loop even when the spec has a ``tune.command_template`` (which otherwise runs: :mod:`trainfit.train.child`).
    ``record_batches``: a file to append the padded length of each training micro-batch to, one a
    line, in the order they train (``trl sft`` runs only; what ``plan --calibrate`` prices its timed
    steps by).
    """
    began = time.monotonic()
    run_dir, output = Path(run_dir), Path(output).resolve()
    _check_inputs(run_dir, keep, record_batches)
    deadline = ["--deadline"] if use_plan_deadline else ["--deadline", f"{deadline_hours:g}"] if deadline_hours else []
    again = resume_command(run_dir, output, max_steps=max_steps, loop=loop, extra_args=extra_args, options=deadline)
    with held_folder(output, functools.partial(_running, output)):
        if resume and (done := _finished(output, say)) is not None:
            return done
        record, checkpoint, plan = prepare(run_dir, output, resume=resume, extra_args=extra_args, max_steps=max_steps,
                                           loop=loop, record_batches=record_batches is not None, say=say, again=again)
        if use_plan_deadline:
            if plan is None:
                raise TrainfitError(f"--deadline with no hours needs a plan: {run_dir} holds no plan.json",
                                    "give the hours (--deadline 11.5), or plan first: trainfit plan "
                                    f"{shlex.quote(str(run_dir))} "
                                    "--max-hours H")
            deadline_hours = plan.max_hours
        every_s = checkpoint_minutes * 60 if checkpoint_minutes is not None else (
            plan.checkpoint_every_s if plan is not None else 30 * 60)
        log, control, callbacks = _watchers(run_dir, output, record, plan, every_s=every_s, keep=keep,
                                            deadline_hours=deadline_hours, monitor_every_s=monitor_every_s, say=say)
        say(f"trainfit: training trial {record.trial} of {run_dir} ({record.source}) into {output}"
            + (f", resuming from {checkpoint.name}" if checkpoint else ""))
        log.write("start", resumed_from=checkpoint.name if checkpoint else None, source=record.source,
                  trial=record.trial)
        try:
            step, total = _run(run_dir, output, record, plan, checkpoint, control, callbacks, resume=resume,
                               every_s=every_s, record_batches=record_batches, say=say, again=again)
        except KeyboardInterrupt as err:  # a second Ctrl-C, or a signal before the first step
            step, total = _stopped_at_once(err, record, output, control, say)
        planned = (plan.eta_for(total) if total else plan.eta) if plan else None  # a --max-steps run: its own length
        result = TrainResult(
            status="stopped" if control.stopped else "finished", stopped_by=control.stopped, step=step,
            max_steps=total, resumed_from=checkpoint.name if checkpoint else None,
            process_s=time.monotonic() - began, elapsed_s=time.time() - record.started_at,
            planned_s=planned.total_s if planned else None, planned_low_s=planned.low_s if planned else None,
            planned_high_s=planned.high_s if planned else None, output=str(output),
            resume=again if control.stopped else None, at_once=control.at_once,
            before_first_step=control.at_once and control.first_step is None)
        _write_result(result, run_dir, output, record, plan)
        log.write("end", **{k: v for k, v in result.to_json().items() if k != "schema_version"})
    return result


def _stopped_at_once(err: KeyboardInterrupt, record: TrainRun, output: Path, control: Any,
                     say: Callable[[str], None]) -> tuple[int, int | None]:
    """A run stopped at once, without the save (a second Ctrl-C, or a signal before the first
    step), recorded on ``control`` as stopped so that the result says how to resume: returns the
    step of the last complete checkpoint in ``output`` (0: none) and the run's total steps. A save
    the stop cut short is removed (it has no mark: no resume would use it), said so."""
    if record.kind == "command":  # its checkpoints are your trainer's own: trainfit cannot tell what is kept
        raise err
    control.stopped, control.at_once = str(err) if isinstance(err, Terminated) else "SIGINT", True
    for folder in incomplete(output):
        say(f"trainfit: removing {folder.name}: the stop cut its save short")
        shutil.rmtree(folder, ignore_errors=True)
    last = latest_complete(output)
    return (step_of(last) or 0) if last is not None else 0, control.max_steps or record.max_steps


def _check_inputs(run_dir: Path, keep: int, record_batches: str | Path | None) -> None:
    """A clear error before any folder is made or run recorded: ``keep`` below 1, ``run_dir`` not
    a tune folder, a ``record_batches`` file that cannot be appended to."""
    from trainfit.summary import read_summary

    if keep < 1:
        raise TrainfitError(f"keep={keep}: at least the newest complete checkpoint is kept", "keep=1 or more")
    if not run_dir.is_dir():
        raise TrainfitError(f"{run_dir} is not a folder", "pass the output folder of `trainfit tune`")
    read_summary(run_dir)
    batches = Path(record_batches) if record_batches is not None else None
    if batches is not None and (batches.is_dir() or not batches.parent.is_dir()):
        raise TrainfitError(f"--record-batches cannot write there: {batches} "
                            + ("is a folder" if batches.is_dir() else "is in a folder that does not exist"),
                            "give the path of a file in a folder that exists")


def _finished(output: Path, say: Callable[[str], None]) -> TrainResult | None:
    """The result of the run in ``output`` where it finished, said so (None: it did not, or its
    result cannot be read): a resume then has nothing to train."""
    try:
        result = load_record(TrainResult, output / "train_result.json", "the run's result", "")
    except (TrainfitError, KeyError, TypeError, ValueError):
        return None
    if result.status != "finished" or result.step is None:  # your own command's exit: trainfit did not see it end
        return None
    say(f"trainfit: the run in {output} finished at step {result.step} of {result.max_steps}: nothing to resume "
        "(its model and train_result.json are left as they are; train into a new --output to train again)")
    return result


def _write_result(result: TrainResult, run_dir: Path, output: Path, record: TrainRun, plan: Plan | None) -> None:
    """``output/train_result.json``, and ``run_dir/actual.json`` where the run is the planned one,
    finished, not a part of it (a command template's steps are its trainer's: ``max_steps`` None)."""
    text = json.dumps(result.to_json(), indent=2) + "\n"
    write_atomically(output / "train_result.json", text)
    if plan is not None and result.status == "finished" and record.max_steps is None \
            and result.max_steps in (None, plan.eta.steps):
        write_atomically(run_dir / "actual.json", text)


def _watchers(run_dir: Path, output: Path, record: TrainRun, plan: Plan | None, *, every_s: float, keep: int,
              deadline_hours: float | None, monitor_every_s: float,
              say: Callable[[str], None]) -> tuple[Any, Any, list[Any]]:
    """The run's log, its checkpoint/deadline control and the trainer callbacks (the control, and
    the on-track monitor when the folder has a plan)."""
    from trainfit.monitor import OnTrackCallback
    from trainfit.train.callbacks import RunLog, TrainControl

    log = RunLog(output / "train_log.jsonl")
    one_save = plan.eta.checkpoint_s / plan.eta.checkpoints if plan is not None and plan.eta.checkpoints else 0.0
    control = TrainControl(every_s=every_s, keep=keep, log=log, started_at=record.started_at, say=say,
                           deadline=record.started_at + deadline_hours * 3600 if deadline_hours else None,
                           save_s=one_save)
    callbacks: list[Any] = [control]
    if plan is not None:
        callbacks.append(OnTrackCallback(run_dir / "plan.json", every_s=monitor_every_s,
                                         started_at=record.started_at,
                                         on_status=lambda status: log.write("on_track", **status.to_json())))
    return log, control, callbacks


def _run(run_dir: Path, output: Path, record: TrainRun, plan: Plan | None, checkpoint: Path | None, control: Any,
         callbacks: list[Any], *, resume: bool, every_s: float, record_batches: str | Path | None = None,
         say: Callable[[str], None], again: str) -> tuple[int | None, int | None]:
    """Train by the record's kind; the step reached and the run's total steps (None for a
    command template, whose trainer is the user's). ``again``: the command that resumes it."""
    if record.kind == "command":
        control.stopped = _run_command(record, run_dir, output, plan, resume=resume, every_s=every_s,
                                       deadline=control.deadline, say=say)
        return None, None
    with torch_threads(record.threads), _listening(control):
        try:
            if record.kind == "factory":
                return _run_factory(run_dir, record, output, checkpoint, callbacks, say)
            return _run_trl_sft(record, output, checkpoint, callbacks, control, record_batches)
        except OSError as err:  # a full disk mid-save, say: that save has no mark, the last marked one stays
            from trainfit.errors import os_error

            last = latest_complete(output)
            raise TrainfitError(f"training stopped: {os_error(err)}",
                                f"fix the cause, then resume: {again} "
                                f"(from {last.name if last else 'step 0'})") from err


def _running(output: Path, holder: str) -> TrainfitError:
    """The refusal of a second ``trainfit train`` on ``output`` while its run (``holder``) lives:
    it would delete the run's checkpoints (:func:`~trainfit.files.held_folder`)."""
    return TrainfitError(f"another `trainfit train` is running in {output} ({holder})",
                         "wait for it to end, or stop it (Ctrl-C or SIGTERM saves a checkpoint) and resume")


@contextlib.contextmanager
def _listening(control: Any) -> Iterator[None]:
    restore = control.listen()
    try:
        yield
    finally:
        restore()


def _run_command(record: TrainRun, run_dir: Path, output: Path, plan: Plan | None, *, resume: bool, every_s: float,
                 deadline: float | None, say: Callable[[str], None]) -> str | None:
    """Run your own training command; returns the signal passed on to it (None: it ended by itself)."""
    from trainfit.train.child import child_environment, run_child

    env = child_environment(plan=run_dir / "plan.json" if plan is not None else None, output=output, resume=resume,
                            checkpoint_every_s=every_s, deadline=deadline, started_at=record.started_at)
    return run_child(record.argv[0], env=env, say=say)


def _run_trl_sft(record: TrainRun, output: Path, checkpoint: Path | None, callbacks: list[Any],
                 control: Any, record_batches: str | Path | None = None) -> tuple[int, int]:
    """Train with TRL's trainer in this process; returns (steps done, total steps)."""
    from trainfit.monitor import OnTrackCallback, observe_train_batches
    from trainfit.train.callbacks import BatchRecord
    from trainfit.train.sft import build_trainer

    trainer = build_trainer(record.argv, callbacks)
    trainer.args.save_total_limit = None  # one rotation: TrainControl's, which never drops the last complete one
    for callback in callbacks:
        if isinstance(callback, OnTrackCallback):
            callback.watch(trainer)  # the pace against the work of the very batches trained
    with contextlib.ExitStack() as stack:
        if record_batches is not None:
            recorder = BatchRecord(stack.enter_context(Path(record_batches).open("a", buffering=1)))  # a line each
            observe_train_batches(trainer, recorder.observe)
            trainer.add_callback(recorder)
        return _train_trl(trainer, output, checkpoint, control)


def _train_trl(trainer: Any, output: Path, checkpoint: Path | None, control: Any) -> tuple[int, int]:
    """``trainer.train`` from ``checkpoint``, the model saved unless a signal or the deadline stopped it."""
    try:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    except OSError:
        raise
    except Exception as err:
        if checkpoint is None or control.step_began:
            raise
        raise unloadable(checkpoint, err) from err  # before the first step: while the Trainer loaded the checkpoint
    if control.stopped is None:
        trainer.save_model(str(output))
    return int(trainer.state.global_step), int(trainer.state.max_steps)


def _run_factory(run_dir: Path, record: TrainRun, output: Path, checkpoint: Path | None, callbacks: list[Any],
                 say: Callable[[str], None]) -> tuple[int, int]:
    """Train a factory model with trainfit's loop; returns (steps done, total steps)."""
    from trainfit.params import parse_params
    from trainfit.plan.inputs import load_run
    from trainfit.train.loop import run_loop

    run = load_run(run_dir)
    summary, spec = run.summary, run.spec()
    if spec.data is None:
        raise TrainfitError("the spec has no data: a factory model trains on the rows of its data.path",
                            "add data: {path: ...} to the spec, tune, then train")
    params, problems = parse_params(record.config, allow_custom=True)
    if problems:
        raise TrainfitError(f"the config of trial {record.trial} does not parse: {problems[0]}", "tune again")
    return run_loop(spec, params, samples=summary.dataset_samples or 0, epochs=record.epochs or 1.0,
                    max_steps=record.max_steps, output=output, checkpoint=checkpoint, callbacks=callbacks, say=say,
                    evaluation=record.evaluation)


__all__ = ["TrainResult", "TrainRun", "differences", "prepare", "train", "training_command"]
