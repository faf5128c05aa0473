"""The training values of a real run (``spec.training``): the spec's ``train:`` section, the flags
a factory run takes after ``--``, the ``trl sft`` command's flags, compare's configs over them, and a
factory model trained by them with its figures read back from TensorBoard's own event files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, learnable_spec

from trainfit.cli import main
from trainfit.compare.configs import read_configs
from trainfit.errors import SpecError, TrainfitError
from trainfit.spec import load_spec
from trainfit.spec.training import REPORTERS, Schedule, TrainValues
from trainfit.train.trackers import SERVICES, trainer_names
from trainfit.trainer.command import trainer_settings, trl_command


def with_train(tmp_path: Path, train: object) -> Path:
    doc = yaml.safe_load((EXAMPLES / "tiny-llama.yaml").read_text())
    doc["train"] = train
    doc["data"]["path"] = str((EXAMPLES / doc["data"]["path"]).resolve())
    doc["tokenizer"] = str((EXAMPLES / doc["tokenizer"]).resolve())
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_train_section_reaches_the_trl_command_and_its_exports_and_leaves_the_digest(tmp_path: Path) -> None:
    plain = load_spec(with_train(tmp_path, {}))
    spec = load_spec(with_train(tmp_path, {"learning_rate": 1e-4, "lr_scheduler_type": "cosine", "warmup_steps": 5,
                                           "weight_decay": 0.01, "report_to": "tensorboard"}))
    assert spec.train == TrainValues(learning_rate=1e-4, lr_scheduler_type="cosine", warmup_steps=5,
                                     weight_decay=0.01, report_to=("tensorboard",))
    assert spec.digest() == plain.digest()  # a step's cost does not depend on them: a study still resumes
    words = trl_command(spec, spec.params)
    assert words[words.index("--learning_rate"):words.index("--num_train_epochs")] == [
        "--learning_rate", "0.0001", "--lr_scheduler_type", "cosine", "--warmup_steps", "5", "--weight_decay", "0.01",
        "--report_to", "tensorboard"]
    assert "--learning_rate" not in trl_command(plain, plain.params)  # at TRL's defaults the command says nothing
    exported = trainer_settings(spec.params, 1.0, values=spec.train)["training_arguments"]
    assert (exported["learning_rate"], exported["lr_scheduler_type"], exported["warmup_steps"],
            exported["weight_decay"], exported["report_to"]) == (1e-4, "cosine", 5, 0.01, ["tensorboard"])
    pytest.importorskip("trl")
    from trainfit.train.sft import parse

    _, training, _, _ = parse(["--model_name_or_path", "m", "--dataset_name", "d", "--use_cpu", "true",
                               *spec.train.trl_args()])  # TRL's own parser takes them
    assert (training.learning_rate, training.warmup_steps, training.report_to) == (1e-4, 5, ["tensorboard"])


def test_a_bad_train_value_is_said_under_its_key(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        load_spec(with_train(tmp_path, {"learning_rate": 0, "lr_scheduler_type": "step", "warmup_steps": 2,
                                        "warmup_ratio": 0.1, "report_to": ["tensorbord"], "epochs": 2}))
    assert [str(p) for p in err.value.problems] == [
        "train.epochs: is tune.epochs: set it there (the tune's estimate, its command, the plan and the run count one run)",
        "train.learning_rate: must be > 0, got 0.0",
        "train.lr_scheduler_type: must be one of linear, cosine, constant, constant_with_warmup, got 'step'",
        "train.report_to: 'tensorbord': not one of tensorboard, wandb, mlflow",
        "train.warmup_ratio: is set with train.warmup_steps: the warmup is one or the other (keep one of them)"]


def test_a_factory_run_takes_the_training_flags_after_the_double_dash_and_refuses_the_rest() -> None:
    base = TrainValues(learning_rate=1e-3, report_to=("tensorboard",))
    given = base.with_flags(["--learning_rate", "1e-4", "--warmup_ratio=0.1", "--report_to", "wandb,mlflow"])
    assert given == TrainValues(learning_rate=1e-4, warmup_ratio=0.1, report_to=("wandb", "mlflow"))
    assert base.with_flags(["--report_to", "none"]).report_to == ()
    assert given.schedule(50).warmup_steps == 5  # the ratio of the run's steps
    with pytest.raises(TrainfitError, match="--per_device_train_batch_size: a factory model's run takes only"):
        base.with_flags(["--per_device_train_batch_size", "4"])
    with pytest.raises(TrainfitError, match="--warmup_steps must be a whole number >= 0, got 2.5"):
        base.with_flags(["--warmup_steps", "2.5"])
    with pytest.raises(TrainfitError, match="'3' after -- is no flag's value"):
        base.with_flags(["3"])


def test_a_compare_config_sets_its_values_over_the_spec_train_section(tmp_path: Path) -> None:
    spec = load_spec(with_train(tmp_path, {"learning_rate": 5e-5, "weight_decay": 0.1}))
    (tmp_path / "c.yaml").write_text("a: {learning_rate: 1e-4}\nb: {}\n")
    a, b = read_configs(tmp_path / "c.yaml", spec)
    assert (a.values(spec.train).learning_rate, a.values(spec.train).weight_decay) == (1e-4, 0.1)
    assert b.values(spec.train) == spec.train


def test_the_services_are_the_ones_the_spec_takes_under_the_trainers_names() -> None:
    assert set(SERVICES) == set(REPORTERS)
    assert trainer_names({"loss": 1.0, "eval_loss": 2.0, "test_x": 3, "training/on_track": 1.0}) == {
        "train/loss": 1.0, "eval/loss": 2.0, "test/x": 3, "train/training/on_track": 1.0}


@pytest.mark.integration
def test_a_factory_model_trains_by_the_spec_schedule_and_its_figures_reach_tensorboard(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """The done-when of issue 48 item 1: a factory model, its warmup and cosine schedule and weight
    decay from the spec (one value given after --), its loss, learning rate and on-track figures read
    back from the event files by TensorBoard's own reader."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = learnable_spec(tmp_path, 40, {"batch_size": 2, "gradient_accumulation_steps": 1, "max_length": 16,
                                         "width_mul": 2},
                          "search:\n  batch_size: [2]\ntrain:\n  learning_rate: 0.01\n  lr_scheduler_type: cosine\n"
                          "  warmup_steps: 3\n  weight_decay: 0.1\n  report_to: tensorboard\n")
    run = tmp_path / "tune"
    assert main(["tune", str(spec), "--output", str(run), "--strategy", "grid"]) == 0
    assert main(["plan", str(run), "--max-hours", "1"]) == 0
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    out = tmp_path / "out"
    assert main(["train", str(run), "--output", str(out), "--max-steps", "12", "--checkpoint-minutes", "0.00001",
                 "--monitor-seconds", "0.001", "--", "--learning_rate", "0.02"]) == 0
    record = json.loads((out / "train.json").read_text())
    assert record["training"] == {**TrainValues(learning_rate=0.02, lr_scheduler_type="cosine", warmup_steps=3,
                                                weight_decay=0.1).to_json(), "report_to": ["tensorboard"]}
    schedule = Schedule(learning_rate=0.02, lr_scheduler_type="cosine", warmup_steps=3, total_steps=12)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    logged = {e["step"]: e for e in log if e["event"] == "log" and "loss" in e}
    assert sorted(logged) == [10, 12]
    assert logged[10]["learning_rate"] == pytest.approx(0.02 * schedule.factor(10))  # the next step's, as the trainer's
    [file] = (tmp_path / "tb").iterdir()
    events = EventAccumulator(str(file)).Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert [step for step, _ in scalars["train/loss"]] == [10, 12]
    assert scalars["train/learning_rate"] == [(s, pytest.approx(0.02 * schedule.factor(s))) for s in (10, 12)]
    assert {"train/grad_norm", "train/epoch", "train/training/on_track", "train/training/progress_percent",
            "train/optimization/estimated_hours"} <= set(scalars)
    assert scalars["train/training/progress_percent"][-1] == (12, pytest.approx(100.0))
    [checkpoint] = [p for p in out.iterdir() if p.name == "checkpoint-12"]
    groups = torch.load(checkpoint / "optimizer.pt")["param_groups"]
    assert {g["weight_decay"] for g in groups} == {0.1}


