"""What ``trainfit train`` trains: the plan's or the fastest config of a tune folder, its command
(the written ``trl sft`` one or the spec's template), recorded once in ``train.json``; on a resume,
checked against that record, so nothing that changes the training differs."""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.format import format_duration as dur
from trainfit.plan import Plan, chosen_command
from trainfit.plan.inputs import Candidate, load_run, rebuild
from trainfit.plan.from_compare import Winner, keep_learned
from trainfit.run_folder import COMMAND_FILE, RunFolder
from trainfit.spec.training import TrainValues
from trainfit.summary import Summary
from trainfit.train.checkpoints import incomplete, latest_complete
from trainfit.train.data_check import identity, refuse_changed
from trainfit.train.rebuild import rebuilt
from trainfit.train.records import Damaged, TrainRun, load_record
from trainfit.train.sft import parse, relocated, split_command
from trainfit.trainer.command import flags, is_trl_command, script_command
from trainfit.trainer.written_command import as_one_line, template_for_steps, written_command


def _plan(run_dir: Path) -> Plan | None:
    path = run_dir / "plan.json"
    if not path.is_file():
        return None
    plan = load_record(Plan, path, "the plan", f"plan again: trainfit plan {shlex.quote(str(run_dir))} --max-hours H")
    if plan.estimated is not None or plan.trial is None:
        raise TrainfitError(f"{path} is estimated, not measured (a plan before the hardware, `trainfit plan --like` "
                            "or `--throughput`): `trainfit train` runs a plan of what tune measured",
                            f"plan the folder again: trainfit plan {shlex.quote(str(run_dir))} --max-hours H")
    return plan


def training_command(run: RunFolder, plan: Plan | None) -> tuple[str, str, int]:
    """The one-line ``trl sft`` command to train, where it came from, and its trial."""
    run_dir = run.path
    fallback = f"run the command yourself: bash {shlex.quote(str(run_dir / 'train_command.sh'))} --output_dir DIR"
    if plan is not None:
        if plan.command is None or not is_trl_command(plan.command):
            raise TrainfitError(f"{run_dir / 'plan.json'} chose trial {plan.trial}, which has no `trl sft` command "
                                "trainfit wrote: `trainfit train` runs only that command, for now", fallback)
        assert plan.trial is not None  # _plan refuses an estimated plan
        return plan.command, "plan.json", plan.trial
    script, best, _ = written_command(run, fallback, use="`trainfit train`",
                                      without_it="tune again into a new folder")
    return as_one_line(script, []), "train_command.sh", best.trial


def template_command(run: RunFolder, plan: Plan | None) -> tuple[str, str, int]:
    """The filled ``tune.command_template`` to run (the plan's choice, else the fastest config's
    ``train_command.sh``), where it came from, and its trial."""
    run_dir = run.path
    if plan is not None:
        if plan.command is None:
            raise TrainfitError(f"{run_dir / 'plan.json'} chose trial {plan.trial}, for which tune wrote no command",
                                "plan again with another priority, or fill its values into your command yourself")
        assert plan.trial is not None  # _plan refuses an estimated plan
        return plan.command, "plan.json", plan.trial
    best, script_path, script = run.summary.best_config, run_dir / COMMAND_FILE, run.command_script
    if best is None or script is None:
        raise TrainfitError(f"{run_dir} holds no train_command.sh: no config fit the budget",
                            "see its summary.json's all_failed advice, then tune again")
    line, why_none = script_command(script)
    if line is None:
        raise TrainfitError(f"tune wrote no training command in {script_path}: {why_none}",
                            "fix the spec's tune.command_template and tune again")
    return line, "train_command.sh", best.trial


def capped_template(run: RunFolder, plan: Plan | None, max_steps: int, factory: bool) -> tuple[str, str, int]:
    """``--max-steps N`` on a ``command_template`` run: the template filled for the fastest config with
    ``{max_steps}`` = N (``written_command.template_for_steps``), where the template has it and a plan
    did not choose another config; its command, where it came from, and its trial."""
    way = "pass your trainer's own step limit after --" + (
        ", or add --loop to train the factory model in trainfit's loop" if factory else "")
    best = run.summary.best_config
    if plan is not None and best is not None and plan.trial != best.trial:
        raise TrainfitError(f"--max-steps fills your command_template's {{max_steps}} for the fastest config (trial "
                            f"{best.trial}), and {run.path / 'plan.json'} chose trial {plan.trial}", way)
    try:
        line, best, _ = template_for_steps(run, max_steps, use=f"--max-steps {max_steps} stops your tune.command_template "
                                                               f"after {max_steps} steps")
    except TrainfitError as err:
        raise TrainfitError(err.message, f"{err.hint}; or {way}") from None
    return line, "plan.json" if plan is not None else "train_command.sh", best.trial


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


