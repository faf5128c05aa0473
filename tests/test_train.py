"""``trainfit train``: checkpoint folders a crash cannot spoil, the stop rules, and (integration)
real `trl sft` runs of a tuned tiny Llama killed with SIGKILL or SIGTERM and resumed, which end
with the very parameters of a run that was never interrupted."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, TINY_LLAMA, make_spec_file, tune_one_lora_config, write_frames, write_texts

from trainfit.cli import main
from trainfit.errors import TrainfitError
from trainfit.train.callbacks import Interval, deadline_near
from trainfit.train.checkpoints import (
    MARK,
    checkpoints,
    incomplete,
    is_complete,
    latest_complete,
    mark_complete,
    rotate,
)
from trainfit.train.prepare import differences
from trainfit.train.sft import split_command
from trainfit.trainer.command import flags


def fake_checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "optimizer.pt").write_bytes(b"x" * 100)
    if complete:
        mark_complete(folder)
    return folder


def test_only_a_checkpoint_whose_save_finished_counts(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 10)
    fake_checkpoint(tmp_path, 12, complete=False)  # a save cut short: files, no mark
    (tmp_path / "checkpoint-notastep").mkdir()
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-10", "checkpoint-12"]
    assert latest_complete(tmp_path) == tmp_path / "checkpoint-10"  # by step, not by name: 10 > 2
    assert [p.name for p in incomplete(tmp_path)] == ["checkpoint-12"]
    # A mark copied with its folder to another step's name does not make that one complete.
    shutil.copytree(tmp_path / "checkpoint-10", tmp_path / "checkpoint-11")
    assert not is_complete(tmp_path / "checkpoint-11")
    (tmp_path / "checkpoint-2" / MARK).write_text("{not json")
    assert not is_complete(tmp_path / "checkpoint-2")


def test_rotation_keeps_the_newest_complete_ones_and_never_the_last_one_only_half_saved(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 4, complete=False)  # being saved now
    removed = rotate(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["checkpoint-1"]
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]
    mark_complete(tmp_path / "checkpoint-4")
    rotate(tmp_path, keep=1)
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-4"]


def test_train_control_saves_on_its_interval_at_the_end_and_before_a_deadline(tmp_path: Path) -> None:
    """The control's decisions at a step's end, as the trainer calls it (plain objects for its state)."""
    from types import SimpleNamespace

    from trainfit.train.callbacks import RunLog, TrainControl

    def step_end(control: TrainControl, step: int, max_steps: int = 10) -> SimpleNamespace:
        flags = SimpleNamespace(should_save=False, should_training_stop=False)
        control.on_step_end(None, SimpleNamespace(global_step=step, max_steps=max_steps), flags)
        return flags

    log = RunLog(tmp_path / "log.jsonl")
    begin = SimpleNamespace(global_step=0, max_steps=10)
    hourly = TrainControl(every_s=3600, keep=2, log=log, started_at=time.time(), say=lambda line: None)
    hourly.on_train_begin(None, begin, None)
    assert not step_end(hourly, 1).should_save  # an hour has not passed
    assert step_end(hourly, 10).should_save     # the last step saves
    hourly.signal = "SIGTERM"
    last = step_end(hourly, 10)
    assert last.should_save and not last.should_training_stop and hourly.stopped is None  # ends as finished
    # A deadline 50 s away: one step is quick, but the plan says a save takes a minute: stop now, saving.
    late = TrainControl(every_s=3600, keep=2, log=log, started_at=time.time(), deadline=time.time() + 50,
                        save_s=60.0, say=lambda line: None)
    late.on_train_begin(None, begin, None)
    stop = step_end(late, 1)
    assert stop.should_save and stop.should_training_stop and late.stopped == "deadline"


def test_the_stop_rules() -> None:
    interval = Interval(every_s=60.0, last=100.0)
    assert not interval.due(159.9) and interval.due(160.0)
    # 10 s steps and a 5 s save: at 985 s one more step and a save end at 1000 s, the deadline.
    assert not deadline_near(984.0, 1000.0, step_s=10.0, save_s=5.0)
    assert deadline_near(985.0, 1000.0, step_s=10.0, save_s=5.0)


def test_the_written_command_splits_into_threads_and_trl_arguments() -> None:
    threads, argv = split_command("OMP_NUM_THREADS=2 trl sft --model_name_or_path '/a b/model' --lora_r 8 --bf16 false")
    assert threads == 2 and argv == ["--model_name_or_path", "/a b/model", "--lora_r", "8", "--bf16", "false"]
    assert split_command("trl sft --lora_r 8")[0] is None
    assert flags(["--lora_r", "8", "--use_peft", "--lora_r", "16"]) == {"lora_r": "16", "use_peft": ""}
    assert differences(flags(["--lora_r", "8", "--max_steps", "5"]), flags(["--lora_r", "8", "--max_steps", "6",
                                                                             "--seed", "1"])) \
        == ["max_steps: 5 -> 6", "seed: (unset) -> 1"]


def test_the_data_order_is_a_reproducible_shuffle_per_epoch_that_resumes_mid_way(tmp_path: Path) -> None:
    from trainfit.data.order import epoch_rows

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(100)))

    def ids(**kw: int) -> list[int]:
        return [r["id"] for r in epoch_rows(str(data), seed=1, buffer=16, **kw)]

    first = ids(epoch=0)
    assert sorted(first) == list(range(100)) and first != list(range(100))  # each sample once, shuffled
    assert ids(epoch=0) == first and ids(epoch=1) != first  # the same order again; another each epoch
    assert ids(epoch=0, skip=37) == first[37:]  # a resume reads on: nothing repeated or skipped
    data.write_text(data.read_text() + "{broken\n")
    with pytest.raises(TrainfitError, match="line 101"):
        ids(epoch=0)


def test_steps_split_epochs_as_the_loop_runs_them() -> None:
    from trainfit.train.loading import steps_of
    from trainfit.train.loop import plan_steps

    assert plan_steps(60, 4, 1.0, None) == (15, 15)
    assert plan_steps(61, 4, 2.5, None) == (16, 40) and plan_steps(61, 4, 2.5, 7) == (16, 7)
    steps = list(steps_of(iter(range(11)), batch_size=2, accumulation=2))
    assert steps == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10]]]  # the epoch's last step is partial


# --- real runs -------------------------------------------------------------------------------------------

STEPS = 40
RUN_ARGS = ["--checkpoint-minutes", "0.00001", "--", "--max_steps", str(STEPS)]  # a save at every step's end


@pytest.mark.integration
def test_trl_sft_as_train_runs_it_pads_each_batch_to_the_multiple(tmp_path: Path) -> None:
    """The written command's `--pad_to_multiple_of` reaches the collator `trainfit train` trains
    with (TRL's trainer, built from the command as `trl sft` builds it): every batch of an epoch
    of long-tailed texts is a multiple of 24 long, some past the 64 the samples are truncated at."""
    from trainfit.spec import load_spec
    from trainfit.train.sft import build_trainer
    from trainfit.trainer.command import trl_command, trl_data_config
    from trainfit.workloads.hf import save_initial_model

    data = tmp_path / "train.jsonl"
    write_texts(data, n=24)
    path = make_spec_file(tmp_path, model={"config": {**TINY_LLAMA, "vocab_size": 2000}},
                          data={"path": str(data), "text_field": "text"},
                          params={"max_length": 64, "batch_size": 4, "pad_to_multiple_of": 24})
    path.write_text(path.read_text() + f"tokenizer: {EXAMPLES / 'data' / 'tokenizer.json'}\n")
    spec = load_spec(path)
    assert save_initial_model(spec.model, spec.tokenizer, tmp_path / "model", seed=0)
    (tmp_path / "trl_data.yaml").write_text(yaml.safe_dump(trl_data_config(spec)))
    words = trl_command(spec, spec.params, max_length=64, data_config=tmp_path / "trl_data.yaml", cpu_threads=1,
                        model_dir=tmp_path / "model")
    trainer = build_trainer([*words[words.index("sft") + 1:], "--output_dir", str(tmp_path / "run"),
                             "--report_to", "none"], callbacks=[])
    batches = list(trainer.get_train_dataloader())
    lengths = [int(b["input_ids"].shape[1]) for b in batches]
    assert len(batches) == 6 and all(n % 24 == 0 for n in lengths) and 72 in lengths, lengths
    real = [int(b["attention_mask"].sum(dim=1).max()) for b in batches]
    assert all(n - 24 < longest <= n for n, longest in zip(lengths, real, strict=True)), (lengths, real)


@pytest.fixture(scope="module")
def tune_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tune of one LoRA config of a tiny Llama (its model saved, with the bundled tokenizer,
    so the written `trl sft` command trains it)."""
    pytest.importorskip("trl")
    return tune_one_lora_config(tmp_path_factory.mktemp("train"), samples=200)


def trainfit(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "trainfit", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def finished(proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def weights(folder: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


def assert_same_weights(a: Path, b: Path) -> None:
    import torch

    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and wa
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name  # bitwise: the CPU run is deterministic


@pytest.fixture(scope="module")
def uninterrupted(tune_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "run"
    rc, text = finished(trainfit(str(tune_dir), "--output", str(out), *RUN_ARGS))
    assert rc == 0, text
    return out


def wait_for_checkpoint(out: Path, at_least: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        done = latest_complete(out) if out.is_dir() else None
        if done is not None and int(done.name.split("-")[1]) >= at_least:
            return
        assert proc.poll() is None, "the run ended before it could be interrupted: " + (proc.stdout.read() if proc.stdout else "")
        time.sleep(0.02)
    raise AssertionError("no checkpoint in time")


@pytest.mark.integration
@pytest.mark.slow  # 30 s: two runs; test_train_faults resumes interrupted runs in the default suite
def test_a_run_killed_with_sigkill_resumes_to_the_parameters_of_an_uninterrupted_one(
        tune_dir: Path, uninterrupted: Path, tmp_path: Path, capsys) -> None:
    result = json.loads((uninterrupted / "train_result.json").read_text())
    assert result["status"] == "finished" and result["step"] == STEPS
    log = [json.loads(line) for line in (uninterrupted / "train_log.jsonl").read_text().splitlines()]
    saved = [e["step"] for e in log if e["event"] == "checkpoint"]
    assert saved == list(range(1, STEPS + 1))  # on the interval (here: each step), and at the end
    assert len(checkpoints(uninterrupted)) == 2  # --keep 2

    out = tmp_path / "run"
    proc = trainfit(str(tune_dir), "--output", str(out), *RUN_ARGS)
    wait_for_checkpoint(out, 3, proc)
    proc.kill()  # SIGKILL: no handler runs, no save
    proc.wait()
    last = latest_complete(out)
    assert last is not None and int(last.name.split("-")[1]) < STEPS
    # A crash during a later save: that checkpoint's files are there, half written, with no mark.
    half = out / f"checkpoint-{int(last.name.split('-')[1]) + 1}"
    shutil.rmtree(half, ignore_errors=True)  # the kill may have cut this very save short already
    shutil.copytree(last, half)
    (half / MARK).unlink()
    (half / "optimizer.pt").write_bytes(b"truncated")

    assert main(["train", str(tune_dir), "--output", str(out), *RUN_ARGS]) == 2  # checked before anything loads
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err  # not silently restarted
    rc, text = finished(trainfit(str(tune_dir), "--output", str(out), "--resume", *RUN_ARGS))
    assert rc == 0, text
    assert f"removing {half.name}: its save did not finish" in text
    resumed = json.loads((out / "train_result.json").read_text())
    assert resumed["resumed_from"] == last.name and resumed["step"] == STEPS
    assert_same_weights(out, uninterrupted)


@pytest.mark.integration
def test_a_copied_tune_folder_trains_its_own_files_a_finished_run_is_not_trained_again_and_changed_data_refused(
        tune_dir: Path, tmp_path: Path, capsys) -> None:
    copy = tmp_path / "tune"
    shutil.copytree(tune_dir, copy)
    data = tmp_path / "train.jsonl"  # the copy's own data (its data config names it), to change
    trained = copy / "trl_data.yaml"
    shutil.copy(yaml.safe_load(trained.read_text())["datasets"][0]["data_files"], data)
    trained.write_text(trained.read_text().replace(str(tune_dir.parent / "train.jsonl"), str(data)))
    out, args = tmp_path / "run", ["--max-steps", "2"]
    # Arguments `trl sft` refuses, or a batch record that cannot be written, are refused before a run is
    # recorded: the corrected command starts afresh in the same --output.
    assert main(["train", str(copy), "--output", str(out), *args, "--", "--bogus_flag", "1"]) == 2
    assert "`trl sft` refused the arguments" in capsys.readouterr().err
    assert main(["train", str(copy), "--output", str(out), *args, "--record-batches", str(tmp_path)]) == 2
    assert f"--record-batches cannot write there: {tmp_path} is a folder" in capsys.readouterr().err
    assert not out.exists()
    # A deadline already passing stops the run after its first step, with a checkpoint.
    assert main(["train", str(copy), "--output", str(out), *args, "--deadline", "0.00001"]) == 3
    capsys.readouterr()
    # The copy's command named the folder tune wrote it in: what trains is the copy's model and data config.
    argv = json.loads((out / "train.json").read_text())["argv"]
    assert f"{tune_dir}/trl_data.yaml" in (copy / "train_command.sh").read_text()
    assert argv[argv.index("--config") + 1] == str(copy.resolve() / "trl_data.yaml")
    assert argv[argv.index("--model_name_or_path") + 1] == str(copy.resolve() / "model")

    def files() -> dict[str, int]:
        return {str(f.relative_to(out)): f.stat().st_mtime_ns for f in out.rglob("*") if f.name != ".lock"}

    # The data it trains on changed: the resume is refused, and nothing is touched.
    before, original = files(), data.read_text()
    data.write_text(original + original.splitlines(keepends=True)[0])
    assert main(["train", str(copy), "--output", str(out), "--resume", *args]) == 2
    err = capsys.readouterr().err
    assert f"the data the run in {out} trains on ({data}) changed since it started (its size or content differ)" in err
    assert "put the data back as it was and resume" in err and files() == before
    data.write_text(original)
    # A plan made after the run started changes what the folder trains: the refusal says so, and how to resume.
    assert main(["plan", str(copy), "--max-hours", "1"]) == 0
    capsys.readouterr()
    assert main(["train", str(copy), "--output", str(out), "--resume", *args]) == 2
    err = capsys.readouterr().err
    assert f"{copy / 'plan.json'} was written after this run started (from train_command.sh)" in err
    assert "move plan.json aside" in err
    (copy / "plan.json").unlink()
    assert main(["train", str(copy), "--output", str(out), "--resume", *args]) == 0  # the same data and command
    assert json.loads((out / "train_result.json").read_text())["step"] == 2
    capsys.readouterr()
    # A resume of the finished run trains nothing and leaves every file as it was.
    before = files()
    assert main(["train", str(copy), "--output", str(out), "--resume", *args]) == 0
    assert "finished at step 2 of 2: nothing to resume" in capsys.readouterr().err
    assert files() == before


@pytest.mark.integration
@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_a_resume_past_a_rotten_one_ends_where_an_uninterrupted_run_does(
        tune_dir: Path, uninterrupted: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    proc = trainfit(str(tune_dir), "--output", str(out), *RUN_ARGS)
    wait_for_checkpoint(out, 2, proc)
    proc.send_signal(signal.SIGTERM)
    rc, text = finished(proc)
    assert rc == 143, text
    stopped = json.loads((out / "train_result.json").read_text())
    assert stopped["status"] == "stopped" and stopped["stopped_by"] == "SIGTERM" and stopped["step"] < STEPS
    assert latest_complete(out) == out / f"checkpoint-{stopped['step']}"  # saved as it stopped: nothing lost
    assert "--resume" in text

    assert main(["train", str(tune_dir), "--output", str(out), "--resume", "--checkpoint-minutes", "0.00001",
                 "--", "--max_steps", str(STEPS + 1)]) == 2
    assert f"--max_steps: {STEPS} -> {STEPS + 1}" in capsys.readouterr().err  # refused, naming what differs
    # The newest checkpoint rots on disk after its save was marked: a clear error, then the one before it.
    newest = latest_complete(out)
    assert newest is not None and len(checkpoints(out)) == 2
    sound = shutil.copytree(newest, tmp_path / "sound")
    # Each file the Trainer loads: the optimizer's as it starts, the RNG states' at the resumed epoch's first batch.
    for rotten in ("optimizer.pt", "rng_state.pth"):
        shutil.rmtree(newest)
        shutil.copytree(sound, newest)
        assert (newest / rotten).is_file()
        (newest / rotten).write_bytes((newest / rotten).read_bytes()[:50])
        rc, text = finished(trainfit(str(tune_dir), "--output", str(out), "--resume", *RUN_ARGS))
        assert rc == 2 and f"could not resume from {newest}" in text and f"rm -r {newest}" in text, (rotten, text)
        assert "Traceback" not in text
    shutil.rmtree(newest)
    rc, text = finished(trainfit(str(tune_dir), "--output", str(out), "--resume", *RUN_ARGS))
    assert rc == 0, text
    assert_same_weights(out, uninterrupted)


@pytest.mark.integration
def test_a_planned_run_follows_the_plan_reports_on_track_and_stops_at_its_deadline(
        tune_dir: Path, tmp_path: Path, capsys) -> None:
    plan_dir = tmp_path / "planned"
    shutil.copytree(tune_dir, plan_dir)
    eval_data = tmp_path / "eval.jsonl"
    write_texts(eval_data, n=12, seed=1)
    assert main(["plan", str(plan_dir), "--max-hours", "10", "--epochs", "1", "--eval-data", str(eval_data),
                 "--eval-every", "20"]) == 0
    capsys.readouterr()
    out = tmp_path / "run"
    assert main(["train", str(plan_dir), "--output", str(out), "--monitor-seconds", "0.01"]) == 0
    captured = capsys.readouterr()
    run = json.loads((out / "train.json").read_text())
    plan = json.loads((plan_dir / "plan.json").read_text())
    assert run["source"] == "plan.json" and run["trial"] == plan["trial"]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    evaluated = [e["step"] for e in log if e["event"] == "log" and "eval_loss" in e]
    assert evaluated == [20, 40, 50] and plan["eta"]["evals"] == 3  # the plan priced the passes TRL's trainer ran
    assert "on track" in captured.err or "slower than planned" in captured.err
    # Each log line holds the process's peak so far (a CPU's: its RSS; Linux sums it from per-CPU counters,
    # so it may read a few pages lower later); the end holds it beside the probe's for the trained config.
    peaks = [e["peak_rss_bytes"] for e in log if e["event"] == "log"]
    assert len(peaks) >= 3 and peaks[0] > 100 * 2**20
    assert all(later > earlier - 2**20 for earlier, later in zip(peaks, peaks[1:]))
    actual = json.loads((plan_dir / "actual.json").read_text())
    summary = json.loads((plan_dir / "summary.json").read_text())
    probed = next(e for e in [summary["best_config"], *summary["runners_up"]] if e["trial"] == run["trial"])
    assert actual["probe_peak_memory_bytes"] == round(probed["memory_peak_gb"] * 2**30)
    assert actual["peak_memory_bytes"] > peaks[-1] - 2**20
    said = f"peak memory {actual['peak_memory_bytes'] / 2**30:.3g} GiB, the probe's {probed['memory_peak_gb']:.3g} GiB"
    assert said in captured.err
    # A later plan of this folder learns the run's pace and start-up from it (issue 49), and says so.
    assert actual["trial"] == run["trial"] and actual["step_s"] > 0 and actual["startup_s"] > 0
    assert actual["planned_step_s"] == plan["model_step_s"]  # held against the step its plan expected
    learn = tmp_path / "learn"
    shutil.copytree(plan_dir, learn)
    assert main(["plan", str(learn), "--max-hours", "10", "--epochs", "1"]) == 0
    capsys.readouterr()
    learned = json.loads((learn / "plan.json").read_text())
    assert any(line.startswith(f"learned from the run before ({learn / 'actual.json'}): its {actual['step']:,} steps")
               for line in learned["rests_on"]), learned["rests_on"]
    assert learned["eta"]["startup_s"] == pytest.approx(actual["startup_s"])
    assert learned["eta"]["step_time_s"] == pytest.approx(max(actual["step_s"], learned["model_step_s"]))
    # A resumed run's start-up is a resume's, and a damaged file teaches nothing: neither is learned from.
    for written in (json.dumps({**actual, "resumed_from": "checkpoint-1"}), "{not json"):
        (learn / "actual.json").write_text(written)
        assert main(["plan", str(learn), "--max-hours", "10", "--epochs", "1"]) == 0
        capsys.readouterr()
        again = json.loads((learn / "plan.json").read_text())
        assert again["eta"]["startup_s"] is None and not any("learned" in line for line in again["rests_on"])
    assert actual["status"] == "finished" and actual["planned_s"] == plan["eta"]["total_s"] and actual["resume"] is None
    assert actual["elapsed_s"] > 0 and json.loads((plan_dir / "on_track.json").read_text())["step"] == actual["step"]

    # A deadline already passing: the run stops at its first step, with a checkpoint, status 3.
    late = tmp_path / "late"
    (plan_dir / "actual.json").unlink()
    assert main(["train", str(plan_dir), "--output", str(late), "--max-steps", "30", "--deadline", "0.00001"]) == 3
    stopped = json.loads((late / "train_result.json").read_text())
    assert stopped["stopped_by"] == "deadline" and stopped["step"] == 1
    assert latest_complete(late) == late / "checkpoint-1"
    # The command it prints to continue carries what decides the run (--max-steps), not the deadline it passed.
    [again] = [line.split("continue: ", 1)[1] for line in capsys.readouterr().out.splitlines() if "continue: " in line]
    assert stopped["resume"] == again and "--max-steps 30" in again and "--deadline" not in again
    # Resumed with that spent deadline, it would train one step and stop again: refused, naming the way on.
    spent = ["train", str(plan_dir), "--output", str(late), "--max-steps", "30", "--deadline", "0.00001", "--resume"]
    assert main(spent) == 2
    assert "passed" in (err := capsys.readouterr().err) and again in err and "Traceback" not in err
    assert json.loads((late / "train_result.json").read_text()) == stopped  # nothing touched
    assert main(shlex.split(again)[1:]) == 0  # past the window, to its end
    resumed = json.loads((late / "train_result.json").read_text())
    assert resumed["resumed_from"] == "checkpoint-1" and resumed["step"] == 30
    # A 30-step run that finishes is not the plan's 50 steps: the plan's actual.json is not written for it.
    assert main(["train", str(plan_dir), "--output", str(tmp_path / "short"), "--max-steps", "30"]) == 0
    assert not (plan_dir / "actual.json").exists()
    # A plan that does not fit its window is trained with a warning and the ways on.
    three_steps_h = 3 * plan["eta"]["step_time_s"] / 3600  # longer than a step (else refused), not the run
    assert main(["plan", str(plan_dir), "--max-hours", f"{three_steps_h:.8f}", "--margin-minutes", "0",
                 "--epochs", "1"]) == 1
    capsys.readouterr()
    assert main(["train", str(plan_dir), "--output", str(tmp_path / "over"), "--deadline", "0.00001"]) == 3
    assert "plan.json does not fit its window" in capsys.readouterr().err


@pytest.fixture(scope="module")
def factory_tune(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tune of a custom factory model whose rows are real numbers in a JSONL file."""
    root = tmp_path_factory.mktemp("factory")
    data = write_frames(root / "frames.jsonl", 60)
    spec = make_spec_file(root, model={"factory": f"{Path(__file__).parent / 'factories.py'}:learnable"},
                          data={"path": str(data), "length_field": "n"},
                          params={"batch_size": 2, "gradient_accumulation_steps": 2, "max_length": 16, "width_mul": 2,
                                  "sleep_s": 0.02})
    spec.write_text(spec.read_text() + "search:\n  batch_size: [2]\ntune:\n  epochs: 3\n")
    out = root / "tune"
    assert main(["tune", str(spec), "--output", str(out), "--strategy", "grid"]) == 0
    return out


@pytest.mark.integration
@pytest.mark.slow
def test_a_factory_model_trains_on_its_rows_and_resumes_after_sigkill_to_the_same_weights(
        factory_tune: Path, tmp_path: Path, capsys) -> None:
    import torch

    # Planned with an eval set (its pass timed forward-only on the factory model), evaluated every 15 steps.
    planned = tmp_path / "planned"
    shutil.copytree(factory_tune, planned)
    eval_data = tmp_path / "eval.jsonl"
    eval_data.write_text("".join((factory_tune.parent / "frames.jsonl").read_text().splitlines(keepends=True)[:10]))
    assert main(["plan", str(planned), "--max-hours", "1", "--eval-data", str(eval_data), "--eval-every", "15"]) == 0
    assert json.loads((planned / "plan.json").read_text())["evaluation"]["pass_s"] > 0
    args = ["--checkpoint-minutes", "0.00001", "--max-steps", "40"]  # 40 steps: 2+ epochs of 15 steps
    whole = tmp_path / "whole"
    rc, text = finished(trainfit(str(planned), "--output", str(whole), *args))
    assert rc == 0, text
    assert json.loads((whole / "train.json").read_text())["kind"] == "factory"
    assert ", loss " in text.split("training", 1)[-1]  # the console's progress shows the last logged loss too
    log = [json.loads(line) for line in (whole / "train_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if e["event"] == "log" and "loss" in e] == [10, 20, 30, 40]
    assert all(math.isfinite(e["loss"]) for e in log if e["event"] == "log" and "loss" in e)
    evaluated = [e for e in log if e["event"] == "log" and "eval_loss" in e]
    assert [e["step"] for e in evaluated] == [15, 30, 40] and all(math.isfinite(e["eval_loss"]) for e in evaluated)

    out = tmp_path / "run"
    proc = trainfit(str(planned), "--output", str(out), *args)
    wait_for_checkpoint(out, 17, proc)  # into the second epoch
    proc.kill()
    proc.wait()
    rc, text = finished(trainfit(str(planned), "--output", str(out), "--resume", *args))
    assert rc == 0, text
    resumed_from = json.loads((out / "train_result.json").read_text())["resumed_from"]
    assert resumed_from is not None and 17 <= int(resumed_from.split("-")[1]) < 40  # past the first epoch's 15
    a, b = torch.load(whole / "model.pt"), torch.load(out / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert main(["train", str(factory_tune), "--output", str(tmp_path / "x"), "--", "--max_steps", "3"]) == 2
    assert "factory model" in capsys.readouterr().err
    assert main(["train", str(factory_tune), "--output", str(tmp_path / "y"), "--record-batches", "b.txt"]) == 2
    assert "--record-batches records the batches of a `trl sft` run; this run is a factory" in capsys.readouterr().err
    assert not (tmp_path / "y" / "train.json").exists()  # refused before any run was recorded: leaving it out works


@pytest.mark.integration
@pytest.mark.slow
def test_a_factory_run_of_an_applied_subset_trains_to_its_cap_and_keeps_it(factory_tune: Path, tmp_path: Path,
                                                                           capsys) -> None:
    """``plan --apply`` of a subset: a factory model trains in trainfit's loop, which reads no command,
    so the cap reaches it through the plan and is kept in train.json, where a resume checks it."""
    planned = tmp_path / "planned"
    shutil.copytree(factory_tune, planned)
    assert main(["plan", str(planned), "--max-hours", "10", "--epochs", "3"]) == 0
    whole = json.loads((planned / "plan.json").read_text())
    window = ["--max-hours", f"{whole['eta']['high_s'] * 0.75 / 3600:.8f}", "--margin-minutes", "0", "--epochs", "3"]
    assert main(["plan", str(planned), *window]) == 1
    options = json.loads((planned / "plan.json").read_text())["options"]
    subset = next(i for i, o in enumerate(options, 1) if o["kind"] == "subset")
    assert main(["plan", str(planned), *window, "--apply", str(subset)]) == 0
    plan = json.loads((planned / "plan.json").read_text())
    assert plan["max_steps"] and plan["max_steps"] < whole["eta"]["steps"]
    capsys.readouterr()
    out = tmp_path / "run"
    assert main(["train", str(planned), "--output", str(out)]) == 0
    assert json.loads((out / "train.json").read_text())["max_steps"] == plan["max_steps"]
    result = json.loads((out / "train_result.json").read_text())
    assert result["status"] == "finished" and result["step"] == result["max_steps"] == plan["max_steps"]
    assert json.loads((planned / "actual.json").read_text())["step"] == plan["max_steps"]  # the plan's own run


FAKE_TRAINER = """\
import json, os, pathlib, sys
import trainfit
callback = trainfit.OnTrackCallback.from_environment()
pathlib.Path(os.environ["TRAINFIT_OUTPUT"], "checkpoint-5").mkdir(exist_ok=True)  # the trainer's own
seen = {k: v for k, v in os.environ.items() if k.startswith("TRAINFIT_")}
out = pathlib.Path(os.environ["TRAINFIT_OUTPUT"], "fake.json")
json.dump({"argv": sys.argv[1:], "env": seen, "callback": callback is not None, "cwd": os.getcwd()}, out.open("w"))
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""


@pytest.mark.integration
@pytest.mark.slow
def test_a_command_template_runs_as_a_child_told_the_plan_output_and_resume(
        factory_tune: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = tmp_path / "fake_trainer.py"
    trainer.write_text(FAKE_TRAINER)
    spec = factory_tune.parent / "spec.yaml"
    templated = tmp_path / "templated.yaml"
    templated.write_text(spec.read_text() + f"  command_template: {sys.executable} {trainer} --bs {{batch_size}}\n")
    run_dir = tmp_path / "tune"
    assert main(["tune", str(templated), "--output", str(run_dir), "--strategy", "grid"]) == 0
    assert main(["plan", str(run_dir), "--max-hours", "1"]) == 0
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    assert main(["train", str(run_dir), "--output", str(out), "--deadline", "2", "--", "--epochs", "3"]) == 0
    seen = json.loads((out / "fake.json").read_text())
    assert seen["cwd"] == str(tmp_path)  # where trainfit ran: the template's relative paths hold
    assert seen["argv"] == ["--bs", "2", "--epochs", "3"]  # the filled template, then the arguments after --
    env = seen["env"]
    assert env["TRAINFIT_PLAN"] == str((run_dir / "plan.json").resolve()) and env["TRAINFIT_RESUME"] == "0"
    assert env["TRAINFIT_OUTPUT"] == str(out.resolve()) and float(env["TRAINFIT_DEADLINE"]) > time.time()
    assert seen["callback"]  # the monitor found its plan in the environment
    assert json.loads((out / "train.json").read_text())["kind"] == "command"
    assert json.loads((run_dir / "actual.json").read_text())["status"] == "finished"
    assert main(["train", str(run_dir), "--output", str(out), "--resume", "--", "--epochs", "3"]) == 0
    assert json.loads((out / "fake.json").read_text())["env"]["TRAINFIT_RESUME"] == "1"
    assert (out / "checkpoint-5").is_dir()  # a resume leaves your trainer's checkpoints alone
    capsys.readouterr()
    monkeypatch.setenv("FAKE_EXIT", "3")
    assert main(["train", str(run_dir), "--output", str(tmp_path / "failed")]) == 2
    assert "your training command exited with 3" in capsys.readouterr().err
    # --loop: the factory model in trainfit's loop after all.
    assert main(["train", str(run_dir), "--output", str(tmp_path / "loop"), "--loop", "--max-steps", "2"]) == 0
    assert json.loads((tmp_path / "loop" / "train.json").read_text())["kind"] == "factory"


@pytest.mark.integration
def test_a_tune_folder_without_its_command_is_refused_leaving_no_output_behind(
        tune_dir: Path, tmp_path: Path, capsys) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tune_dir / "summary.json", bare)
    out = tmp_path / "out"
    assert main(["train", str(bare), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds no train_command.sh" in err and "bash" not in err  # not told to run the file it lacks
    assert not out.exists()  # the folder made for the run is gone with it


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert main(["train", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["train", str(tmp_path)]) == 2
    assert "holds no summary.json" in capsys.readouterr().err
    assert main(["train", str(tmp_path), "--output", str(tmp_path / "o"), "--resume"]) == 2
    assert "holds no summary.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # only train passes arguments on
        main(["probe", "x.yaml", "--", "--max_steps", "1"])
    assert "takes no arguments after --" in capsys.readouterr().err


def test_a_loss_that_is_not_finite_stops_the_run_without_saving_the_step(tmp_path: Path) -> None:
    """A factory model whose loss turns NaN at its 6th step, in trainfit's loop with a save due at every
    step: the run stops at that step, keeps the checkpoints before it and saves neither the step nor
    the model (training on would train nothing)."""
    from trainfit.spec import load_spec
    from trainfit.train.callbacks import RunLog, TrainControl
    from trainfit.train.checkpoints import latest_complete
    from trainfit.train.loop import run_loop

    data = write_frames(tmp_path / "frames.jsonl", 40)
    spec = load_spec(make_spec_file(tmp_path, model={"factory": f"{Path(__file__).parent / 'factories.py'}:learnable"},
                                    data={"path": str(data), "length_field": "n"},
                                    params={"batch_size": 2, "max_length": 16, "width_mul": 1, "nan_after": 5}))
    said: list[str] = []
    control = TrainControl(every_s=0.0, keep=10, log=RunLog(tmp_path / "log.jsonl"), started_at=time.time(),
                           say=said.append)
    out = tmp_path / "out"
    out.mkdir()
    steps, total = run_loop(spec, spec.params, samples=40, epochs=1, max_steps=None, output=out, checkpoint=None,
                            callbacks=[control], say=said.append)
    assert control.stopped == "diverged" and steps == 6 and total == 20
    assert latest_complete(out).name == "checkpoint-5" and not (out / "checkpoint-6").exists()
    assert not (out / "model.pt").exists()
    assert any("the loss is not finite (nan) at step 6" in line for line in said)
    stop = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines() if '"stop"' in line]
    assert [(e["step"], e["reason"]) for e in stop] == [(6, "diverged")]


@pytest.mark.integration
def test_a_hugging_face_run_whose_loss_turns_nan_keeps_only_the_checkpoints_before_it(tmp_path: Path) -> None:
    """A real Trainer with trainfit's control saving at every step and logging every 10: the weights
    turn NaN before step 3. The control has the loss logged before each save, so step 3's NaN stops
    the run without its save: checkpoints 1 and 2 stay, none holds NaN weights, the run is `diverged`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from trainfit.train.callbacks import RunLog, TrainControl

    class Poison(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
            if state.global_step == 2:  # before step 3 runs: its loss is NaN
                with torch.no_grad():
                    next(model.parameters()).fill_(float("nan"))

    cfg = dict(TINY_LLAMA)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    ids = torch.randint(0, 256, (32, 16))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=8,
                             report_to="none", save_strategy="no", use_cpu=True, logging_steps=10,
                             logging_nan_inf_filter=False)  # as trainfit's trl trainer logs (train/sft.py)
    control = TrainControl(every_s=0.0, keep=10, log=RunLog(tmp_path / "log.jsonl"), started_at=time.time(),
                           say=lambda line: None)
    data = [{"input_ids": row, "labels": row} for row in ids]
    Trainer(model=model, args=args, train_dataset=data, callbacks=[control, Poison()]).train()
    assert control.stopped == "diverged"
    saved = sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*"))
    assert saved == ["checkpoint-1", "checkpoint-2"]
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "out" / "checkpoint-2" / "model.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())
