"""``trainfit train`` under the faults a user meets (issue #35): a run folder moved or copied and
resumed, state files of valid JSON but the wrong types, a damaged ``train.json``, ``--max-steps``
past one epoch, a second Ctrl-C, a Ctrl-C while the run starts up, a second run into a running one's
folder. Real tiny models, real files, the real CLI."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_spec_file, tune_one_lora_config, write_frames

from trainfit.cli import main
from trainfit.files import lock_folder
from trainfit.train.checkpoints import MARK, checkpoints, is_complete, latest_complete


@pytest.fixture(scope="module")
def tune_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tune of one LoRA config of a tiny Llama whose written `trl sft` command trains it:
    12 texts, 3 steps an epoch at 2 x 2 samples a step."""
    pytest.importorskip("trl")
    return tune_one_lora_config(tmp_path_factory.mktemp("trl"), samples=12)


@pytest.fixture(scope="module")
def factory_tune(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tune of a factory model over 12 rows: 3 steps an epoch at 2 x 2 samples a step, each
    micro-batch 0.1 s longer (``sleep_s``: room to send a signal mid-step)."""
    root = tmp_path_factory.mktemp("factory")
    data = write_frames(root / "frames.jsonl", 12)
    spec = make_spec_file(root, model={"factory": f"{Path(__file__).parent / 'factories.py'}:learnable"},
                          data={"path": str(data), "length_field": "n"},
                          params={"batch_size": 2, "gradient_accumulation_steps": 2, "max_length": 16,
                                  "width_mul": 2, "sleep_s": 0.1})
    spec.write_text(spec.read_text() + "search:\n  batch_size: [2]\n")
    out = root / "tune"
    assert main(["tune", str(spec), "--output", str(out), "--strategy", "grid"]) == 0
    return out


def files(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` (but its lock) and when it was last written."""
    return {str(f.relative_to(folder)): f.stat().st_mtime_ns for f in folder.rglob("*")
            if f.is_file() and f.name != ".lock"}


def saved_steps(out: Path) -> list[int]:
    return [int(p.name.split("-")[1]) for p in checkpoints(out) if is_complete(p)]


SAVE_EACH_STEP = ["--checkpoint-minutes", "0.00001"]


@pytest.mark.integration
def test_a_moved_or_copied_trl_run_resumes_into_the_folder_it_is_given_and_leaves_the_original_alone(
        tune_dir: Path, tmp_path: Path, capsys) -> None:
    run = ["train", str(tune_dir), "--max-steps", "4", *SAVE_EACH_STEP]
    first = tmp_path / "first"
    assert main([*run, "--output", str(first), "--deadline", "0.00001"]) == 3  # stopped after step 1, saved
    assert saved_steps(first) == [1]
    # Moved: the resume trains in the new folder; the old one is not made again.
    moved = tmp_path / "moved"
    first.rename(moved)
    assert main([*run, "--output", str(moved), "--resume"]) == 0
    assert "resuming from checkpoint-1" in capsys.readouterr().err
    assert not first.exists()
    assert saved_steps(moved) == [3, 4]  # --keep 2, rotated in the folder trained
    assert json.loads((moved / "train_result.json").read_text())["step"] == 4
    assert (moved / "adapter_model.safetensors").is_file()
    # Copied: the copy trains on; the original keeps every file as it was.
    original = tmp_path / "original"
    assert main([*run, "--output", str(original), "--deadline", "0.00001"]) == 3
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    before = files(original)
    assert main([*run, "--output", str(copy), "--resume"]) == 0
    assert files(original) == before and saved_steps(original) == [1]
    assert saved_steps(copy) == [3, 4]
    capsys.readouterr()


@pytest.mark.integration
def test_a_plan_of_valid_json_but_wrong_types_is_a_clear_error_naming_the_file(
        tune_dir: Path, tmp_path: Path, capsys) -> None:
    planned = tmp_path / "planned"
    shutil.copytree(tune_dir, planned)
    assert main(["plan", str(planned), "--max-hours", "1"]) == 0
    capsys.readouterr()
    plan = planned / "plan.json"
    good = json.loads(plan.read_text())
    out = tmp_path / "out"
    for key, wrong in (("command", 12), ("trial", "one"), ("eta", [1]), ("config", "x")):
        plan.write_text(json.dumps({**good, key: wrong}))
        assert main(["train", str(planned), "--output", str(out), "--max-steps", "1"]) == 2, key
        err = capsys.readouterr().err
        assert f"the plan {plan} is damaged: {key}: " in err and "Traceback" not in err, err
        assert "fix: plan again" in err
        assert not out.exists()  # refused before a run was recorded


@pytest.mark.integration
def test_max_steps_past_the_epochs_trains_on_over_more_epochs_in_both_loops_and_says_so(
        tune_dir: Path, factory_tune: Path, tmp_path: Path, capsys) -> None:
    for run_dir, kind in ((factory_tune, "factory"), (tune_dir, "trl_sft")):
        out = tmp_path / kind
        assert main(["train", str(run_dir), "--output", str(out), "--max-steps", "7"]) == 0
        assert json.loads((out / "train.json").read_text())["kind"] == kind
        assert json.loads((out / "train_result.json").read_text())["step"] == 7  # 3 steps an epoch: not cut at 3
        err = capsys.readouterr().err
        assert "7 steps (max_steps) are more than the 1 epoch(s) asked for: training goes on over 3 epochs" in err, kind
        log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        assert [e["max_steps"] for e in log if e["event"] == "train_begin"] == [7]


@pytest.mark.integration
def test_a_damaged_or_lost_train_json_is_rebuilt_from_the_log_so_the_checkpoints_resume(
        factory_tune: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    run = ["train", str(factory_tune), "--output", str(out), "--max-steps", "6", *SAVE_EACH_STEP]
    late = ["--deadline", "0.00001"]  # since the first start: it trains one step, saves, stops
    assert main([*run, *late]) == 3
    record_path = out / "train.json"
    original = json.loads(record_path.read_text())
    first_start = json.loads((out / "train_log.jsonl").read_text().splitlines()[0])["time"]
    damages = {"not JSON": lambda: record_path.write_text('{"schema_version": 1, "run_dir'),
               "lost": record_path.unlink,
               "of the wrong type": lambda: record_path.write_text(json.dumps({**original, "trial": "one"}))}
    for damage, make in damages.items():
        make()
        assert main([*run, "--resume", *late]) == 2, damage  # rebuilt, then refused: its deadline has passed
        err = capsys.readouterr().err
        assert "so a resume with it would train one step and stop" in err
        assert f"rebuilt {record_path} from this command and {out / 'train_log.jsonl'} (its first start)" in err
        assert "cannot check that the arguments and the data are those of the first start" in err
        assert ("train.json.damaged" in err) == (damage != "lost"), damage
        assert json.loads((out / "train_result.json").read_text())["step"] == 1  # nothing trained
        rebuilt = json.loads(record_path.read_text())
        assert rebuilt["started_at"] == first_start  # the deadline still counts from the first start
        assert {k: v for k, v in rebuilt.items() if k != "started_at"} == \
            {k: v for k, v in original.items() if k != "started_at"}
    assert '"trial": "one"' in (out / "train.json.damaged").read_text()
    assert main([*run, "--resume"]) == 0  # from the rebuilt record: resumed, not restarted
    result = json.loads((out / "train_result.json").read_text())
    assert result["step"] == 6 and result["resumed_from"] == "checkpoint-1"
    # A log that says the run trained something else: refused, naming both; nothing is rebuilt.
    other = tmp_path / "other"
    assert main(["train", str(factory_tune), "--output", str(other), "--max-steps", "6", *SAVE_EACH_STEP, *late]) == 3
    log = other / "train_log.jsonl"
    log.write_text(log.read_text().replace('"trial": 0', '"trial": 7'))
    (other / "train.json").write_text("")
    assert main(["train", str(factory_tune), "--output", str(other), "--max-steps", "6", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "says the run trained trial 7 from summary.json, and this command trains trial 0" in err
    assert (other / "train.json").read_text() == "" and not (other / "train.json.damaged").exists()
    # No complete checkpoint to resume: nothing to rebuild for; the old advice.
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "train.json").write_text("[]")
    assert main(["train", str(factory_tune), "--output", str(tmp_path / "empty"), "--resume"]) == 2
    assert "holds no complete checkpoint to resume" in capsys.readouterr().err


@pytest.mark.integration
def test_a_second_ctrl_c_stops_at_once_prints_the_resume_command_and_leaves_no_torn_checkpoint(
        factory_tune: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    args = [str(factory_tune), "--output", str(out), "--max-steps", "12", *SAVE_EACH_STEP]
    proc = subprocess.Popen([sys.executable, "-m", "trainfit", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        said = []
        for line in proc.stdout:  # the first save is done by the time its line is printed
            said.append(line)
            if "trainfit: checkpoint at step" in line:
                break
        proc.send_signal(signal.SIGINT)  # save at the step's end, then stop...
        for line in proc.stdout:
            said.append(line)
            if "SIGINT: saving a checkpoint at the step's end" in line:
                break
        proc.send_signal(signal.SIGINT)  # ...no: stop now (mid-step: each micro-batch takes 0.1 s)
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    text = "".join(said) + rest
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "continue: trainfit train" in text, text
    result = json.loads((out / "train_result.json").read_text())
    assert result["status"] == "stopped" and result["stopped_by"] == "SIGINT" and result["step"] < 12
    assert text.rsplit("continue: ", 1)[1].strip() == result["resume"]
    assert all(is_complete(p) for p in checkpoints(out))  # a save cut short is gone, not left torn
    kept = latest_complete(out)
    assert kept is not None
    if result["at_once"]:  # the second Ctrl-C came before the save the first asked for had finished
        assert f"stopped by SIGINT at once, without a save: the last checkpoint is at step {result['step']}" in text
    assert result["step"] == int(kept.name.split("-")[1])
    assert main(shlex.split(result["resume"])[1:]) == 0  # the printed command resumes it, from that checkpoint
    finished = json.loads((out / "train_result.json").read_text())
    assert finished["resumed_from"] == kept.name and finished["step"] == 12
    capsys.readouterr()


@pytest.mark.integration
def test_a_second_train_into_a_running_ones_folder_is_refused_naming_its_holder(
        factory_tune: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    out.mkdir()
    held = lock_folder(out)  # a live run's hold on its folder, as `trainfit train` takes it
    try:
        assert main(["train", str(factory_tune), "--output", str(out), "--resume"]) == 2
    finally:
        held.close()
    err = capsys.readouterr().err
    assert f"another `trainfit train` is running in {out} (pid {os.getpid()} on {socket.gethostname()})" in err, err
    assert [p.name for p in out.iterdir()] == [".lock"]  # nothing of the run's touched


HELD_FACTORY = """import importlib.util, os, time
spec = importlib.util.spec_from_file_location("held_factories", {factories!r})
factories = importlib.util.module_from_spec(spec)
spec.loader.exec_module(factories)


def learnable(params, device):
    if os.environ.get("HOLD_MODEL_BUILD"):  # the run's start-up, held until the test's Ctrl-C
        print("building the model", flush=True)
        time.sleep(120)
    return factories.learnable(params, device)
"""


@pytest.mark.integration
def test_a_ctrl_c_while_the_run_starts_up_stops_at_once_and_says_nothing_was_lost(tmp_path: Path) -> None:
    """Before the first step a Ctrl-C stops at once (there is nothing to save): the line said
    "no checkpoint was saved, the steps after it are lost" of a run that had trained nothing."""
    factory = tmp_path / "held.py"
    factory.write_text(HELD_FACTORY.format(factories=str(Path(__file__).parent / "factories.py")))
    data = write_frames(tmp_path / "frames.jsonl", 12)
    spec = make_spec_file(tmp_path, model={"factory": f"{factory}:learnable"},
                          data={"path": str(data), "length_field": "n"},
                          params={"batch_size": 2, "gradient_accumulation_steps": 2, "max_length": 16, "width_mul": 2})
    spec.write_text(spec.read_text() + "search:\n  batch_size: [2]\n")
    tuned, out = tmp_path / "tune", tmp_path / "run"
    assert main(["tune", str(spec), "--output", str(tuned), "--strategy", "grid"]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "trainfit", "train", str(tuned), "--output", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "HOLD_MODEL_BUILD": "1"})
    try:
        assert proc.stdout is not None
        said = []
        for line in proc.stdout:
            said.append(line)
            if "building the model" in line:
                break
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    text = "".join(said) + rest
    assert proc.returncode == 130 and "Traceback" not in text, text
    result = json.loads((out / "train_result.json").read_text())
    assert result["at_once"] and result["step"] == 0 and result["before_first_step"], result
    assert f"stopped by SIGINT at once, before its first step: nothing was lost; continue: {result['resume']}" in text
    assert "lost" not in text.replace("nothing was lost", ""), text


FILE_SIZE_CAPPED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
from trainfit.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.integration
def test_a_disk_that_refuses_a_checkpoint_save_stops_the_run_with_the_resume_line(tmp_path: Path) -> None:
    """A disk filling during a checkpoint save ended in safetensors' raw SafetensorError traceback, exit 1,
    with no resume line (issue 45). The kernel's file-size cap stands in for the full disk: it refuses the
    same writes (EFBIG where ENOSPC), here the first large one, the full fine-tuned model's safetensors
    (576 KB; the files before it are smaller than the 100 KB cap). The run stops, exit 2, with the cause,
    the folder and the command that resumes it; that command drops the torn save and finishes."""
    pytest.importorskip("trl")
    (tmp_path / "tune").mkdir()
    tuned = tune_one_lora_config(tmp_path / "tune", samples=12, lora_r=None)
    out = tmp_path / "run"
    capped = subprocess.run([sys.executable, "-c", FILE_SIZE_CAPPED, "100000", "train", str(tuned), "--output",
                             str(out), *SAVE_EACH_STEP], capture_output=True, text=True, timeout=300)
    assert capped.returncode == 2, capped.stderr[-3000:]
    assert "Traceback" not in capped.stderr, capped.stderr[-3000:]
    assert "training stopped: File too large" in capped.stderr and str(out) in capped.stderr, capped.stderr[-3000:]
    resume = capped.stderr.split("fix the cause, then resume: ", 1)[1].split(" (from ")[0]
    assert "--resume" in resume and not saved_steps(out)
    assert subprocess.run(shlex.split(resume), capture_output=True, text=True, timeout=300).returncode == 0
    assert saved_steps(out)[-1] == 3 and all(is_complete(p) for p in checkpoints(out))