def to_train(run_folder: Path | RunFolder, output: Path, *, extra_args: Sequence[str] = (), max_steps: int | None = None,
             loop: bool = False, winner: Winner | None = None) -> tuple[TrainRun, Plan | None]:
    """What ``run_dir`` says to train (its plan's choice, else its fastest config), as a record
    started now with the fingerprint of the data it trains on, and the plan. A spec with a
    ``tune.command_template`` trains with that command, unless ``loop`` (a factory model, in
    trainfit's loop). ``winner``: a compare config to train, the fastest way that learns as it does
    (:func:`compare_pick`)."""
    run = RunFolder.of(run_folder)
    if not run.path.is_dir():
        raise TrainfitError(f"{run.path} is not a folder", "pass the output folder of `trainfit tune`")
    summary = run.summary
    record, plan = _chosen(run, output, summary, extra_args=extra_args, max_steps=max_steps, loop=loop, winner=winner)
    return dataclasses.replace(record, data=identity(record.data_files(summary.spec))), plan


def _chosen(run: RunFolder, output: Path, summary: Summary, *, extra_args: Sequence[str], max_steps: int | None,
            loop: bool, winner: Winner | None) -> tuple[TrainRun, Plan | None]:
    """:func:`to_train`'s record, before its data's fingerprint."""
    run_dir = run.path
    plan = None if winner is not None and winner.chosen == "final" else _plan(run_dir)  # the finals: the compare's
    pick = compare_pick(run, plan, winner) if winner is not None else None
    common = functools.partial(TrainRun, run_dir=str(run_dir.resolve()), max_steps=max_steps, started_at=time.time())
    factory = summary.spec.factory is not None
    if loop and not factory:
        raise TrainfitError("--loop trains a factory model in trainfit's loop; this tune folder's model is a Hugging "
                            "Face one, trained by TRL's trainer", "drop --loop")
    if summary.command_template and not loop:
        if pick is not None:  # the template filled for the pick would be a command trainfit cannot check
            raise TrainfitError("--from-compare trains the fastest config that learns as the compare winner, and "
                                "this tune folder trains with your tune.command_template, filled for its plan's or "
                                "fastest config", "plan it (trainfit plan RUN_DIR --from-compare DIR), or add --loop "
                                "to train a factory model in trainfit's loop")
        line, source, trial = (capped_template(run, plan, max_steps, factory) if max_steps
                               else template_command(run, plan))
        return common(source=source, trial=trial, kind="command", threads=None,
                      argv=[" ".join([line, *(shlex.quote(a) for a in extra_args)])]), plan
    if factory:
        training = TrainValues.of(summary.spec.train)  # a compare winner's values over the spec's, the flags over both
        carried = plan.from_compare if plan is not None else winner
        training = (carried.values(training) if carried else training).with_flags(extra_args)
        best = summary.best_config
        if plan is None and (best is None or best.samples_per_second is None):
            raise TrainfitError(f"no config fit the budget in {run_dir}: there is nothing to train",
                                "see its summary.json's all_failed advice, then tune again")
        epochs = float(summary.epochs_for_estimate or 1)
        chosen = (plan.trial, plan.config, plan.epochs) if plan is not None else (pick.trial, pick.config, epochs) \
            if pick is not None else (best.trial, best.config, epochs)  # type: ignore[union-attr]
        assert chosen[0] is not None  # _plan refuses an estimated plan
        _one_machine_ddp(chosen[1])
        if plan is not None and plan.max_steps and not max_steps:  # an applied subset's cap, kept with the run
            common = functools.partial(common, max_steps=plan.max_steps)
        return common(source="plan.json" if plan else "compare.json" if pick else "summary.json", trial=chosen[0], kind="factory", threads=None,
                      config=dict(chosen[1]), epochs=chosen[2], evaluation=plan.evaluation if plan else None,
                      training=training.to_json()), plan
    command, source, trial = training_command(run, plan) if pick is None or winner is None else pick_command(
        run, pick, winner)

    threads, argv = split_command(command)
    _one_process(int(flags(argv).get("num_processes") or 1),
                 f"run {run_dir / 'train_command.sh'}: trl sft launches them through accelerate (--num_processes), "
                 "or plan a config of one process")
    argv = [*relocated(argv, run_dir), *extra_args, *(["--max_steps", str(max_steps)] if max_steps else []),
            "--output_dir", str(output), "--save_strategy", "no", "--disable_tqdm", "false"]
    return common(source=source, trial=trial, kind="trl_sft", threads=threads, argv=argv), plan


def compare_pick(run: RunFolder, plan: Plan | None, winner: Winner) -> Candidate | None:
    """``train --from-compare``: the fastest config the tune measured that learns as ``winner`` does,
    where there is no plan (None where the plan carries the winner: it decides); a plan that carries
    another is refused."""
    if plan is None:
        return keep_learned(load_run(run), winner).candidates[0]  # fastest first
    if plan.from_compare is not None and (plan.from_compare.compare_dir, plan.from_compare.name) == (
            winner.compare_dir, winner.name):
        return None
    carried = f"compare's {plan.from_compare.name}" if plan.from_compare else "no compare winner"
    raise TrainfitError(f"{run.path / 'plan.json'} decides what trains, and it carries {carried}, not {winner.name}",
                        f"plan it so: trainfit plan {shlex.quote(str(run.path))} --max-hours H --from-compare "
                        f"{shlex.quote(winner.compare_dir)} --config {winner.name}")