@pytest.mark.integration
def test_a_service_whose_library_is_missing_is_said_before_training(tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    try:
        import mlflow  # noqa: F401
        pytest.skip("mlflow is installed here")
    except ImportError:
        pass
    spec = learnable_spec(tmp_path, 10, {"batch_size": 2, "width_mul": 2})
    run = tmp_path / "tune"
    assert main(["tune", str(spec), "--output", str(run), "--max-trials", "1"]) == 0
    capsys.readouterr()
    assert main(["train", str(run), "--output", str(tmp_path / "out"), "--", "--report_to", "mlflow"]) != 0
    err = capsys.readouterr().err
    assert "train.report_to names mlflow, and its library is not installed" in err and "pip install mlflow" in err
    assert "Traceback" not in err and not list((tmp_path / "out").glob("checkpoint-*"))


def test_the_flags_against_a_command_s_own_values_say_only_what_changes() -> None:
    """A compare winner's values after a command that already says the spec's (``plan --from-compare``):
    a value back at TRL's default is said too, where the command said another."""
    spec = TrainValues(learning_rate=1e-4, warmup_ratio=0.1, report_to=("tensorboard",))
    winner = spec.over({"learning_rate": 2e-5, "lr_scheduler_type": "cosine"})
    assert winner.trl_args(100, against=spec) == ["--learning_rate", "2e-05", "--lr_scheduler_type", "cosine"]
    assert TrainValues().trl_args(100, against=spec) == ["--learning_rate", "2e-05", "--warmup_steps", "0",
                                                         "--report_to", "none"]


def test_a_warmup_given_one_way_replaces_the_other() -> None:
    spec = TrainValues(warmup_steps=10)
    assert spec.over({"warmup_ratio": 0.5}).schedule(100).warmup_steps == 50
    assert TrainValues(warmup_ratio=0.5).with_flags(["--warmup_steps", "0"]).schedule(100).warmup_steps == 0
    assert TrainValues().with_flags(["--report_to", "tensorboard", "--report_to", "tensorboard"]).report_to == (
        "tensorboard",)


def test_a_factory_run_recorded_before_its_training_values_resumes_as_one_at_the_defaults() -> None:
    """A train.json written before training values were kept trained at the defaults; where the figures
    go does not change what trains: neither blocks a resume."""
    from trainfit.train.records import TrainRun

    def record(training: dict) -> TrainRun:
        return TrainRun(run_dir="r", source="summary.json", trial=0, kind="factory", threads=None, started_at=0.0,
                        config={"batch_size": 2}, training=training)

    assert record({}).what() == record(TrainValues(report_to=("tensorboard",)).to_json()).what()
    assert record({}).what() != record(TrainValues(learning_rate=1e-3).to_json()).what()
