"""``--deadline`` with evaluation passes: a pass due before the next step counts in the check, and
a stop cancels it so the save comes first, in a real Hugging Face ``Trainer`` and in trainfit's own
loop, for the step and the epoch strategies. Each run's deadline is 50 s away and the plan's pass
takes 60 s: the step before a pass goes on (a step and a save end well inside it), the step at
which a pass is due stops. No timing decides a test: the steps take milliseconds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_LLAMA, make_spec_file, write_frames

from trainfit.plan.eval_pass import EvalSchedule
from trainfit.train.callbacks import RunLog, TrainControl

PASS_S = 60.0
"""The plan's evaluation pass (s): past the deadline on its own."""


def control(tmp_path: Path, deadline_s: float = 50.0) -> TrainControl:
    return TrainControl(every_s=3600, keep=5, log=RunLog(tmp_path / "log.jsonl"), started_at=time.time(),
                        deadline=time.time() + deadline_s, eval_s=PASS_S, say=lambda line: None)


def events(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines()) if e["event"] == kind]


def evaluated(tmp_path: Path) -> list[int]:
    """The steps whose evaluation pass ran (its loss logged)."""
    return [e["step"] for e in events(tmp_path, "log") if "eval_loss" in e]


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["steps", "epoch"])
def test_a_hugging_face_run_stops_before_the_pass_that_would_end_past_its_deadline(tmp_path: Path,
                                                                                  strategy: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    cfg = dict(TINY_LLAMA)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    rows = [{"input_ids": row, "labels": row} for row in torch.randint(0, 256, (16, 16))]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_train_epochs=3,
                             eval_strategy=strategy, eval_steps=3, report_to="none", save_strategy="no",
                             use_cpu=True, logging_steps=100)
    ctl = control(tmp_path)
    trainer = Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows[:4], callbacks=[ctl])
    trainer.train()
    stop_at = 3 if strategy == "steps" else 4  # the first pass: after step 3, or at the first epoch's end
    assert ctl.stopped == "deadline" and trainer.state.global_step == stop_at
    assert not [h for h in trainer.state.log_history if "eval_loss" in h]  # the pass never ran
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == [f"checkpoint-{stop_at}"]
    assert [e["step"] for e in events(tmp_path, "stop")] == [stop_at]


@pytest.mark.parametrize("every", [3, None])
def test_trainfits_loop_stops_before_the_pass_and_a_resume_runs_the_epochs_pass_it_cancelled(
        tmp_path: Path, every: int | None) -> None:
    """A factory model in trainfit's loop, 20 rows a 2, 10 steps an epoch: the pass after step 3
    (``every``: 3) or at the first epoch's end (None) is cancelled by the deadline stop. Resumed
    without a deadline, the run trains its 20 steps; an epoch-end stop's pass runs first."""
    from trainfit.spec import load_spec
    from trainfit.train.loop import run_loop

    data = write_frames(tmp_path / "frames.jsonl", 20)
    spec = load_spec(make_spec_file(tmp_path, model={"factory": f"{Path(__file__).parent / 'factories.py'}:learnable"},
                                    data={"path": str(data), "length_field": "n"},
                                    params={"batch_size": 2, "max_length": 16, "width_mul": 1}))
    schedule = EvalSchedule(path=str(write_frames(tmp_path / "eval.jsonl", 4, seed=1)), every=every, batch_size=2)
    out = tmp_path / "out"
    out.mkdir()

    def run(ctl: TrainControl, checkpoint: Path | None = None) -> tuple[int, int]:
        return run_loop(spec, spec.params, samples=20, epochs=2, max_steps=None, output=out, checkpoint=checkpoint,
                        callbacks=[ctl], say=lambda line: None, evaluation=schedule)

    stop_at = 3 if every else 10
    assert run(first := control(tmp_path)) == (stop_at, 20)
    assert first.stopped == "deadline" and evaluated(tmp_path) == []
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{stop_at}"]
    assert run(control(tmp_path, deadline_s=3600), out / f"checkpoint-{stop_at}") == (20, 20)
    # The passes of the whole run, the cancelled one included, once each (an epoch end's runs on resume).
    assert evaluated(tmp_path) == ([6, 9, 12, 15, 18, 20] if every else [10, 20])


def test_a_pass_held_between_a_step_and_its_save_is_not_timed_as_the_save(tmp_path: Path) -> None:
    """The control's own figures: a pass's ``eval_runtime`` becomes the pass time it counts (the
    mean of this process's), and a save it held up is timed from the pass's end."""
    from types import SimpleNamespace

    ctl = control(tmp_path, deadline_s=3600)
    ctl.on_train_begin(None, SimpleNamespace(global_step=0, max_steps=10), None)
    flags = SimpleNamespace(should_save=True, should_training_stop=False, should_evaluate=False)
    ctl.save_began = time.monotonic() - 100  # the step's end, long before the pass ended
    ctl.on_evaluate(None, None, flags, metrics={"eval_runtime": 2.0})
    ctl.on_evaluate(None, None, flags, metrics={"eval_runtime": 4.0})
    assert ctl.eval_s == 3.0 and time.monotonic() - ctl.save_began < 50