def pick_command(run: RunFolder, pick: Candidate, winner: Winner) -> tuple[str, str, int]:
    """The ``trl sft`` command of ``pick`` (tune's, or built as tune builds it) with ``winner``'s training
    values as flags after it, where it came from, and its trial."""
    loaded = load_run(run)
    command = chosen_command(loaded, rebuild(loaded), pick)
    if command is None or not is_trl_command(command):
        raise TrainfitError(f"trial {pick.trial}, the fastest config that learns as compare's {winner.name}, has no "
                            "`trl sft` command trainfit can write", "plan it: trainfit plan RUN_DIR --from-compare DIR")
    base = TrainValues.of(run.summary.spec.train)
    assert pick.trial is not None  # a measured config
    return " ".join([command, *map(shlex.quote, winner.values(base).trl_args(against=base))]), "compare.json", pick.trial


def _one_machine_ddp(config: Mapping[str, Any]) -> None:
    """A factory config of several processes trains here on one machine under DDP (:mod:`trainfit.train.ranks`);
    several machines, or FSDP's shards, are refused, saying what runs them."""
    fix = "train it with a loop of your own under torchrun (a tune.command_template), or plan a config of one machine"
    if int(config.get("nnodes", 1)) > 1:
        raise TrainfitError(f"this config trains on {config['nnodes']} machines (nnodes), and trainfit train runs "
                            "on one", fix)
    if int(config.get("nproc_per_node", 1)) > 1 and config.get("parallel") != "ddp":
        raise TrainfitError(f"this config trains on {config['nproc_per_node']} processes under "
                            f"parallel: {config.get('parallel')}, and trainfit train runs several under ddp only "
                            "(an FSDP checkpoint holds each rank's shard)", fix + ", or one of parallel: ddp")


def _one_process(processes: int, fix: str) -> None:
    """``trainfit train`` trains in one process: a config measured on several is refused, saying what runs it."""
    if processes > 1:
        raise TrainfitError(f"this config trains on {processes} processes (nproc_per_node x nnodes), and trainfit "
                            "train runs one", fix)


def resume_command(run_dir: str | Path, output: str | Path, *, max_steps: int | None = None, loop: bool = False,
                   extra_args: Sequence[str] = (), options: Sequence[str] = ()) -> str:
    """The command that continues a run in ``output``: the same tune folder and the arguments that
    decide what trains (``--max-steps``, ``--loop``, the ``trl sft`` ones after ``--``: a resume with
    others is refused), ``options`` (e.g. the run's ``--deadline``), and ``--resume``."""
    parts = ["trainfit", "train", str(run_dir), "--output", str(output),
             *(["--max-steps", str(max_steps)] if max_steps else []), *(["--loop"] if loop else []), *options,
             "--resume", *(["--", *extra_args] if extra_args else [])]
    return shlex.join(parts)


def prepare(run_folder: Path | RunFolder, output: Path, *, resume: bool, extra_args: Sequence[str] = (), max_steps: int | None = None,
            loop: bool = False, record_batches: bool = False, again: str, winner: Winner | None = None,
            say: Callable[[str], None] = print) -> tuple[TrainRun, Path | None, Plan | None]:
    """Check the input and the output folder; returns what to train, the checkpoint to resume
    from (None: from step 0) and the plan. Removes unfinished checkpoints (they cannot be resumed).
    ``again``: the command that resumes the run (:func:`resume_command`), for the errors.
    ``record_batches``: the run will record its batches, which only a ``trl sft`` run can."""
    run = RunFolder.of(run_folder)
    run_dir, output = run.path, Path(output).resolve()
    now, plan = to_train(run, output, extra_args=extra_args, max_steps=max_steps, loop=loop, winner=winner)
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
            refuse_changed(now.data_files(run.summary.spec), output, readable=now.data is not None)
    else:
        if record_path.exists() or any(output.glob("checkpoint-*")):
            raise TrainfitError(f"{output} already holds a run (train.json or checkpoints)",
                                f"continue it: {again}; or pick a new --output")
        if now.kind == "trl_sft":
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
        say(f"trainfit: warning: {run_dir / 'plan.json'} does not fit its window (ETA {dur(plan.eta.total_s)} "
            f"against {dur(plan.window_s)}): --deadline stops the run with a checkpoint before the window ends, "
            f"or plan again and take one of its options (trainfit plan {shlex.quote(str(run_dir))} ...)")
    return record, checkpoint, plan


def _recorded(run_dir: Path, output: Path, now: TrainRun, say: Callable[[str], None]) -> TrainRun:
    """The record of the run ``output`` holds, training into ``output``; where its ``train.json``
    is damaged or gone but a complete checkpoint is there, rebuilt (:mod:`trainfit.train.rebuild`)
    as ``now``, what the resume command trains."""
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

