"""``trainfit train``: the training that was measured, run to its end, checkpointed and resumable.

From a tune output folder it trains the config the folder's ``plan.json`` chose (``trainfit
plan``), else the fastest one: a Hugging Face model with the written ``trl sft`` arguments run by
TRL's own trainer in this process (:mod:`trainfit.train.sft`), a factory model in trainfit's loop
on the probe's ``TrainStep`` (:mod:`trainfit.train.loop`). It adds a checkpoint every
``checkpoint_every_s`` and at the end (only complete ones count: :mod:`trainfit.train.checkpoints`),
a clean stop with a checkpoint on SIGTERM or before a deadline, the on-track check against the plan
(:class:`trainfit.OnTrackCallback`) and a JSON-lines log. ``resume=True`` continues from the last
complete checkpoint with the optimizer, scheduler, RNG states and data position it saved,
after checking that nothing that changes the training differs (:mod:`trainfit.train.prepare`).

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
import tempfile
import time
from datetime import datetime
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from trainfit.devices import process_peak_memory, resolve_device_name, torch_threads
from trainfit.errors import Terminated, TrainfitError, os_error
from trainfit.files import held_folder, refused_write, write_atomically
from trainfit.format import format_duration
from trainfit.params import Params, parse_params
from trainfit.plan import Plan
from trainfit.plan.from_compare import Winner, read_winner
from trainfit.plan.inputs import load_run
from trainfit.run_folder import RunFolder
from trainfit.spec import Spec
from trainfit.spec.training import TrainValues
from trainfit.train.checkpoints import incomplete, latest_complete, step_of, unloadable
from trainfit.train.child import child_environment, run_child
from trainfit.train.loop import run_loop
from trainfit.train.prepare import prepare, resume_command
from trainfit.train.records import TrainResult, TrainRun, load_record
from trainfit.train.sft import build_trainer
from trainfit.train.train_options import TrainOptions


def train(run_dir: str | Path, output: str | Path, options: TrainOptions = TrainOptions()) -> TrainResult:
    """Train the tune folder ``run_dir``'s chosen config into ``output`` (see the module), as
    ``options`` say (:class:`TrainOptions`); a factory model trains in trainfit's loop
    (:mod:`trainfit.train.loop`), or in its ``tune.command_template`` (:mod:`trainfit.train.child`).
    """
    resume, keep, extra_args, max_steps, loop, say = (options.resume, options.keep, options.extra_args,
                                                      options.max_steps, options.loop, options.say)
    deadline_hours, use_plan_deadline, record_batches = (options.deadline_hours, options.use_plan_deadline,
                                                         options.record_batches)
    began = time.monotonic()
    run_dir, output = (run := RunFolder(run_dir)).path, Path(output).resolve()  # run: its files read once, by all below
    _check_inputs(run, keep, record_batches)
    winner = _winner(options)
    again, past = _resume_commands(run_dir, output, options, winner)
    with held_folder(output, functools.partial(_running, output)):
        if resume and (done := _finished(output, say)) is not None:
            return done
        record, checkpoint, plan = prepare(run, output, resume=resume, extra_args=extra_args, max_steps=max_steps,
                                           loop=loop, record_batches=record_batches is not None, say=say, again=again,
                                           winner=winner)
        if use_plan_deadline:
            if plan is None:
                raise TrainfitError(f"--deadline with no hours needs a plan: {run_dir} holds no plan.json",
                                    "give the hours (--deadline 11.5), or plan first: trainfit plan "
                                    f"{shlex.quote(str(run_dir))} "
                                    "--max-hours H")
            deadline_hours = plan.max_hours
        if resume and deadline_hours:
            _refuse_a_passed_deadline(record.started_at, deadline_hours, past)
        every_s = options.checkpoint_minutes * 60 if options.checkpoint_minutes is not None else (
            plan.checkpoint_every_s if plan is not None else 30 * 60)
        log, control, callbacks = _watchers(run_dir, output, record, plan, every_s=every_s, keep=keep,
                                            deadline_hours=deadline_hours, monitor_every_s=options.monitor_every_s, say=say)
        say(f"trainfit: training trial {record.trial} of {run_dir} ({record.source}) into {output}"
            + (f", resuming from {checkpoint.name}" if checkpoint else ""))
        log.write("start", resumed_from=checkpoint.name if checkpoint else None, source=record.source,
                  trial=record.trial)
        try:
            step, total = _run(run, output, record, plan, checkpoint, control, callbacks, resume=resume,
                               every_s=every_s, record_batches=record_batches, say=say, again=again)
        except KeyboardInterrupt as err:  # a second Ctrl-C, or a signal before the first step
            step, total = _stopped_at_once(err, record, output, control, say)
        planned = (plan.eta_for(total) if total else plan.eta) if plan else None  # a --max-steps run: its own length
        peaks, probed = _peaks(run, record)
        result = TrainResult(
            status="stopped" if control.stopped else "finished", stopped_by=control.stopped, step=step,
            max_steps=total, resumed_from=checkpoint.name if checkpoint else None,
            process_s=time.monotonic() - began, elapsed_s=time.time() - record.started_at,
            planned_s=planned.total_s if planned else None, planned_low_s=planned.low_s if planned else None,
            planned_high_s=planned.high_s if planned else None, output=str(output),
            resume=(past if control.stopped == "deadline" else again) if control.stopped else None,
            at_once=control.at_once,
            before_first_step=control.at_once and control.first_step is None,
            peak_memory_bytes=_peak(peaks), probe_peak_memory_bytes=probed, trial=record.trial,
            **_pace(control, began, plan, fresh=checkpoint is None))
        _write_result(result, run_dir, output, record, plan)
        _say_peaks(peaks, probed, say)
        log.write("end", **{k: v for k, v in result.to_json().items() if k != "schema_version"})
    return result


def _winner(options: TrainOptions) -> Winner | None:
    """The compare config ``options`` train (``--from-compare``), marked a final under ``--top``."""
    winner = read_winner(options.from_compare, options.compare_config) if options.from_compare else None
    return dataclasses.replace(winner, chosen="final") if winner is not None and options.final else winner


def _resume_commands(run_dir: Path, output: Path, options: TrainOptions, winner: Winner | None) -> tuple[str, str]:
    """The commands that continue the run: with its deadline, and without (for a window spent)."""
    hours = options.deadline_hours
    deadline = ["--deadline"] if options.use_plan_deadline else ["--deadline", f"{hours:g}"] if hours else []
    carried = ["--from-compare", winner.compare_dir, "--config", winner.name] if winner else []
    if options.resume_with is not None:
        return options.resume_with, options.resume_with
    again = functools.partial(resume_command, run_dir, output, max_steps=options.max_steps, loop=options.loop,
                              extra_args=options.extra_args)
    return again(options=[*deadline, *carried]), again(options=carried)


def _pace(control: Any, began: float, plan: Plan | None, *, fresh: bool) -> dict[str, Any]:
    """What this process measured that a later plan learns from (``actual.json``): its steps' mean
    time (saves and evaluation passes left out) beside the plan's expected step of the config trained
    (the probe's), and, for a run from step 0, its start-up (its launch, ``began`` by the monotonic
    clock, to the trainer's start)."""
    launched = time.time() - (time.monotonic() - began)
    started = control.began_at  # None: the trainer never started
    return {"step_s": control.step_s or None, "planned_step_s": plan.model_step_s if plan is not None else None,
            "startup_s": max(0.0, started - launched) if fresh and started is not None else None}


def _peaks(run: RunFolder, record: TrainRun) -> tuple[dict[str, int], int | None]:
    """This process's peak memory as a probe counts its own (:func:`~trainfit.devices.process_peak_memory`;
    none for your own command, which ran in a process of its own), and the probe's for the trained
    trial (None where the summary lacks it)."""
    entry = run.summary.entry(record.trial)
    probed = round(entry.memory_peak_gb * 2**30) if entry is not None and entry.memory_peak_gb else None
    return (process_peak_memory() if record.kind != "command" else {}), probed


def _peak(peaks: Mapping[str, int]) -> int | None:
    """The peak a probe's ``peak_memory_bytes`` is the same measure as: reserved on CUDA, else RSS."""
    return peaks.get("peak_reserved_bytes", peaks.get("peak_rss_bytes"))


def _say_peaks(peaks: Mapping[str, int], probed: int | None, say: Callable[[str], None]) -> None:
    """The run's peak against the probe's for its config, which promised that it fits."""
    peak = _peak(peaks)
    if peak is None or not probed:
        return
    say(f"trainfit: peak memory {peak / 2**30:.3g} GiB, the probe's {probed / 2**30:.3g} GiB for this config "
        f"({peak / probed:.2f}x{'' if peak <= probed * 1.1 else ': past what the probe measured'})"
        + ("; a CPU's peak is the process's RSS, which holds the data and the trainer too"
           if "peak_rss_bytes" in peaks else ""))


def _refuse_a_passed_deadline(started_at: float, hours: float, past: str) -> None:
    """A resume whose deadline (``hours`` from the first start) has passed would load the model,
    train one step and stop again: refused, with the ways on."""
    over_s = time.time() - (started_at + hours * 3600)
    if over_s < 0:
        return
    began = datetime.fromtimestamp(started_at).isoformat(sep=" ", timespec="minutes")
    raise TrainfitError(
        f"--deadline {hours:g} h counts from the run's first start ({began}): it passed {format_duration(over_s)} ago, "
        "so a resume with it would train one step and stop",
        f"continue past the window without it: {past}; or give the hours the run may take in all, counted from "
        f"its first start: more than the {hours + over_s / 3600:.2f} gone (--deadline HOURS)")


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


def _check_inputs(run: RunFolder, keep: int, record_batches: str | Path | None) -> None:
    """A clear error before any folder is made or run recorded: ``keep`` below 1, ``run`` not
    a tune folder, a ``record_batches`` file that cannot be appended to."""
    if keep < 1:
        raise TrainfitError(f"keep={keep}: at least the newest complete checkpoint is kept", "keep=1 or more")
    if not run.path.is_dir():
        raise TrainfitError(f"{run.path} is not a folder", "pass the output folder of `trainfit tune`")
    run.summary  # noqa: B018 (read, and checked, now)
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
    if plan is not None and result.status == "finished" and record.max_steps in (None, plan.max_steps) \
            and (result.max_steps is None or plan.counts_its_run(result.max_steps)):
        write_atomically(run_dir / "actual.json", text)


def _watchers(run_dir: Path, output: Path, record: TrainRun, plan: Plan | None, *, every_s: float, keep: int,
              deadline_hours: float | None, monitor_every_s: float,
              say: Callable[[str], None]) -> tuple[Any, Any, list[Any]]:
    """The run's log, its checkpoint/deadline control and the trainer callbacks (the control, and
    the on-track monitor when the folder has a plan)."""
    # local: torch and transformers load only where this process trains
    from trainfit.train.callbacks import RunLog, TrainControl
    from trainfit.train.monitor import OnTrackCallback

    log = RunLog(output / "train_log.jsonl")
    one_save = plan.eta.checkpoint_s / plan.eta.checkpoints if plan is not None and plan.eta.checkpoints else 0.0
    control = TrainControl(every_s=every_s, keep=keep, log=log, started_at=record.started_at, say=say,
                           deadline=record.started_at + deadline_hours * 3600 if deadline_hours else None,
                           save_s=one_save, eval_s=plan.evaluation.pass_s if plan is not None and plan.evaluation else 0.0,
                           lower_lr=_lower_lr(record))
    callbacks: list[Any] = [control]
    if plan is not None:
        callbacks.append(OnTrackCallback(run_dir / "plan.json", every_s=monitor_every_s,
                                         started_at=record.started_at,
                                         on_status=lambda status: log.write("on_track", **status.to_json())))
    return log, control, callbacks


def _lower_lr(record: TrainRun) -> str:
    """How this run takes a lower learning rate: after ``--``, as ``trl sft`` and the factory loop both
    do (the factory's is said, it prints none), or your own command's way."""
    if record.kind == "command":
        return "your command's own setting"
    if record.kind == "factory":
        return f"now {TrainValues.of(record.training).learning_rate:g}: -- --learning_rate X"
    return "-- --learning_rate X"


def _run(run: RunFolder, output: Path, record: TrainRun, plan: Plan | None, checkpoint: Path | None, control: Any,
         callbacks: list[Any], *, resume: bool, every_s: float, record_batches: str | Path | None = None,
         say: Callable[[str], None], again: str) -> tuple[int | None, int | None]:
    """Train by the record's kind; the step reached and the run's total steps (None for a
    command template, whose trainer is the user's). ``again``: the command that resumes it."""
    if record.kind == "command":
        control.stopped = _run_command(record, run.path, output, plan, resume=resume, every_s=every_s,
                                       deadline=control.deadline, say=say)
        return None, None
    with torch_threads(record.threads), _listening(control):
        try:
            if record.kind == "factory":
                return _run_factory(run, record, output, checkpoint, callbacks, say, again)
            return _run_trl_sft(record, output, checkpoint, callbacks, control, record_batches)
        except Exception as err:  # a full disk mid-save, say: that save has no mark, the last marked one stays
            if isinstance(err, TrainfitError):
                raise
            refused = err if isinstance(err, OSError) else refused_write(err, output)
            if refused is None:
                raise
            last = latest_complete(output)
            raise TrainfitError(f"training stopped: {os_error(refused)}",
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
    env = child_environment(plan=run_dir / "plan.json" if plan is not None else None, output=output, resume=resume,
                            checkpoint_every_s=every_s, deadline=deadline, started_at=record.started_at)
    return run_child(record.argv[0], env=env, say=say)


def _run_trl_sft(record: TrainRun, output: Path, checkpoint: Path | None, callbacks: list[Any],
                 control: Any, record_batches: str | Path | None = None) -> tuple[int, int]:
    """Train with TRL's trainer in this process; returns (steps done, total steps)."""
    # local: torch and transformers load only where this process trains
    from trainfit.train.callbacks import BatchRecord
    from trainfit.train.monitor import OnTrackCallback, observe_train_batches

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


def _run_factory(run_folder: RunFolder, record: TrainRun, output: Path, checkpoint: Path | None, callbacks: list[Any],
                 say: Callable[[str], None], again: str) -> tuple[int, int]:
    """Train a factory model with trainfit's loop, by the record's training values, its figures to
    their ``report_to`` services, on the config's processes (this one rank 0: :mod:`.ranks`);
    returns (steps done, total steps)."""
    # local: torch and transformers load only where this process trains
    from trainfit.train.monitor import OnTrackCallback
    from trainfit.train.ranks import ranks
    from trainfit.train.trackers import trackers

    spec, params, samples, training = _factory_inputs(run_folder, record)
    services = trackers(training.report_to, output, {**record.config, **record.training})
    for callback in callbacks:
        if isinstance(callback, OnTrackCallback):
            callback.services = services
    device = resolve_device_name(spec.probe.device)
    job = {"run_dir": str(run_folder.path), "output": str(output), "checkpoint": str(checkpoint) if checkpoint else None,
           "device": device, "again": again}
    try:
        with tempfile.TemporaryDirectory(prefix="trainfit-ranks-") as scratch, \
                ranks(params.processes, job, Path(scratch), device):
            return run_loop(spec, params, samples=samples, epochs=record.epochs or 1.0, max_steps=record.max_steps,
                            output=output, checkpoint=checkpoint, callbacks=[*callbacks, *services], say=say,
                            evaluation=record.evaluation, training=training)
    finally:
        for service in services:  # closed at the run's end already, unless it raised
            service.close()


def train_rank(job: dict[str, Any]) -> None:
    """A rank other than 0 of a factory run on several processes (:mod:`.ranks`): the same loop on
    its share of the rows, with no callbacks (rank 0's decide), from the same checkpoint."""
    run_folder, output = RunFolder(job["run_dir"]), Path(job["output"])
    record = load_record(TrainRun, output / "train.json", "train.json", "resume from rank 0")
    spec, params, samples, training = _factory_inputs(run_folder, record)
    with torch_threads(record.threads):
        run_loop(spec, params, samples=samples, epochs=record.epochs or 1.0, max_steps=record.max_steps, output=output,
                 checkpoint=Path(job["checkpoint"]) if job["checkpoint"] else None, callbacks=[],
                 say=lambda line: None, evaluation=record.evaluation, training=training)


def _factory_inputs(run_folder: RunFolder, record: TrainRun) -> tuple[Spec, Params, int, TrainValues]:
    """What a factory run trains: the tune's spec, the record's config and training values, the data's samples."""
    run = load_run(run_folder)
    summary, spec = run.summary, run.spec()
    if spec.data is None:
        raise TrainfitError("the spec has no data: a factory model trains on the rows of its data.path",
                            "add data: {path: ...} to the spec, tune, then train")
    params, problems = parse_params(record.config, allow_custom=True)
    if problems:
        raise TrainfitError(f"the config of trial {record.trial} does not parse: {problems[0]}", "tune again")
    return spec, params, summary.dataset_samples or 0, TrainValues.of(record.training)


__all__ = ["TrainOptions", "TrainResult", "TrainRun", "prepare", "train"]

